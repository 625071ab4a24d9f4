"""Issue 20's pieces on a GPU: a swapped causal LM's fused loss in bf16 against the unswapped
model (tied embeddings), the numba GELU on CUDA, and one compile-choice measurement.

Skips without CUDA; the CPU side is tests/test_causal_lm.py, tests/test_numba_gelu.py and
tests/test_compile_choice.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip("transformers")

from fused_layers import compile_choice, compile_probe, gelu, swap  # noqa: E402


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_swapped_llama_bf16_loss_and_gradients(tied: bool) -> None:
    config = transformers.LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()
    fused = copy.deepcopy(reference)
    record = swap(fused)
    assert record.replaced_ops[""] == "linear_cross_entropy"
    ids = torch.randint(0, config.vocab_size, (4, 512), device="cuda")
    expected, got = reference(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    expected.loss.backward()
    got.loss.backward()
    assert got.logits is None
    assert abs(got.loss.item() - expected.loss.item()) < 1e-2 * expected.loss.item()
    # bf16 model: both sides round every activation; the fused loss rounds its logit gradient once
    assert _rel(fused.lm_head.weight.grad, reference.lm_head.weight.grad) < 3e-2
    assert (
        _rel(fused.model.layers[0].mlp.up_proj.weight.grad, reference.model.layers[0].mlp.up_proj.weight.grad)
        < 5e-2
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_numba_gelu_on_cuda(dtype: torch.dtype) -> None:
    pytest.importorskip("numba")
    x = torch.randn(1000, 1537, device="cuda", dtype=dtype).requires_grad_()
    dy = torch.randn_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the kernels follow torch's current stream
        y = gelu(x, "tanh", backend="numba")
        y.backward(dy)
    torch.cuda.synchronize()
    reference = x.detach().double().requires_grad_()
    expected = F.gelu(reference, approximate="tanh")
    expected.backward(dy.double())
    tolerance = 4e-3 if dtype == torch.float16 else 1e-5
    assert (y.double() - expected).abs().max().item() < tolerance
    assert (x.grad.double() - reference.grad).abs().max().item() < tolerance


def test_compile_probe_measures_and_records(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FUSED_LAYERS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_choice, "_table", None)
    device = torch.device("cuda")
    choice = compile_probe.measure("rms_norm", torch.bfloat16, (1024,), device)
    assert choice.custom_backend in ("cuda", "triton") and choice.custom_ms > 0 and choice.inductor_ms > 0
    assert choice.backend == (choice.custom_backend if choice.custom_ms < choice.inductor_ms else "torch")
    assert compile_choice.lookup("rms_norm", torch.bfloat16, (1024,), device) == choice
    assert (tmp_path / "compile_choice.json").exists()
