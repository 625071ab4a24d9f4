"""The memory peak's breakdown (`trainprof.analysis.memory`): categories, tensor families, the largest
live allocations, the series over time, and the finding that names the fix and what it saves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_idle_causes import MAIN, SIDE, TraceBuilder

from trainprof.analysis import analyze
from trainprof.analysis.thresholds import MEMORY_SERIES_POINTS
from trainprof.analysis.timeline import build_timeline
from trainprof.trace import load_traces

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GIB = 1024**3
MB = 1_000_000


class MemoryTrace(TraceBuilder):
    """A trace with `[memory]` instants: each allocation or free with its block and running total."""

    def __init__(self, before_window: int) -> None:
        super().__init__()
        self.total = before_window
        self.device_memory: int | None = None
        self.reserved: int | None = None
        """When set, each event's `Total Reserved`: this, or the allocated total where that is more."""

    def block(self, ts: float, size: int, addr: int, tid: int = MAIN) -> None:
        self.total += size
        args = {"Total Allocated": self.total, "Bytes": size, "Addr": addr, "Device Type": 1, "Device Id": 0}
        if self.reserved is not None:
            args["Total Reserved"] = max(self.reserved, self.total)
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                            "tid": tid, "ts": ts, "args": args})

    def forward_op(self, name: str, ts: float, sequence: int) -> None:
        self.cpu("cpu_op", name, ts, 100, MAIN, **{"Sequence number": sequence, "Fwd thread id": 0})

    def backward_op(self, node: str, name: str, ts: float, sequence: int) -> None:
        self.cpu("cpu_op", f"autograd::engine::evaluate_function: {node}", ts, 200, SIDE)
        self.cpu("cpu_op", name, ts + 10, 100, SIDE, **{"Sequence number": sequence, "Fwd thread id": 1})

    def embedding(self, ts: float, ids_shape: list[int]) -> None:
        """An embedding lookup reading token ids of `ids_shape` (what `tokens.step_tokens` reads)."""
        self.cpu("cpu_op", "aten::embedding", ts, 50, MAIN,
                 **{"Input Dims": [[1000, 64], ids_shape, [], [], []],
                    "Input type": ["float", "long int", "Scalar", "Scalar", "Scalar"]})

    def write(self, folder: Path) -> Path:
        path = super().write(folder)
        if self.device_memory is not None:
            document = json.loads(path.read_text())
            document["deviceProperties"] = [{"id": 0, "name": "GPU", "totalGlobalMem": self.device_memory}]
            path.write_text(json.dumps(document))
        return path


def _lm_step(
    attention_scores: int, logits: int, activation: int, device_memory: int | None = None,
    ids_shape: list[int] | None = None, reserved: int | None = None,
):
    """One training step of a small language model, its allocations in MB:

        before the window  1,000 (parameters and optimizer state)
        forward            attention scores (MyAttention, aten::_softmax), freed in backward
                           an activation (MyMLP, aten::mm), freed in backward
                           a temporary (aten::add), freed in forward
                           the loss' log-softmax (MyForCausalLM, aten::_log_softmax), freed in backward
        backward           its gradient (LogSoftmaxBackward0, linked to the forward op): the peak,
                           freed in backward; a parameter's gradient, never freed in the window

    `ids_shape`: the token ids an embedding lookup reads first; `reserved`: the allocator's reserve.
    """
    t = MemoryTrace(before_window=1_000 * MB)
    t.device_memory = device_memory
    t.reserved = reserved
    t.step(1, 0.0)
    if ids_shape is not None:
        t.embedding(11_000, ids_shape)
    t.py("nn.Module: MyForCausalLM_0", 12_000, 20_000)
    t.py("nn.Module: MyAttention_0", 12_100, 2_000)
    t.forward_op("aten::_softmax", 12_200, sequence=1)
    t.block(12_250, attention_scores, addr=0xA000)
    t.py("nn.Module: MyMLP_0", 15_000, 2_000)
    t.forward_op("aten::mm", 15_100, sequence=2)
    t.block(15_150, activation, addr=0xB000)
    t.forward_op("aten::add", 15_500, sequence=3)
    t.block(15_550, 50 * MB, addr=0xC000)
    t.block(15_580, -50 * MB, addr=0xC000)
    t.forward_op("aten::_log_softmax", 20_000, sequence=4)
    t.block(20_050, logits, addr=0xD000)
    t.backward_op("LogSoftmaxBackward0", "aten::_log_softmax_backward_data", 40_000, sequence=4)
    t.block(40_050, logits, addr=0xE000, tid=SIDE)  # the peak
    t.block(40_100, -logits, addr=0xE000, tid=SIDE)
    t.block(40_120, -logits, addr=0xD000, tid=SIDE)
    t.backward_op("MmBackward0", "aten::mm", 50_000, sequence=2)
    t.block(50_050, 300 * MB, addr=0xF000, tid=SIDE)  # a parameter's gradient
    t.block(50_100, -activation, addr=0xB000, tid=SIDE)
    t.backward_op("SoftmaxBackward0", "aten::_softmax_backward_data", 60_000, sequence=1)
    t.block(60_050, -attention_scores, addr=0xA000, tid=SIDE)
    return t


