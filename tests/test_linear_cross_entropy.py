"""The fused linear cross-entropy on the CPU (Triton's interpreter), against float64 torch.

Small shapes with both layouts of the backend (a chunk's logits inside the weight gradient with a
phase 2, and a buffer of its own), kernels stepping over several blocks, V a multiple of no block
size; every option, every gradient, opcheck, and the op as one node under torch.compile. The GPU
side (training shapes, peak memory against Liger, Inductor) is tests/gpu/test_linear_cross_entropy_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fused_layers.backends.triton.linear_cross_entropy import Schedule
from fused_layers.ops.linear_cross_entropy import causal_lm_loss, linear_cross_entropy

TOKENS, WIDTH = 16, 64
# N * slice_columns = 16 * 240 < 8 * 1000: the chunk's logits go into grad_weight, phase 2 runs.
IN_WEIGHT_GRAD = Schedule(chunk_tokens=8, slice_columns=240, block=256, blocks_per_program=2)
# 6 * 1500 < 16 * 2048: a buffer of its own, phase 1 does every row.
OWN_BUFFER = Schedule(chunk_tokens=6, block=256, blocks_per_program=3)

# Relative error (norm of difference / norm of reference) of the loss and each gradient against
# float64 math on the same rounded inputs: the logits' gradient is stored in the input dtype
# (bf16: 2**-9 relative, fp16: 2**-12), and bf16/fp16 weight-gradient rows add one rounding per
# chunk; fp32 stays near its unit roundoff.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
LOSS_REL_TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 2e-4}


def _leaves(vocab: int, dtype: torch.dtype, seed: int, bias: bool = True, width: int = WIDTH):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, width, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator) / 4).to(dtype).requires_grad_()
    b = torch.randn(vocab, generator=generator).to(dtype).requires_grad_() if bias else None
    labels = torch.randint(0, vocab, (TOKENS,), generator=generator)
    labels[::5] = -100
    return hidden, weight, labels, b


def _reference(hidden, weight, labels, bias, softcap: float | None = None, **options):
    """Loss and gradients of float64 F.linear + F.cross_entropy on the same (rounded) inputs."""
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    logits = F.linear(leaves[0], leaves[1], leaves[2] if bias is not None else None)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, labels, **options)
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


CASES = {  # name: (V, schedule, options, seed)
    # mean over counted rows, ignored rows, bias; logits inside grad_weight, phase 2
    "mean-bias-phase2": (1000, IN_WEIGHT_GRAD, {}, 1),
    # sum, label smoothing, Gemma-2's soft cap; a buffer of its own, 3 blocks per program
    "sum-smooth-softcap": (1500, OWN_BUFFER, {"reduction": "sum", "label_smoothing": 0.1, "softcap": 2.5}, 2),
    # an odd V (GPT-2's is 50,257): logits rows padded to 1000 inside grad_weight, phase 2's last slice short
    "odd-vocab-phase2": (997, IN_WEIGHT_GRAD, {}, 11),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_every_gradient_match_float64(case: str, dtype: torch.dtype) -> None:
    vocab, schedule, options, seed = CASES[case]
    hidden, weight, labels, bias = _leaves(vocab, dtype, seed)
    loss = linear_cross_entropy(hidden, weight, labels, bias, schedule=schedule, **options)
    loss.backward()
    ref_loss, ref_grads = _reference(hidden, weight, labels, bias, **options)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(loss.item() - ref_loss.item()) <= LOSS_REL_TOL[dtype] * abs(ref_loss.item())
    for got, ref in zip((hidden.grad, weight.grad, bias.grad), ref_grads, strict=True):
        assert got.dtype == dtype and torch.isfinite(got).all()
        assert _rel(got, ref) < REL_TOL[dtype]


def test_a_chunk_as_wide_as_the_hidden_size() -> None:
    """C = H = 16 tokens with V = 997: the chunk's (16, 1000) logits do not fit in the weight
    gradient's rows after any phase-1 split, so they take a buffer of their own (this shape raised a
    RuntimeError when the split came out negative)."""
    schedule = Schedule(chunk_tokens=TOKENS, slice_columns=240, block=256)
    hidden, weight, labels, _ = _leaves(997, torch.float32, seed=12, bias=False, width=TOKENS)
    loss = linear_cross_entropy(hidden, weight, labels, schedule=schedule)
    loss.backward()
    ref_loss, (ref_h, ref_w) = _reference(hidden, weight, labels, None)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert _rel(hidden.grad, ref_h) < 1e-5 and _rel(weight.grad, ref_w) < 1e-5


def test_causal_lm_shift_and_num_items_match_hugging_face() -> None:
    """ForCausalLMLoss: labels shifted left, padded with ignore_index; sum / num_items_in_batch."""
    hidden, weight, labels, _ = _leaves(1000, torch.float32, seed=3, bias=False)
    hidden3, labels2 = hidden.view(2, TOKENS // 2, WIDTH), labels.view(2, TOKENS // 2)
    items = torch.tensor(7)
    loss = causal_lm_loss(hidden3, weight, labels2, num_items_in_batch=items)
    loss.backward()
    shifted = F.pad(labels2, (0, 1), value=-100)[..., 1:].reshape(-1)
    ref_loss, (ref_h, ref_w) = _reference(hidden, weight, shifted, None, reduction="sum")
    assert loss.item() == pytest.approx(ref_loss.item() / 7, rel=1e-6)
    assert _rel(hidden.grad, ref_h / 7) < 1e-5 and _rel(weight.grad, ref_w / 7) < 1e-5


def test_no_counted_row() -> None:
    """All labels ignored: a mean is NaN as in torch, a sum 0; every gradient is 0."""
    hidden, weight, _, _ = _leaves(1000, torch.bfloat16, seed=4, bias=False)
    labels = torch.full((TOKENS,), -100)
    mean = linear_cross_entropy(hidden, weight, labels, schedule=IN_WEIGHT_GRAD)
    mean.backward()
    assert torch.isnan(mean) and torch.isnan(F.cross_entropy(torch.zeros(TOKENS, 1000), labels))
    assert not hidden.grad.any() and not weight.grad.any()
    total = linear_cross_entropy(hidden, weight, labels, reduction="sum", schedule=OWN_BUFFER)
    assert total.item() == 0.0


def test_label_out_of_range_makes_the_loss_nan() -> None:
    hidden, weight, labels, _ = _leaves(1000, torch.float32, seed=5, bias=False)
    labels[3] = 1000
    assert torch.isnan(linear_cross_entropy(hidden.detach(), weight.detach(), labels, schedule=OWN_BUFFER))


def test_frozen_weight_and_no_grad() -> None:
    """Only hidden's gradient (a frozen lm_head); then the loss alone under no_grad."""
    hidden, weight, labels, _ = _leaves(1000, torch.float32, seed=6, bias=False)
    weight.requires_grad_(False)
    loss = linear_cross_entropy(hidden, weight, labels, schedule=IN_WEIGHT_GRAD)
    loss.backward()
    ref_loss, (ref_h, _) = _reference(hidden, weight, labels, None)
    assert weight.grad is None and _rel(hidden.grad, ref_h) < 1e-5
    with torch.no_grad():
        assert linear_cross_entropy(hidden, weight, labels).item() == pytest.approx(ref_loss.item(), rel=1e-6)


