"""The copy-and-cast class by what makes it (`trainprof.analysis.copies`) and the `copies_and_casts`
finding (`busy_findings`): a synthetic trace per maker, written here, and the recorded H200 runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_busy import TraceBuilder

from trainprof.analysis import Analysis, analyze

F32, BF16 = "float", "c10::BFloat16"
CAST_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>"
UPCAST_KERNEL = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"
GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"
W = [4096, 4096]
X = [8, 1024, 4096]


def _cast(trace: TraceBuilder, at: float, gpu_at: float, source: list, to: str, frm: str, us: float,
          around: str | None = None, around_dims: list | None = None) -> None:
    """`aten::to > _to_copy > copy_` (under `around`, autocast's matrix product, when given) launching
    one cast kernel of `us` at `gpu_at`."""
    if around is not None:
        trace.op(around, at, 60, around_dims, [F32] * len(around_dims))
    trace.op("aten::to", at + 1, 40)
    trace.op("aten::_to_copy", at + 2, 35)
    trace.op("aten::copy_", at + 3, 30, [source, source, []], [to, frm, "Scalar"])
    trace.launch(CAST_KERNEL if to == BF16 else UPCAST_KERNEL, at + 5, gpu_at, us)


def _micro_batches(tmp_path: Path, passes: int, step_us: float = 20_000) -> Analysis:
    """One step of `passes` micro-batches, each a Linear whose fp32 weight [4096, 4096] autocast casts
    to bf16 (200 µs) before a 1 ms GEMM."""
    trace = TraceBuilder()
    trace.step(1, 0, step_us)
    gpu = 100.0
    for i in range(passes):
        at = 100 + i * 1_000
        trace.module("Linear_0", at - 10, 500)
        _cast(trace, at, gpu, W, BF16, F32, 200, around="aten::linear", around_dims=[X, W, [4096]])
        trace.op_kernel("aten::mm", [[8192, 4096], W], [BF16, BF16], GEMM, at + 70, gpu + 200, 1_000)
        gpu += 1_200
    return analyze(trace.write(tmp_path))


def _finding(result: Analysis):
    found = [f for f in result.findings if f.kind == "copies_and_casts"]
    return found[0] if found else None


def test_autocast_weight_casts_repeated_per_micro_batch_predict_all_but_one(tmp_path):
    result = _micro_batches(tmp_path, passes=4)
    (trace,) = result.traces
    assert trace.copies.forward_passes_per_step == 4
    assert [row.kind for row in trace.copies.rows] == ["autocast_weight_cast"]
    finding = _finding(result)
    # Four 200 µs casts of one weight a step: one autocast region for the step keeps one of them.
    assert finding.gpu_ms_per_step == pytest.approx(0.8 * 3 / 4)
    assert finding.details.removable[0].kind == "autocast_weight_cast"
    assert "one torch.autocast region around all micro-batches" in finding.fix
    assert "each weight cast 4 times a step" in finding.title


def test_one_forward_per_step_casts_each_weight_once_and_has_nothing_to_remove(tmp_path):
    result = _micro_batches(tmp_path / "one", passes=1, step_us=5_000)
    assert result.traces[0].copies.forward_passes_per_step == 1
    assert _finding(result) is None


def test_an_input_cast_into_a_matrix_product_is_not_a_weight_cast(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 5_000)
    _cast(trace, 100, 100, X, BF16, F32, 300, around="aten::linear", around_dims=[X, W, [4096]])
    result = analyze(trace.write(tmp_path))
    assert [row.kind for row in result.traces[0].copies.rows] == ["autocast_input_cast"]
    assert _finding(result) is None  # the activation is fp32 from its producer: nothing to cache


def test_a_models_own_upcast_and_its_gradient_are_removable(tmp_path):
    """`logits.float()` in the forward (800 µs) and its gradient cast back in the backward (400 µs)."""
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.module("MyLMHead_0", 50, 200)
    logits = [8, 1024, 32000]
    trace.op("aten::to", 100, 40, **{"Sequence number": 7, "Fwd thread id": 0})
    trace.op("aten::_to_copy", 101, 35)
    trace.op("aten::copy_", 102, 30, [logits, logits, []], [F32, BF16, "Scalar"])
    trace.launch(UPCAST_KERNEL, 105, 200, 800)
    # The backward, on autograd's thread: ToCopyBackward0 linked to the forward `aten::to`.
    trace.cpu("cpu_op", "autograd::engine::evaluate_function: ToCopyBackward0", 1_000, 100, tid=200)
    trace.cpu("cpu_op", "ToCopyBackward0", 1_001, 90, tid=200, **{"Sequence number": 7, "Fwd thread id": 1})
    trace.cpu("cpu_op", "aten::to", 1_002, 80, tid=200)
    trace.cpu("cpu_op", "aten::_to_copy", 1_003, 70, tid=200)
    trace.cpu("cpu_op", "aten::copy_", 1_004, 60, tid=200,
              **{"Input Dims": [logits, logits, []], "Input type": [BF16, F32, "Scalar"]})
    trace.correlation += 1
    trace.cpu("cuda_runtime", "cudaLaunchKernel", 1_010, 2, tid=200, correlation=trace.correlation)
    trace.events.append({"ph": "X", "cat": "kernel", "name": CAST_KERNEL, "pid": 0, "tid": 7, "ts": 1_100,
                         "dur": 400, "args": {"correlation": trace.correlation, "device": 0, "stream": 7}})
    result = analyze(trace.write(tmp_path))
    rows = {row.kind: row for row in result.traces[0].copies.rows}
    assert set(rows) == {"dtype_cast"} and rows["dtype_cast"].gpu_ms_per_step == pytest.approx(1.2)
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(1.2)
    assert finding.details.predicted_step_ms == pytest.approx(10.0 - 1.2)
    assert "compute in the input's dtype" in finding.fix


def test_a_cat_onto_an_empty_cache_is_removable(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.module("MyAttention_0", 50, 500)
    for i in range(2):  # keys and values
        at = 100 + i * 100
        trace.op("aten::cat", at, 50, [[[0], [4, 12, 2048, 64]], []], ["TensorList", "Scalar"])
        trace.launch("void at::native::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 4, 64, 64>",
                     at + 5, 200 + i * 500, 500)
    finding = _finding(analyze(trace.write(tmp_path)))
    assert finding.details.removable[0].kind == "empty_concat"
    assert finding.gpu_ms_per_step == pytest.approx(1.0)
    assert "use_cache=False" in finding.fix


def test_strided_elementwise_kernels_are_math_not_casts(fixtures_dir):
    """ATen's `gpu_kernel_impl_nocast<...>` kernels (a broadcast mul in a norm) are elementwise: on
    the H200 Llama sample the copy class is 3.8 ms/step, most of it the model's own dtype casts
    (RMSNorm's fp32 round trip, the logits' upcast)."""
    result = analyze(fixtures_dir.parent.parent / "trainprof" / "samples" / "h200_llama")
    (trace,) = result.traces
    copy = next(row for row in trace.busy.classes if row.kernel_class == "copy")
    assert copy.gpu_ms_per_step == pytest.approx(trace.copies.gpu_ms_per_step, abs=0.01)
    assert 3.0 < copy.gpu_ms_per_step < 4.5
    assert trace.copies.rows[0].kind == "dtype_cast"


def test_gpt2s_casts_are_split_by_maker(fixtures_dir):
    """GPT-2 under bf16 autocast: autocast's fp32 GELU mixes dtypes, the logits' upcast and each
    layer's key/value torch.cat onto an empty cache are removable (recorded on the H200)."""
    result = analyze(fixtures_dir / "busy" / "gpt2_attention" / "sdpa")
    (trace,) = result.traces
    kinds = [row.kind for row in trace.copies.rows]
    assert {"mixed_dtype_math", "gradient_cast", "dtype_cast", "empty_concat", "autocast_input_cast",
            "autocast_weight_cast", "autocast_fp32_cast"} <= set(kinds)
    assert trace.copies.forward_passes_per_step == 1
    finding = _finding(result)
    removable = {gain.kind for gain in finding.details.removable}
    assert {"dtype_cast", "empty_concat"} <= removable and "autocast_weight_cast" not in removable