def test_the_peak_by_category_and_family_with_its_largest_allocations(tmp_path):
    result = analyze(_lm_step(400 * MB, logits=600 * MB, activation=200 * MB).write(tmp_path))
    memory = result.traces[0].memory
    assert memory.peak_bytes == 2_800 * MB and memory.peak_step == 1
    assert memory.peak_at_ms == pytest.approx(40.05)
    assert memory.by_category == {"persistent": 1_000 * MB, "activations": 1_200 * MB, "gradients": 0,
                                  "optimizer_state": 0, "temporaries": 600 * MB}
    assert memory.by_family == {"logits_loss": 1_200 * MB, "attention_scores": 400 * MB}
    first = memory.largest[0]
    # The backward allocation takes its forward op's module; the forward one is the activation.
    assert {(a.bytes, a.category, a.family, a.module, a.phase) for a in memory.largest[:2]} == {
        (600 * MB, "activations", "logits_loss", "MyForCausalLM", "forward"),
        (600 * MB, "temporaries", "logits_loss", "MyForCausalLM", "backward"),
    }
    assert first.op == "aten::_log_softmax"
    series = memory.series
    assert max(series.allocated_bytes) == memory.peak_bytes
    at_peak = series.allocated_bytes.index(memory.peak_bytes)
    assert sum(series.by_category[c][at_peak] for c in series.by_category) == memory.peak_bytes
    assert series.by_category["gradients"][-1] == 300 * MB  # the gradient is held after the peak


def test_a_dominant_family_gets_its_fix_and_the_memory_it_saves(tmp_path):
    result = analyze(_lm_step(400 * MB, logits=600 * MB, activation=200 * MB).write(tmp_path))
    (finding,) = [f for f in result.findings if f.kind == "memory_peak"]
    assert finding.details.family == "logits_loss"
    assert finding.details.memory_saved_bytes == 1_200 * MB  # 43% of the 2.8 GB peak
    assert "fused linear cross-entropy" in finding.fix and "Liger" in finding.fix
    assert "fused_layers.swap(model)" in finding.fix
    assert finding.severity == "low" and finding.gpu_ms_per_step == 0.0  # bytes, not GPU time


def test_unfused_attention_scores_get_sdpa(tmp_path):
    result = analyze(_lm_step(2_000 * MB, logits=100 * MB, activation=200 * MB).write(tmp_path))
    (finding,) = [f for f in result.findings if f.kind == "memory_peak"]
    assert finding.details.family == "attention_scores" and "sdpa" in finding.fix


def test_no_family_dominates_no_finding(tmp_path):
    result = analyze(_lm_step(100 * MB, logits=100 * MB, activation=200 * MB).write(tmp_path))
    assert not [f for f in result.findings if f.kind == "memory_peak"]


@pytest.mark.parametrize(("device_gb", "fires"), [(3, True), (100, False)])
def test_activations_alone_need_memory_pressure(tmp_path, device_gb, fires):
    # Activations are 1.5 GB of a 2.9 GB peak: worth recomputing only when the device is nearly full.
    step = _lm_step(attention_scores=10 * MB, logits=10 * MB, activation=1_500 * MB,
                    device_memory=device_gb * 1_000 * MB)
    found = [f for f in analyze(step.write(tmp_path)).findings if f.kind == "memory_peak"]
    assert bool(found) == fires
    if fires:
        assert found[0].details.family == "activations" and "gradient_checkpointing" in found[0].fix


