"""The fused linear cross-entropy on a GPU at training shapes: values, gradients, peak memory, compile.

Skips without CUDA. The CPU side (every option against float64, opcheck, one graph node) is in
tests/test_linear_cross_entropy.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from fused_layers.backends.triton.linear_cross_entropy import DEFAULT_SCHEDULE  # noqa: E402
from fused_layers.ops.linear_cross_entropy import linear_cross_entropy  # noqa: E402

# Relative error (norm of difference / norm of reference) against fp32 math on the same rounded
# inputs: bf16 storage of the logits' gradient and of the weight gradient's per-chunk sums sits
# near 2**-9 = 2e-3; fp16's at 2**-12; fp32's products may use TF32 nowhere (torch's default).
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def _inputs(tokens: int, width: int, vocab: int, dtype: torch.dtype, seed: int = 0, bias: bool = False):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(tokens, width, device="cuda", generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, device="cuda", generator=generator) * 2 / width**0.5).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=generator)
    labels[torch.rand(tokens, device="cuda", generator=generator) < 0.05] = -100
    b = torch.randn(vocab, device="cuda", generator=generator).to(dtype).requires_grad_() if bias else None
    return hidden, weight.requires_grad_(), labels, b


def _reference(hidden, weight, labels, bias, **options):
    """fp32 F.linear + F.cross_entropy on the same inputs: (loss, grads)."""
    leaves = [
        t.detach().float().requires_grad_() for t in (hidden, weight) + ((bias,) if bias is not None else ())
    ]
    logits = F.linear(leaves[0], leaves[1], leaves[2] if bias is not None else None)
    softcap = options.get("softcap")
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(
        logits, labels, reduction=options.get("reduction", "mean"),
        label_smoothing=options.get("label_smoothing", 0.0),
    )  # fmt: skip
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(("tokens", "vocab"), [(8192, 32000), (4096, 128256)])
def test_bf16_training_shape_matches_fp32(tokens: int, vocab: int) -> None:
    """Both layouts: V = 32,000 at 8192 tokens fits its chunk beside the gradients, 128,256 does not."""
    hidden, weight, labels, _ = _inputs(tokens, 2048, vocab, torch.bfloat16)
    loss = linear_cross_entropy(hidden, weight, labels)
    loss.backward()
    ref_loss, (ref_h, ref_w) = _reference(hidden, weight, labels, None)
    assert abs(loss.item() - ref_loss.item()) <= 1e-3 * abs(ref_loss.item())
    assert _rel(hidden.grad, ref_h) < REL_TOL[torch.bfloat16]
    assert _rel(weight.grad, ref_w) < REL_TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "options",
    [{}, {"label_smoothing": 0.1, "softcap": 30.0}, {"reduction": "sum"}],
    ids=["mean", "smooth-cap", "sum"],
)
def test_dtypes_and_options_with_bias(dtype: torch.dtype, options: dict) -> None:
    hidden, weight, labels, bias = _inputs(1536, 1024, 50257, dtype, seed=1, bias=True)
    loss = linear_cross_entropy(hidden, weight, labels, bias, **options)
    loss.backward()
    ref_loss, (ref_h, ref_w, ref_b) = _reference(hidden, weight, labels, bias, **options)
    assert abs(loss.item() - ref_loss.item()) <= 1e-3 * abs(ref_loss.item())
    for got, ref in ((hidden.grad, ref_h), (weight.grad, ref_w), (bias.grad, ref_b)):
        assert got.dtype == dtype
        assert _rel(got, ref) < REL_TOL[dtype]


def _peak_above_inputs(loss_fn, hidden, weight, labels) -> int:
    """Peak bytes allocated during one forward+backward beyond what was allocated before it (warm)."""
    loss_fn(hidden, weight, labels).backward()  # warm-up: kernels, cuBLAS workspace
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss_fn(hidden, weight, labels).backward()
    peak = torch.cuda.max_memory_allocated() - before
    hidden.grad = weight.grad = None
    return peak


@pytest.mark.parametrize("vocab", [32000, 128256])
def test_peak_memory_is_the_gradients_and_one_slice(vocab: int) -> None:
    """Peak above the inputs <= grad_weight + grad_hidden + phase 2's slice + 16 MiB of small buffers."""
    tokens, width, element = 8192, 2048, 2
    hidden, weight, labels, _ = _inputs(tokens, width, vocab, torch.bfloat16)
    peak = _peak_above_inputs(linear_cross_entropy, hidden, weight, labels)
    bound = (vocab * width + tokens * width + tokens * DEFAULT_SCHEDULE.slice_columns) * element + 16 * 2**20
    assert peak <= bound, (peak / 2**20, bound / 2**20)
    assert peak < tokens * vocab * element  # less than the bf16 logits alone


@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
def test_peak_memory_at_most_liger(vocab: int) -> None:
    liger = pytest.importorskip("liger_kernel.transformers").LigerFusedLinearCrossEntropyLoss()
    hidden, weight, labels, _ = _inputs(8192, 2048, vocab, torch.bfloat16)
    ours = _peak_above_inputs(linear_cross_entropy, hidden, weight, labels)
    theirs = _peak_above_inputs(lambda h, w, y: liger(w, h, y), hidden, weight, labels)
    assert ours <= theirs, (ours / 2**20, theirs / 2**20)


def test_upstream_gradient_scales_and_double_backward_refused() -> None:
    hidden, weight, labels, _ = _inputs(1024, 512, 32000, torch.bfloat16, seed=2)
    loss = linear_cross_entropy(hidden, weight, labels)
    (loss * 3.0).backward(retain_graph=True)
    ref_loss, (ref_h, ref_w) = _reference(hidden, weight, labels, None)
    assert _rel(hidden.grad, 3.0 * ref_h) < REL_TOL[torch.bfloat16]
    assert _rel(weight.grad, 3.0 * ref_w) < REL_TOL[torch.bfloat16]
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_compiled_graph_keeps_one_op_and_matches_eager() -> None:
    hidden, weight, labels, _ = _inputs(2048, 1024, 32000, torch.bfloat16, seed=3)
    eager = linear_cross_entropy(hidden, weight, labels)
    eager.backward()
    grads = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None

    captured = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        captured.append(gm)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    compiled = torch.compile(
        lambda h, w, y: linear_cross_entropy(h, w, y, backend="triton"), backend=backend, fullgraph=True
    )
    loss = compiled(hidden, weight, labels)
    loss.backward()
    targets = [node.target for gm in captured for node in gm.graph.nodes if node.op == "call_function"]
    op = torch.ops.fused_layers.linear_cross_entropy
    assert sum(target in (op, op.default) for target in targets) == 1
    assert torch.equal(loss, eager)
    assert torch.equal(hidden.grad, grads[0]) and torch.equal(weight.grad, grads[1])
