"""The forward recomputed in backward (`trainprof.analysis.recompute`) and the `recomputation`
finding (`busy_findings`): a synthetic checkpointed step written here, and TraceLens' MI300 ResNet
with activation checkpointing."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_busy import TraceBuilder

from trainprof.analysis import Analysis, analyze

BF16 = "c10::BFloat16"
AUTOGRAD = 200
GIB = 2**30
GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"


class CheckpointTrace(TraceBuilder):
    """A step of `layers` checkpointed layers: a 1 ms forward GEMM each; in the backward, each layer's
    node first recomputes its forward (1 ms, inside `recompute_fn`), allocating `held` bytes it keeps,
    then runs 2 ms of its own backward kernels."""

    def __init__(self, memory_gib: float) -> None:
        super().__init__(memory=memory_gib * GIB)
        self.total = 10 * GIB

    def block(self, ts: float, size: int, addr: int, tid: int) -> None:
        self.total += size
        args = {"Total Allocated": self.total, "Bytes": size, "Addr": addr, "Device Type": 1, "Device Id": 0}
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                            "tid": tid, "ts": ts, "args": args})

    def gemm(self, ts: float, gpu: float, us: float, tid: int, sequence: int | None = None) -> None:
        args = {"Sequence number": sequence, "Fwd thread id": 0} if sequence is not None else {}
        inputs = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": [BF16, BF16]}
        self.cpu("cpu_op", "aten::mm", ts, 20, tid, **inputs, **args)
        self.correlation += 1
        self.cpu("cuda_runtime", "cudaLaunchKernel", ts + 5, 2, tid, correlation=self.correlation)
        kernel = {"correlation": self.correlation, "device": 0, "stream": 7}
        event = {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": gpu, "dur": us}
        self.events.append({**event, "args": kernel})


def _checkpointed(tmp_path: Path, layers: int = 4, held: int = 2 * GIB, memory_gib: float = 141
                  ) -> Analysis:
    trace = CheckpointTrace(memory_gib)
    trace.step(1, 0, 30_000)
    gpu = 100.0
    for layer in range(layers):  # forward
        trace.module(f"Block_{layer}", 100 + layer * 100, 80)
        trace.gemm(110 + layer * 100, gpu, 1_000, 100, sequence=layer)
        gpu += 1_000
    for layer in reversed(range(layers)):  # backward, on autograd's thread
        at = 2_000 + (layers - 1 - layer) * 1_000
        trace.cpu("cpu_op", "autograd::engine::evaluate_function: MmBackward0", at, 900, AUTOGRAD)
        trace.cpu("cpu_op", "MmBackward0", at + 1, 890, AUTOGRAD,
                  **{"Sequence number": layer, "Fwd thread id": 1})
        trace.cpu("python_function", "torch/utils/checkpoint.py(1500): recompute_fn", at + 5, 300, AUTOGRAD)
        trace.cpu("python_function", f"nn.Module: Block_{layer}", at + 10, 200, AUTOGRAD)
        trace.gemm(at + 20, gpu, 1_000, AUTOGRAD, sequence=100 + layer)  # the recomputed forward
        trace.block(at + 30, held, 1_000 + layer, AUTOGRAD)  # kept for the backward
        gpu += 1_000
        trace.gemm(at + 400, gpu, 2_000, AUTOGRAD)  # the layer's backward
        gpu += 2_000
        trace.block(at + 800, -held, 1_000 + layer, AUTOGRAD)
    return analyze(trace.write(tmp_path))


def _finding(result: Analysis):
    found = [f for f in result.findings if f.kind == "recomputation"]
    return found[0] if found else None


def test_a_recomputed_forward_is_found_timed_and_all_of_it_fits_an_h200(tmp_path):
    result = _checkpointed(tmp_path)
    recompute = result.traces[0].recompute
    assert recompute.gpu_ms_per_step == pytest.approx(4.0)
    assert recompute.segments_per_step == 4 and recompute.modules == ["Block"] and recompute.checkpoint_frames
    assert recompute.held_bytes_per_step == 8 * GIB and recompute.largest_segment_bytes == 2 * GIB
    assert recompute.peak_without_bytes == recompute.peak_bytes + 6 * GIB
    assert recompute.segments_that_fit == 4
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(4.0)
    assert finding.details.predicted_step_ms == pytest.approx(finding.details.step_ms - 4.0)
    assert finding.details.predicted_peak_bytes == recompute.peak_without_bytes
    assert "gradient_checkpointing_disable" in finding.fix
    assert "all 4 checkpointed segments fit" in finding.fix


def test_only_the_layers_that_fit_the_headroom_are_advised_off(tmp_path):
    # 16 GiB device: 14.4 GiB usable, a peak of 12 GiB: one more 2 GiB segment fits.
    result = _checkpointed(tmp_path, memory_gib=16)
    recompute = result.traces[0].recompute
    assert recompute.peak_bytes == 12 * GIB and recompute.segments_that_fit == 1
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(1.0)
    assert "1 of 4 checkpointed segments fit" in finding.fix


def test_no_headroom_no_finding(tmp_path):
    result = _checkpointed(tmp_path, memory_gib=13)
    assert result.traces[0].recompute.segments_that_fit == 0
    assert _finding(result) is None


def test_backward_formulas_are_not_recomputation(fixtures_dir):
    for folder in ("busy/gpt2_attention/sdpa", "busy/llama_swap/bare", "traces/gpt2_clean"):
        assert analyze(fixtures_dir / folder).traces[0].recompute is None, folder


def test_tracelens_mi300_resnet_with_activation_checkpointing(fixtures_dir):
    """Four checkpointed stages, recomputed in `recompute_fn` under `unpack_hook` inside each
    stage's first backward node; no memory recorded: the fix cannot say how many fit."""
    result = analyze(fixtures_dir / "thirdparty" / "tl_mi300_resnet_act_ckpt")
    recompute = result.traces[0].recompute
    assert recompute.segments_per_step == 4 and recompute.checkpoint_frames
    assert recompute.gpu_ms_per_step == pytest.approx(1.37, abs=0.01)
    assert recompute.held_bytes_per_step is None and recompute.segments_that_fit is None
    assert recompute.modules == ["Sequential"]  # each checkpoint_wrapper's ResNet stage
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(recompute.gpu_ms_per_step)
    assert "profile_memory=True" in finding.fix