def test_a_saving_too_small_for_the_device_is_not_told(tmp_path):
    step = _lm_step(400 * MB, logits=600 * MB, activation=200 * MB, device_memory=141_000 * MB)
    assert not [f for f in analyze(step.write(tmp_path)).findings if f.kind == "memory_peak"]


def test_a_trace_without_block_sizes_keeps_its_peaks_only(tmp_path):
    t = TraceBuilder()
    t.step(1, 0.0)
    t.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": MAIN,
                     "ts": 20_000, "args": {"Total Allocated": 5_000, "Device Type": 1}})
    result = analyze(t.write(tmp_path))
    assert result.steps[0].peak_memory_bytes == 5_000 and result.traces[0].memory is None


@pytest.mark.parametrize(
    ("scenario", "problem", "fixed", "family"),
    [
        ("vocab_head", "bare", "liger_flce", "logits_loss"),
        ("gpt2_attention", "eager", "sdpa", "attention_scores"),
    ],
)
def test_memory_finding_fires_on_its_problem_predicts_the_saving_and_is_silent_after_the_fix(
    scenario, problem, fixed, family, busy_run
):
    result = analyze(FIXTURES / "busy" / scenario / problem)
    (finding,) = [f for f in result.findings if f.kind == "memory_peak"]
    assert finding.details.family == family
    peaks = [busy_run(scenario, variant)["peak_memory_bytes"] for variant in (problem, fixed)]
    measured = peaks[0] - peaks[1]
    # vocab_head: 11.74 GiB predicted, 10.99 measured; gpt2_attention: 16.31 vs 15.46 (H200, 2026-11-25).
    assert finding.details.memory_saved_bytes == pytest.approx(measured, rel=0.3)
    assert result.traces[0].memory.peak_bytes == busy_run(scenario, problem)["peak_memory_bytes"]
    after = analyze(FIXTURES / "busy" / scenario / fixed)
    assert not [f for f in after.findings if f.kind == "memory_peak" and f.details.family == family]


def test_inference_gets_no_loss_advice():
    result = analyze(FIXTURES / "busy/inference/forward")
    assert result.traces[0].memory.by_family.get("logits_loss", 0) > 0.3 * result.traces[0].memory.peak_bytes
    assert not [f for f in result.findings if f.kind == "memory_peak"]


def test_memory_largest_allocations_name_the_users_line():
    memory = analyze(FIXTURES / "busy/vocab_head/bare").traces[0].memory
    top = memory.largest[0]
    assert top.bytes > 3.9 * GIB and top.family == "logits_loss" and top.op == "aten::_log_softmax"
    assert top.python == "transformers/loss/loss_utils.py fixed_cross_entropy"
    assert top.user is not None and top.user.function == "loss_of"
    assert len(memory.series.t_ms) <= 400 and max(memory.series.allocated_bytes) == memory.peak_bytes


def test_series_keeps_the_peak_and_the_valleys_and_the_largest_are_those_alive_at_the_peak():
    """gpt2_pathologies (5,688 memory events, more than the series keeps): the series holds the peak
    and the lowest total; the largest allocations are those a replay of every allocation and free up
    to the peak finds alive there (report.html draws both)."""
    (trace,) = load_traces(FIXTURES / "traces/gpt2_pathologies")
    memory = analyze([trace]).traces[0].memory
    events = trace.memory
    assert len(events) > MEMORY_SERIES_POINTS
    series = memory.series
    assert len(series.t_ms) <= MEMORY_SERIES_POINTS and series.t_ms == sorted(series.t_ms)
    assert max(series.allocated_bytes) == memory.peak_bytes
    assert min(series.allocated_bytes) == int(events.value.min())  # the valleys are drawn too
    # Brute force: replay allocations and frees up to the peak.
    origin = build_timeline(trace).steps[0].start_us
    peak = int(np.flatnonzero(np.isclose((events.start_us - origin) / 1e3, memory.peak_at_ms, atol=1e-3))[0])
    live: dict[float, int] = {}
    for i in range(peak + 1):
        if events.block_bytes[i] > 0:
            live[events.addr[i]] = int(events.block_bytes[i])
        else:
            live.pop(events.addr[i], None)
    expected = sorted(live.values(), reverse=True)[: len(memory.largest)]
    assert [allocation.bytes for allocation in memory.largest] == expected
    assert all(allocation.op for allocation in memory.largest)


