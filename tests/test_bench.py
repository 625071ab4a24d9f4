"""trainprof.bench on the CPU: host clock, sample statistics, throughput fractions, host time."""

from __future__ import annotations

import time

import pytest
import torch

from trainprof import bench


def test_summarize_median_and_iqr():
    timing = bench.summarize([4.0, 1.0, 3.0, 2.0, 5.0], clock=bench.CLOCK_HOST, device="cpu")
    assert timing.median_ms == 3.0
    assert (timing.q1_ms, timing.q3_ms, timing.iqr_ms) == (2.0, 4.0, 2.0)
    assert timing.min_ms == 1.0 and timing.median_us == 3000.0


def test_summarize_throughput_fractions():
    timing = bench.summarize(
        [2.0, 2.0, 2.0], clock=bench.CLOCK_HOST, device="cpu",
        bytes_per_call=1e6, flops_per_call=4e9, copy_bytes_per_s=1e9, matmul_flops_per_s=4e12,
    )
    assert timing.bytes_per_s == pytest.approx(5e8)
    assert timing.fraction_of_copy_bandwidth == pytest.approx(0.5)
    assert timing.flops_per_s == pytest.approx(2e12)
    assert timing.fraction_of_matmul_peak == pytest.approx(0.5)


def test_summarize_refuses_no_samples():
    with pytest.raises(ValueError):
        bench.summarize([], clock=bench.CLOCK_HOST, device="cpu")


def test_time_fn_on_cpu_uses_host_clock_and_measures_a_known_sleep():
    calls = []

    def sleepy():
        calls.append(1)
        time.sleep(0.002)

    timing = bench.time_fn(sleepy, device="cpu", warmup=2, samples=5, calls_per_sample=3)
    assert timing.clock == bench.CLOCK_HOST and timing.device == "cpu"
    assert len(calls) == 2 + 5 * 3
    assert len(timing.samples_ms) == 5 and timing.calls_per_sample == 3
    # sleep(2 ms) never returns early; a loaded host delays some samples (255 ms seen on 2 shared cores)
    assert 2.0 <= timing.min_ms <= timing.median_ms and timing.min_ms < 20.0
    assert timing.q1_ms <= timing.median_ms <= timing.q3_ms


def test_time_fn_flush_l2_times_single_calls():
    calls = []
    timing = bench.time_fn(lambda: calls.append(1), device="cpu", warmup=1, samples=4, flush_l2=True)
    assert timing.flushed_l2 and timing.calls_per_sample == 1 and len(timing.samples_ms) == 4
    assert len(calls) == 1 + 4


def test_time_fn_picks_calls_for_target():
    timing = bench.time_fn(lambda: time.sleep(0.001), device="cpu", samples=2, target_ms=5.0)
    assert 1 <= timing.calls_per_sample <= 5


def test_copy_bandwidth_and_matmul_peak_are_plausible_and_feed_fractions():
    copy = bench.measure_copy_bandwidth("cpu", nbytes=8 << 20)
    peak = bench.measure_matmul_peak(torch.float32, "cpu", n=256)
    assert 1e8 < copy < 1e13  # 0.1 GB/s .. 10 TB/s
    assert 1e7 < peak < 1e15
    x = torch.randn(1 << 20)
    timing = bench.time_fn(lambda: x.mul(2.0), device="cpu", samples=3, bytes_per_call=2 * x.nbytes,
                           copy_bytes_per_s=copy)
    assert 0 < timing.fraction_of_copy_bandwidth < 10


def test_host_time_has_host_clock_and_counts_calls():
    calls = []
    timing = bench.host_time(lambda: calls.append(1), device="cpu", warmup=1, samples=3, calls_per_sample=10)
    assert timing.clock == bench.CLOCK_HOST and len(calls) == 1 + 30
    assert timing.median_us < 1000  # an append is far below a millisecond


def test_to_dict_is_json_ready():
    import json

    timing = bench.time_fn(lambda: None, device="cpu", samples=2, calls_per_sample=2)
    data = json.loads(json.dumps(timing.to_dict()))
    assert data["clock"] == "host" and len(data["samples_ms"]) == 2


def test_host_times_interleave_rounds_in_rotated_order():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timings = bench.host_times(fns, device="cpu", warmup=0, rounds=3, calls_per_sample=2, busy_gpu_ms=5.0)
    assert set(timings) == set("abc")
    assert all(t.clock == bench.CLOCK_HOST and len(t.samples_ms) == 3 for t in timings.values())
    # one sample (2 calls) of each per round, the starting function rotated from round to round;
    # busy_gpu_ms does nothing off CUDA
    assert "".join(order) == "aabbcc" + "bbccaa" + "ccaabb"


def test_paired_ratio_compares_round_by_round():
    slow = bench.summarize([2.0, 4.0, 6.0], clock=bench.CLOCK_HOST, device="cpu")
    fast = bench.summarize([1.0, 4.0, 3.0], clock=bench.CLOCK_HOST, device="cpu")
    median, q1, q3 = bench.paired_ratio(fast, slow)
    assert median == 0.5 and q1 == 0.5 and q3 == 0.75  # ratios 0.5, 1.0, 0.5
    with pytest.raises(ValueError, match="one sample per round"):
        bench.paired_ratio(fast, bench.summarize([1.0], clock=bench.CLOCK_HOST, device="cpu"))
