"""fused_layers' RoPE on CUDA: the compiled kernel against float64 and Hugging Face's function, under
torch.compile, and swapped into a small Llama that trains. Skips without CUDA.

The CPU versions (Triton's interpreter, small shapes) are in tests/test_rope.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

transformers = pytest.importorskip("transformers")

import fused_layers  # noqa: E402
from fused_layers.backends.triton.rope import RopeFunction  # noqa: E402
from fused_layers.ops import rope  # noqa: E402

# (atol, rtol) against float64 from the same rounded inputs: one rounding of outputs of order 1
TOLERANCES = {torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 2e-2)}
# (batch, seq, q heads, kv heads, head_dim): Llama-3.2-1B's heads, Llama-3-8B's, Qwen2-0.5B's (14 / 2),
# an unaligned head_dim, one position
SHAPES = ((2, 512, 32, 8, 64), (1, 256, 32, 8, 128), (2, 300, 14, 2, 64), (2, 77, 6, 2, 80), (3, 1, 8, 8, 64))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _projection(batch, seq, heads, head_dim, dtype):
    """(B, H, T, D) as Hugging Face's attention makes it: view + transpose of a (B, T, H*D) projection."""
    return (
        torch.randn(batch, seq, heads * head_dim, device="cuda")
        .to(dtype)
        .view(batch, seq, heads, head_dim)
        .transpose(1, 2)
    )


def _cos_sin(seq, head_dim, dtype, batch=1):
    angles = torch.rand(batch, seq, head_dim // 2, device="cuda") * 6.0
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _reference(q, k, cos, sin):
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rope_matches_float64_cuda(dtype, shape):
    batch, seq, q_heads, k_heads, head_dim = shape
    q = _projection(batch, seq, q_heads, head_dim, dtype).requires_grad_()
    k = _projection(batch, seq, k_heads, head_dim, dtype).requires_grad_()
    cos, sin = _cos_sin(seq, head_dim, dtype)
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    out = rope(q, k, cos, sin, backend="triton")
    ref = _reference(q64, k64, cos.double(), sin.double())
    assert type(out[0].grad_fn).__name__ == "RopeFunctionBackward"
    atol, rtol = TOLERANCES[dtype]
    for got, want, x in zip(out, ref, (q, k), strict=True):
        assert got.dtype == dtype and got.stride() == x.stride()
        torch.testing.assert_close(got.double(), want.detach(), atol=atol, rtol=rtol)
    dys = [torch.randn(t.shape, device="cuda").to(dtype) for t in out]
    grads = torch.autograd.grad(out, (q, k), dys)
    grads64 = torch.autograd.grad(ref, (q64, k64), [dy.double() for dy in dys])
    for grad, grad64 in zip(grads, grads64, strict=True):
        torch.testing.assert_close(grad.double(), grad64, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_matches_hugging_face_cuda(dtype):
    """Against transformers' apply_rotary_pos_emb with LlamaRotaryEmbedding's cos/sin (per-sequence
    positions). fp32: a few ulps; bf16: Hugging Face rounds after each of three ops, the kernel once."""
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8)
    rotary = modeling_llama.LlamaRotaryEmbedding(config).cuda()
    hidden = torch.randn(2, 1024, 2048, device="cuda").to(dtype)
    positions = torch.stack([torch.arange(1024), torch.arange(1024) + 5000]).cuda()
    cos, sin = rotary(hidden, positions)
    q = _projection(2, 1024, 32, 64, dtype).requires_grad_()
    k = _projection(2, 1024, 8, 64, dtype).requires_grad_()
    expected = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    got = rope(q, k, cos, sin, backend="triton")
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else TOLERANCES[dtype]
    for want, have in zip(expected, got, strict=True):
        assert have.dtype == want.dtype and have.stride() == want.stride()
        torch.testing.assert_close(have, want, atol=atol, rtol=rtol)
    dys = [torch.randn_like(t) for t in expected]
    for want, have in zip(
        torch.autograd.grad(expected, (q, k), dys), torch.autograd.grad(got, (q, k), dys), strict=True
    ):
        torch.testing.assert_close(have, want, atol=atol, rtol=rtol)


def test_rope_custom_op_under_compile_cuda():
    """backend="triton" under torch.compile: the triton_op in Inductor's graph, forward and backward."""
    q = _projection(2, 256, 16, 64, torch.bfloat16).requires_grad_()
    k = _projection(2, 256, 4, 64, torch.bfloat16).requires_grad_()
    cos, sin = _cos_sin(256, 64, torch.bfloat16)
    compiled = torch.compile(lambda *args: rope(*args, backend="triton"), fullgraph=True)
    expected, got = rope(q, k, cos, sin, backend="triton"), compiled(q, k, cos, sin)
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, atol=0, rtol=0)
    dys = [torch.randn_like(t) for t in expected]
    for want, have in zip(
        torch.autograd.grad(expected, (q, k), dys), torch.autograd.grad(got, (q, k), dys), strict=True
    ):
        torch.testing.assert_close(have, want, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_swapped_llama_trains_with_fused_rope_cuda(dtype, monkeypatch):
    """A small grouped-query Llama: swap reroutes RoPE (the kernel runs, once per layer and pass), the
    logits match, and 15 AdamW steps on one batch track the unswapped loss curve."""
    calls = []
    apply = RopeFunction.apply
    monkeypatch.setattr(RopeFunction, "apply", lambda *args: calls.append(1) or apply(*args))
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=512, intermediate_size=1024,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=256)  # fmt: skip
    reference = transformers.LlamaForCausalLM(config).to("cuda", dtype)
    swapped = copy.deepcopy(reference)
    record = fused_layers.swap(swapped)
    assert record.replaced.get("LlamaAttention.apply_rotary_pos_emb") == 2, record.summary()
    ids = torch.randint(0, 512, (4, 256), device="cuda")
    with torch.no_grad():
        expected = reference(input_ids=ids).logits.float()
        got = swapped(input_ids=ids).logits.float()
    assert len(calls) == 2
    tolerance = 2e-4 if dtype == torch.float32 else 5e-2
    assert torch.allclose(got, expected, atol=tolerance, rtol=tolerance), (got - expected).abs().max()
    losses = {}
    for name, model in (("reference", reference), ("swapped", swapped)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(15):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[name].append(loss.item())
    assert losses["swapped"][-1] < 0.8 * losses["swapped"][0]
    drift = max(abs(a - b) / abs(b) for a, b in zip(losses["swapped"], losses["reference"], strict=True))
    assert drift < (2e-3 if dtype == torch.float32 else 5e-2), losses
    fused_layers.unswap(swapped)