def test_upstream_gradient_scales_and_a_second_backward_is_refused() -> None:
    hidden, weight, labels, _ = _leaves(1000, torch.float16, seed=7, bias=False)
    loss = linear_cross_entropy(hidden, weight, labels, schedule=OWN_BUFFER)
    (loss * 0.5).backward(retain_graph=True)
    _, (ref_h, ref_w) = _reference(hidden, weight, labels, None)
    assert _rel(hidden.grad, ref_h * 0.5) < REL_TOL[torch.float16]
    assert _rel(weight.grad, ref_w * 0.5) < REL_TOL[torch.float16]
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weight": torch.zeros(10, 32)}, "agree on H"),
        ({"labels": torch.zeros(5, dtype=torch.long)}, "labels must have shape"),
        ({"labels": torch.zeros(TOKENS)}, "integer tensor"),
        ({"weight": torch.zeros(10, WIDTH, dtype=torch.float64)}, "share a float dtype"),
        ({"bias": torch.zeros(11)}, "bias must be"),
        ({"reduction": "none"}, "reduction must be"),
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"softcap": 0.0}, "softcap"),
    ],
)
def test_bad_input_is_one_clear_error(change: dict, message: str) -> None:
    args = {"hidden": torch.zeros(TOKENS, WIDTH), "weight": torch.zeros(10, WIDTH),
            "labels": torch.zeros(TOKENS, dtype=torch.long), "bias": None}  # fmt: skip
    args.update(change)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(**args)


