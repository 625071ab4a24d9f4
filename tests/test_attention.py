"""Which attention kernel each call site ran and why not a faster one (`trainprof.analysis.attention`),
and the `attention_choice` finding (`busy_findings`): synthetic traces written here, and the H200
GPT-2 and Llama runs (cuDNN with is_causal=True: nothing to change)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_busy import TraceBuilder

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.attention import why_not

BF16, F32 = "c10::BFloat16", "float"
Q = [4, 16, 2048, 64]
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>"
EFFICIENT = "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"
INNER = {
    CUDNN: "aten::_scaled_dot_product_cudnn_attention",
    FLASH: "aten::_scaled_dot_product_flash_attention",
    EFFICIENT: "aten::_scaled_dot_product_efficient_attention",
}


def _sdpa(trace: TraceBuilder, module: str, at: float, gpu_at: float, kernel: str, us: float,
          mask: list | None = None, mask_type: str = "bool", causal: bool = False) -> None:
    """One `F.scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal)` call in `module`
    running one forward kernel of `us` (the FLOPs: 4 B H T^2 D)."""
    trace.module(module, at - 5, 200)
    dims = [Q, Q, Q, mask or [], [], [], [], []]
    types = [BF16, BF16, BF16, mask_type if mask else "", "Scalar", "Scalar", "Scalar", "Scalar"]
    concrete = ["", "", "", "", "0.0", str(causal), "", "False"]
    trace.op("aten::scaled_dot_product_attention", at, 100, dims, types, **{"Concrete Inputs": concrete})
    trace.op(INNER[kernel], at + 10, 80, [Q, Q, Q], [BF16] * 3)
    trace.launch(kernel, at + 20, gpu_at, us)


FLOPS = 4 * 4 * 16 * 2048 * 2048 * 64  # as torch's flop counter counts SDPA: causal or not


def _finding(result: Analysis):
    found = [f for f in result.findings if f.kind == "attention_choice"]
    return found[0] if found else None


def test_a_causal_shaped_mask_predicts_the_causal_half_at_the_calls_own_rate(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 20_000)
    for layer in range(4):  # 4 ms of attention a step, each call given a [T, T] mask
        _sdpa(trace, f"MyAttention_{layer}", 100 + layer * 300, 200 + layer * 1_100, CUDNN, 1_000,
              mask=[4, 1, 2048, 2048])
    result = analyze(trace.write(tmp_path))
    (site,) = result.traces[0].attention
    assert (site.backend, site.calls_per_step, site.mask_shape, site.mask_dtype, site.is_causal) == (
        "cudnn", 4.0, [4, 1, 2048, 2048], "bool", False
    )
    assert site.gpu_ms_per_step == pytest.approx(4.0)
    assert site.achieved_tflops == pytest.approx(FLOPS / 1e-3 / 1e12, rel=1e-3)
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(4.0 * (1 - 2049 / 4096), rel=1e-3)
    assert "is_causal=True" in finding.fix and "with is_causal=False" in finding.title
    assert finding.details.choices[0].basis.startswith("the causal half")


def test_a_causal_call_of_the_same_shapes_gives_the_rate(tmp_path):
    """One module passes a mask (2 ms a call), another is_causal=True (0.8 ms): the masked call is
    predicted at the causal call's measured rate."""
    trace = TraceBuilder()
    trace.step(1, 0, 20_000)
    _sdpa(trace, "Masked_0", 100, 200, CUDNN, 2_000, mask=[4, 1, 2048, 2048], mask_type=BF16)
    _sdpa(trace, "Causal_0", 500, 2_300, CUDNN, 800, causal=True)
    finding = _finding(analyze(trace.write(tmp_path)))
    (choice,) = finding.details.choices
    assert choice.predicted_ms_per_step == pytest.approx(0.8, rel=1e-3)
    assert finding.gpu_ms_per_step == pytest.approx(1.2, rel=1e-3)
    assert "Causal" in choice.basis


def test_is_causal_or_a_padding_mask_is_no_finding(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 20_000)
    _sdpa(trace, "Causal_0", 100, 200, CUDNN, 3_000, causal=True)
    _sdpa(trace, "Padded_0", 500, 3_300, CUDNN, 3_000, mask=[4, 1, 1, 2048])  # not [T, T]: keep it
    result = analyze(trace.write(tmp_path))
    assert len(result.traces[0].attention) == 2 and _finding(result) is None


def test_a_slower_backend_is_predicted_at_the_faster_ones_measured_rate(tmp_path):
    """A padding mask keeps flash out of one module (memory-efficient, 3 ms); another module's flash
    call of the same shapes took 1.5 ms."""
    trace = TraceBuilder()
    trace.step(1, 0, 20_000)
    _sdpa(trace, "Padded_0", 100, 200, EFFICIENT, 3_000, mask=[4, 1, 1, 2048])
    _sdpa(trace, "Plain_0", 500, 3_300, FLASH, 1_500)
    result = analyze(trace.write(tmp_path))
    padded = next(site for site in result.traces[0].attention if site.module == "Padded")
    assert padded.backend == "memory-efficient"
    assert padded.why_not == ["flash: an explicit attn_mask [4, 1, 1, 2048]"]
    finding = _finding(result)
    assert finding.gpu_ms_per_step == pytest.approx(1.5, rel=1e-3)
    assert "Let SDPA pick flash" in finding.fix


def test_why_not_names_dtype_head_dim_and_mask():
    from trainprof.analysis.attention import _Facts

    facts = _Facts(query=[1, 8, 512, 320], key=[1, 8, 512, 320], dtype="fp32", mask=[1, 1, 512, 512])
    reasons = why_not("memory-efficient", facts)
    assert "flash: an explicit attn_mask [1, 1, 512, 512] (if causal: is_causal=True instead)" in reasons
    assert "flash: fp32 inputs (it takes bf16/fp16)" in reasons
    assert any(reason.startswith("cudnn: head dim 320") for reason in reasons)
    assert why_not("flash", facts) == []


@pytest.mark.parametrize("variant, module, dropout", [("sdpa", "GPT2Attention", 0.1)])
def test_the_h200_runs_ran_cudnn_causal_and_need_no_change(fixtures_dir, variant, module, dropout):
    result = analyze(fixtures_dir / "busy" / "gpt2_attention" / variant)
    (site,) = result.traces[0].attention
    assert (site.module, site.backend, site.is_causal, site.dropout_p, site.mask_shape) == (
        module, "cudnn", True, dropout, None
    )
    assert site.calls_per_step == 12 and site.why_not == []
    assert _finding(result) is None
    llama = analyze(Path(fixtures_dir).parents[1] / "trainprof" / "samples" / "h200_llama")
    (site,) = llama.traces[0].attention
    assert site.key_shape == [4, 8, 2048, 64] and site.query_shape == [4, 32, 2048, 64]  # GQA
    assert _finding(llama) is None