@pytest.mark.parametrize(("reserved", "expected"), [(3_500 * MB, 3_500 * MB), (None, None)])
def test_the_reserved_total_is_read_and_drawn_beside_the_allocated_one(tmp_path, reserved, expected):
    step = _lm_step(400 * MB, 600 * MB, 200 * MB, reserved=reserved)
    memory = analyze(step.write(tmp_path)).traces[0].memory
    assert memory.reserved_peak_bytes == expected  # 3.5 GB: above the 2.8 GB allocated peak throughout
    drawn = memory.series.reserved_bytes
    assert drawn == ([expected] * len(memory.series.t_ms) if expected else None)


def test_activations_alive_at_the_peak_by_module():
    memory = analyze(FIXTURES / "busy/vocab_head/bare").traces[0].memory
    rows = memory.activations_by_module
    assert rows == sorted(rows, key=lambda row: -row.bytes)
    assert sum(row.bytes for row in rows) <= memory.by_category["activations"]
    # A 2-layer Llama: its MLPs and attention hold activations for the backward pass.
    assert any(row.module and "LlamaMLP" in row.module for row in rows)


def test_headroom_splits_the_peak_into_fixed_and_scaling_bytes_and_solves_for_the_batch_and_length(tmp_path):
    step = _lm_step(400 * MB, logits=600 * MB, activation=200 * MB, device_memory=10_000 * MB,
                    ids_shape=[4, 512])
    room = analyze(step.write(tmp_path)).traces[0].headroom
    # At the peak: persistent 1,000 MB; activations 400 + 200 + 600; temporaries 600 (the logits'
    # gradient); the attention scores (400) grow with T^2.
    fixed, scaling, scores = 1_000 * MB, 1_800 * MB, 400 * MB
    usable = 0.95 * 10_000 * MB
    assert (room.fixed_bytes, room.scaling_bytes, room.attention_bytes) == (fixed, scaling, scores)
    assert room.usable_bytes == pytest.approx(usable)
    assert room.tokens.shape == [4, 512] and room.tokens.tokens == 2_048
    assert room.bytes_per_token == pytest.approx(scaling / 2_048, abs=0.1)
    fits = (usable - fixed) / scaling  # 4.72x
    assert room.fits_times == pytest.approx(fits, abs=1e-3)
    assert room.largest_batch == int(4 * fits) == 18
    # k x 1,400 MB + k^2 x 400 MB = 8,500 MB: the positive root of 400 k^2 + 1,400 k - 8,500.
    k = max(np.roots([scores, scaling - scores, -(usable - fixed)]).real)
    assert room.longest_seq_len == int(512 * k)
    # The peak a batch of 18 would reach fits; 19 would not.
    assert room.peak_at(18 / 4) <= usable < room.peak_at(19 / 4)


def test_headroom_needs_the_devices_memory_and_names_no_batch_without_token_ids(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert analyze(_lm_step(400 * MB, 600 * MB, 200 * MB).write(tmp_path / "a")).traces[0].headroom is None
    room = analyze(_lm_step(400 * MB, 600 * MB, 200 * MB, device_memory=10_000 * MB).write(tmp_path / "b")
                   ).traces[0].headroom
    assert room.tokens is None and room.largest_batch is None and room.longest_seq_len is None
    assert room.fits_times == pytest.approx((9_500 - 1_000) / 1_800, abs=1e-3)


def test_headroom_on_a_real_h200_trace():
    """vocab_head/bare (2-layer Llama, 128,256-token vocabulary, B4 x T2048, H200): the batch the
    memory allows follows from the peak's own categories."""
    result = analyze(FIXTURES / "busy/vocab_head/bare")
    memory, room = result.traces[0].memory, result.traces[0].headroom
    assert room.tokens.shape == [4, 2048] and room.device_bytes == 150_109_880_320
    scaling = memory.by_category["activations"] + memory.by_category["temporaries"]
    fixed = memory.peak_bytes - scaling
    assert room.fixed_bytes + room.scaling_bytes == memory.peak_bytes
    assert room.largest_batch == int(4 * (0.95 * 150_109_880_320 - fixed) / scaling)
    assert "memory headroom" in dict(_headline(result))


def _headline(result):
    from trainprof.report import _format

    return _format.headline(result)