def _op_args(requires_grad: bool = True) -> tuple:
    hidden, weight, labels, bias = _leaves(300, torch.float32, seed=8)
    scale = torch.full((1,), 1 / TOKENS)
    leaves = [t.detach().requires_grad_(requires_grad) for t in (hidden, weight, bias)]
    return (
        leaves[0],
        leaves[1],
        labels,
        leaves[2],
        scale,
        -100,
        0.1,
        3.0,
        True,
        True,
        True,
        8,
        64,
        False,
        128,
        2,
    )


def test_opcheck() -> None:
    """Schema, fake tensor, autograd registration and AOT dispatch of the custom op (tiny: it runs often)."""
    generator = torch.Generator().manual_seed(8)
    hidden = torch.randn(4, 16, generator=generator).requires_grad_()
    weight = torch.randn(200, 16, generator=generator).requires_grad_()
    bias = torch.randn(200, generator=generator).requires_grad_()
    labels = torch.tensor([3, -100, 199, 0])
    linear_cross_entropy(hidden, weight, labels)  # defines the op
    args = (hidden, weight, labels, bias, torch.full((1,), 1 / 3), -100, 0.1, 3.0)
    schedule = (True, True, True, 2, 64, False, 128, 1)  # needs; chunk, slice, fp32 acc, block, blocks
    torch.library.opcheck(torch.ops.fused_layers.linear_cross_entropy.default, args + schedule)


def test_compile_keeps_one_node_and_matches_eager() -> None:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, _inputs) -> object:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    hidden, weight, labels, _ = _leaves(1000, torch.float32, seed=10, bias=False)
    compiled = torch.compile(  # an explicit backend: the custom op, whatever compile_choice holds
        lambda h, w, y: linear_cross_entropy(h, w, y, backend="triton", schedule=IN_WEIGHT_GRAD),
        backend=aot_autograd(fw_compiler=keep, bw_compiler=keep),
        fullgraph=True,
    )
    loss = compiled(hidden, weight, labels)
    loss.backward()
    forward = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert forward.count(torch.ops.fused_layers.linear_cross_entropy.default) == 1
    assert not any("mm" in str(target) for target in forward)  # no matmul outside the op
    compiled_grads = (hidden.grad, weight.grad)
    hidden.grad = weight.grad = None
    eager = linear_cross_entropy(hidden, weight, labels, schedule=IN_WEIGHT_GRAD)
    eager.backward()
    assert torch.equal(loss, eager)
    assert torch.equal(compiled_grads[0], hidden.grad) and torch.equal(compiled_grads[1], weight.grad)


def test_fp32_weights_under_autocast_accumulate_their_gradient_in_fp32() -> None:
    """Mixed precision: fp32 master weights, bf16 compute. The weight gradient is accumulated in
    fp32 across chunks and rounded once: its error is one chunk's (accumulated in bf16 over these
    8 chunks it was 1.17 times one chunk's)."""
    generator = torch.Generator().manual_seed(12)
    hidden = torch.randn(64, WIDTH, generator=generator).requires_grad_()
    weight = (torch.randn(1000, WIDTH, generator=generator) / 4).requires_grad_()
    labels = torch.randint(0, 1000, (64,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, labels)  # default schedule: chunks of 512 > 64 rows
        chunked = linear_cross_entropy(
            hidden, weight, labels, schedule=Schedule(chunk_tokens=8, slice_columns=4096, block=256)
        )
    loss.backward()
    assert weight.grad.dtype == torch.float32
    # the same rounded inputs in float64: bf16 hidden and weight, as autocast feeds the products
    _, (_, ref_w) = _reference(hidden.bfloat16(), weight.bfloat16(), labels, None)
    one_chunk = _rel(weight.grad, ref_w)
    weight.grad = None
    chunked.backward()
    assert _rel(weight.grad, ref_w) < 1.03 * one_chunk  # 8 chunks, one rounding: as one product
