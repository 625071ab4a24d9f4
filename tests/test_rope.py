"""fused_layers.ops.rope against a float64 reference: outputs and the gradients of q and k.

Runs on the CPU under Triton's interpreter (tests/conftest.py switches it on), so shapes keep few
positions and heads; the GPU versions of these checks are in tests/gpu/test_rope_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TOLERANCES

from fused_layers import dispatch
from fused_layers.backends import custom_ops
from fused_layers.backends.triton import rope as triton_rope
from fused_layers.backends.triton.rope import RopeFunction
from fused_layers.ops import rope

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _reference(q, k, cos, sin, unsqueeze_dim=1):
    """Hugging Face's apply_rotary_pos_emb, written out (called on float64 copies)."""

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _projection(batch, seq, heads, head_dim, dtype, extra_columns=0):
    """(B, H, T, D) as Hugging Face makes it: a (B, T, H*D) projection, viewed and transposed.

    ``extra_columns`` > 0 takes it from a wider buffer (a fused qkv projection): row stride > H*D.
    """
    width = heads * head_dim
    buffer = torch.randn(batch, seq, width + extra_columns).to(dtype)
    return buffer[..., :width].view(batch, seq, heads, head_dim).transpose(1, 2)


def _cos_sin(batch, seq, head_dim, dtype):
    """Real rotary tables: cos/sin of random angles, each half the same as Hugging Face's cat(freqs, freqs)
    makes them, unless head_dim is odd."""
    angles = torch.rand(batch, seq, (head_dim + 1) // 2) * 6.0
    angles = torch.cat((angles, angles), dim=-1)[..., :head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _check(q, k, cos, sin, unsqueeze_dim=1, backend="triton", kernel=True, tolerance_dtype=None):
    """Run rope and the float64 reference; compare outputs, dq and dk; return the outputs."""
    leaves = [q.detach().requires_grad_(), k.detach().requires_grad_()]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    out = rope(*leaves, cos, sin, unsqueeze_dim, backend=backend)
    ref = _reference(*leaves64, cos.double(), sin.double(), unsqueeze_dim)
    if kernel:
        assert type(out[0].grad_fn).__name__ == "RopeFunctionBackward", out[0].grad_fn
    expected_dtype = torch.promote_types(torch.promote_types(q.dtype, cos.dtype), sin.dtype)
    atol, rtol = TOLERANCES[tolerance_dtype or q.dtype]
    for got, want in zip(out, ref, strict=True):
        assert got.shape == want.shape and got.dtype == expected_dtype
        torch.testing.assert_close(got.double(), want.detach(), atol=atol, rtol=rtol)
    dys = [torch.randn(t.shape).to(t.dtype) for t in out]  # contiguous: not the outputs' layout
    grads = torch.autograd.grad(out, leaves, dys)
    grads64 = torch.autograd.grad(ref, leaves64, [dy.double() for dy in dys])
    for name, leaf, grad, grad64 in zip("qk", leaves, grads, grads64, strict=True):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape, name
        torch.testing.assert_close(
            grad.double(), grad64, atol=atol, rtol=rtol, msg=lambda m, n=name: f"d{n}: {m}"
        )
    return out


@pytest.mark.parametrize("head_dim", [64, 128, 80, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_hf_layout(dtype, head_dim):
    """Grouped queries (4 q heads, 2 kv heads), q and k as Hugging Face's view + transpose, shared cos."""
    q = _projection(2, 3, 4, head_dim, dtype)
    k = _projection(2, 3, 2, head_dim, dtype)
    assert not q.is_contiguous()
    cos, sin = _cos_sin(1, 3, head_dim, dtype)
    q_embed, k_embed = _check(q, k, cos, sin)
    # the outputs keep the inputs' memory layout: (B, T, H, D) in memory, as Hugging Face's are
    assert q_embed.stride() == q.stride() and k_embed.stride() == k.stride()


@pytest.mark.parametrize(
    "batch, seq, q_heads, k_heads",
    [(1, 1, 2, 1), (1, 5, 3, 3), (3, 2, 8, 1), (2, 4, 1, 1), (1, 3, 5, 0)],
    ids=["B1-T1", "odd-heads", "MQA", "one-head", "no-k-heads"],
)
def test_shapes(batch, seq, q_heads, k_heads):
    cos, sin = _cos_sin(batch, seq, 64, torch.float32)  # one table per sequence (B, T, D)
    q, k = (_projection(batch, seq, heads, 64, torch.float32) for heads in (q_heads, k_heads))
    _check(q, k, cos, sin)


@pytest.mark.parametrize("layout", ["contiguous", "fused_qkv", "heads_last", "cos_strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layouts(layout, dtype):
    """Contiguous (B, H, T, D); slices of a wider qkv buffer; (B, T, H, D) with unsqueeze_dim=2;
    cos/sin as a slice of a wider table."""
    cos, sin = _cos_sin(2, 4, 64, dtype)
    unsqueeze_dim = 1
    if layout == "contiguous":
        q, k = torch.randn(2, 4, 4, 64).to(dtype), torch.randn(2, 2, 4, 64).to(dtype)
    elif layout == "fused_qkv":
        q, k = (
            _projection(2, 4, 4, 64, dtype, extra_columns=384),
            _projection(2, 4, 2, 64, dtype, extra_columns=128),
        )
    elif layout == "heads_last":
        q, k = torch.randn(2, 4, 4, 64).to(dtype), torch.randn(2, 4, 2, 64).to(dtype)
        unsqueeze_dim = 2
    else:
        q, k = _projection(2, 4, 4, 64, dtype), _projection(2, 4, 2, 64, dtype)
        table = torch.cat(_cos_sin(2, 4, 64, dtype) + (torch.zeros(2, 4, 64, dtype=dtype),), dim=-1)
        cos, sin = table[..., :64], table[..., 64:128]
        assert not cos.is_contiguous()
    _check(q, k, cos, sin, unsqueeze_dim)


@pytest.mark.parametrize(
    "max_tile, head_dim, q_heads, k_heads, seq",
    [(128, 16, 3, 2, 5), (64, 64, 5, 3, 3)],
    ids=["positions-in-blocks", "heads-in-a-loop"],
)
def test_small_tiles_forced(monkeypatch, max_tile, head_dim, q_heads, k_heads, seq):
    """Tiles smaller than the work: 4 positions a program with a partial last block; heads two at a time."""
    monkeypatch.setattr(triton_rope, "MAX_TILE", max_tile)
    cos, sin = _cos_sin(2, seq, head_dim, torch.float32)
    q, k = (_projection(2, seq, heads, head_dim, torch.float32) for heads in (q_heads, k_heads))
    _check(q, k, cos, sin)


def test_mixed_dtypes_promote_like_hugging_face():
    """bf16 q/k (an autocast projection) with fp32 cos/sin: fp32 outputs, bf16 gradients."""
    q, k = _projection(2, 3, 4, 64, torch.bfloat16), _projection(2, 3, 2, 64, torch.bfloat16)
    cos, sin = _cos_sin(1, 3, 64, torch.float32)
    q_embed, _ = _check(q, k, cos, sin, tolerance_dtype=torch.bfloat16)
    assert q_embed.dtype == torch.float32


def test_torch_version_where_the_kernel_does_not_apply():
    """An odd head dim, cos/sin that need a gradient, float64: Hugging Face's formula in torch."""
    cos, sin = _cos_sin(1, 3, 7, torch.float32)
    out = _check(_projection(2, 3, 4, 7, torch.float32), _projection(2, 3, 2, 7, torch.float32), cos, sin,
                 kernel=False)  # fmt: skip
    assert type(out[0].grad_fn).__name__ != "RopeFunctionBackward"
    cos, sin = _cos_sin(1, 3, 64, torch.float32)
    cos.requires_grad_()
    q, k = _projection(2, 3, 4, 64, torch.float32), _projection(2, 3, 2, 64, torch.float32)
    q_embed, k_embed = rope(q, k, cos, sin, backend="triton")
    (q_embed.sum() + k_embed.sum()).backward()
    assert cos.grad is not None and cos.grad.shape == cos.shape
    with torch.no_grad():  # no grad needed: the kernel serves even though cos requires grad
        assert torch.equal(rope(q, k, cos, sin, backend="triton")[0], rope(q, k, cos.detach(), sin)[0])
    q64 = q.double()
    out = rope(q64, k.double(), cos.detach().double(), sin.double(), backend="triton")
    torch.testing.assert_close(out[0], _reference(q64, k.double(), cos.detach().double(), sin.double())[0])


@pytest.mark.parametrize("shape", [(0, 4, 3, 64), (2, 4, 0, 64)], ids=["B0", "T0"])
def test_zero_positions(shape):
    q, k = torch.randn(shape), torch.randn(shape[0], 2, shape[2], 64)
    cos, sin = _cos_sin(1, shape[2], 64, torch.float32)
    _check(q, k, cos, sin)


def test_backends_and_defaults():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    torch.testing.assert_close(rope(q, k, cos, sin, backend="torch"), _reference(q, k, cos, sin))
    with pytest.raises(ValueError, match="rope: no cuda implementation"):
        rope(q, k, cos, sin, backend="cuda")
    assert dispatch.DEFAULT_BACKEND["rope"] == ("triton", "triton")
    assert dispatch._default_backend("rope", (q,)) == "triton"


def test_matches_hugging_face_apply_rotary_pos_emb():
    """Against transformers' own function with LlamaRotaryEmbedding's cos/sin, bf16: Hugging Face
    rounds after each of its three ops, the kernel once, so they differ by a few bf16 units."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    hidden = torch.randn(2, 6, 256).to(torch.bfloat16)
    cos, sin = rotary(hidden, torch.arange(6)[None])
    q, k = _projection(2, 6, 4, 64, torch.bfloat16), _projection(2, 6, 2, 64, torch.bfloat16)
    q.requires_grad_(), k.requires_grad_()
    expected = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    got = rope(q, k, cos, sin, backend="triton")
    for want, have in zip(expected, got, strict=True):
        assert have.dtype == want.dtype and have.stride() == want.stride()
        torch.testing.assert_close(have, want, atol=3e-2, rtol=2e-2)
    dys = [torch.randn_like(t) for t in expected]
    want_grads = torch.autograd.grad(expected, (q, k), dys)
    have_grads = torch.autograd.grad(got, (q, k), dys)
    for want, have in zip(want_grads, have_grads, strict=True):
        torch.testing.assert_close(have, want, atol=3e-2, rtol=2e-2)


# ---- the custom ops (torch.ops.fused_layers.rope*): registration, fake tensors, tracing -------------


def test_custom_op_opcheck():
    """torch.library.opcheck: schema, fake implementation against the real one, autograd registration."""
    custom_ops.register_custom_ops()
    q = _projection(2, 3, 4, 16, torch.float32).requires_grad_()
    k = _projection(2, 3, 2, 16, torch.float32).requires_grad_()
    cos, sin = _cos_sin(1, 3, 16, torch.float32)
    torch.library.opcheck(torch.ops.fused_layers.rope.default, (q, k, cos, sin, 1))
    dq, dk = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16)
    torch.library.opcheck(torch.ops.fused_layers.rope_backward.default, (dq, dk, cos, sin, 1, torch.bfloat16))


def test_fake_tensors_and_make_fx():
    """Under FakeTensorMode: fake outputs with the eager outputs' shape, dtype and strides; make_fx
    records the custom op, and its graph computes what the eager call does."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k = _projection(2, 3, 4, 16, torch.bfloat16), _projection(2, 3, 2, 16, torch.bfloat16)
    cos, sin = _cos_sin(1, 3, 16, torch.bfloat16)
    expected = rope(q, k, cos, sin, backend="triton")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = rope(*(mode.from_tensor(t) for t in (q, k, cos, sin)), backend="triton")
    for got, want in zip(fake, expected, strict=True):
        assert isinstance(got, FakeTensor)
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
    graph = make_fx(lambda *args: rope(*args, backend="triton"), tracing_mode="fake")(q, k, cos, sin)
    targets = [
        str(n.target) for n in graph.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)
    ]
    assert targets == ["fused_layers.rope.default"], targets
    for got, want in zip(graph(q, k, cos, sin), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_eager_call_skips_the_dispatcher():
    q, k = _projection(1, 2, 2, 8, torch.float32).requires_grad_(), _projection(1, 2, 1, 8, torch.float32)
    cos, sin = _cos_sin(1, 2, 8, torch.float32)
    assert isinstance(rope(q, k, cos, sin, backend="triton")[0].grad_fn, RopeFunction._backward_cls)
