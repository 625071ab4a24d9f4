"""Fused linear cross-entropy: ``lm_head`` and the loss in one op, the (tokens, vocab) logits never whole.

``linear_cross_entropy(hidden, weight, labels)`` equals ``F.cross_entropy(F.linear(hidden,
weight, bias).float(), labels)`` with Hugging Face's options: ``ignore_index``, mean or sum,
``label_smoothing``, Gemma-2's ``softcap`` (logits = softcap * tanh(logits / softcap)) and
``num_items_in_batch`` (a sum divided by it, as ``ForCausalLMLoss`` does); ``causal_lm_loss``
adds that function's label shift. The kernels and the schedule that bounds memory are in
``fused_layers.backends.triton.linear_cross_entropy``; this module holds the checks and the
``fused_layers::linear_cross_entropy`` custom op, which ``torch.compile`` keeps as one node.

The op computes the gradients in its forward (the logits are made once) and returns them as
extra outputs; its backward multiplies them by the upstream gradient. With the loss's value
``L = s * sum over counted rows of loss_row`` (module docstring of the backend), the backward is::

    grad_hidden = dL/dhidden * grad_output,  grad_weight = dL/dweight * grad_output,  ...

in place when eager (so no second (V, H) tensor exists, and nothing moves when grad_output is 1),
as a product when traced (Inductor reuses the saved gradient's memory: the compiled op's peak
equalled the eager one's on an H200, 2026-11-25). A second backward through the same graph is
refused. Eager calls go through the custom op too: its dispatch, tens of microseconds, is under
1% of the op at the sizes it is for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fused_layers.backends.triton.linear_cross_entropy import (
    DEFAULT_SCHEDULE,
    Schedule,
    linear_cross_entropy_fwd,
    scale_in_place,
)
from fused_layers.ops._dispatch import resolve_backend
from fused_layers.ops._library import NAMESPACE, traced

_REDUCTIONS = ("mean", "sum")
_OP_NAME = "linear_cross_entropy"


def _forward(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    need_grad_hidden: bool,
    need_grad_weight: bool,
    need_grad_bias: bool,
    chunk_tokens: int,
    slice_columns: int,
    accumulate_fp32: bool,
    block: int,
    blocks_per_program: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The custom op's body: (loss, grad_hidden, grad_weight, grad_bias), a gradient not asked for empty."""
    schedule = Schedule(chunk_tokens, slice_columns, accumulate_fp32, block, blocks_per_program)
    loss, grad_hidden, grad_weight, grad_bias = linear_cross_entropy_fwd(
        hidden, weight, labels, bias, scale, ignore_index, label_smoothing, softcap,
        need_grad_hidden, need_grad_weight, need_grad_bias, schedule,
    )  # fmt: skip
    empty = hidden.new_empty(0)
    return (
        loss,
        grad_hidden if grad_hidden is not None else empty,
        grad_weight if grad_weight is not None else empty.clone(),
        grad_bias if grad_bias is not None else empty.clone(),
    )


def _fake(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    need_grad_hidden: bool,
    need_grad_weight: bool,
    need_grad_bias: bool,
    chunk_tokens: int,
    slice_columns: int,
    accumulate_fp32: bool,
    block: int,
    blocks_per_program: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    loss = hidden.new_empty((), dtype=torch.float32)
    grad_hidden = (
        torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_grad_hidden else None
    )
    grad_weight = (
        torch.empty_like(weight, memory_format=torch.contiguous_format) if need_grad_weight else None
    )
    grad_bias = torch.empty_like(bias) if need_grad_bias and bias is not None else None
    return (
        loss,
        grad_hidden if grad_hidden is not None else hidden.new_empty(0),
        grad_weight if grad_weight is not None else hidden.new_empty(0),
        grad_bias if grad_bias is not None else hidden.new_empty(0),
    )


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, ...]) -> None:
    _, grad_hidden, grad_weight, grad_bias = output
    ctx.mark_non_differentiable(grad_hidden, grad_weight, grad_bias)
    ctx.set_materialize_grads(False)  # else the backward gets zero (V, H) grads for those outputs
    hidden, scale, needs = inputs[0], inputs[4], inputs[8:11]
    ctx.needs = needs
    # fp16 gradients come without the loss scale s (backend docstring): the backward multiplies it in
    ctx.scale_pending = hidden.dtype == torch.float16
    ctx.save_for_backward(grad_hidden, grad_weight, grad_bias, scale)
    ctx.backward_done = False


def _backward(ctx: Any, grad_loss: Tensor | None, *_: Any) -> tuple:
    """Each saved gradient times grad_output (times s in fp16); None for the other inputs."""
    grads = list(ctx.saved_tensors[:3])
    scale = ctx.saved_tensors[3]
    if grad_loss is None:
        return (None,) * 16
    factor = grad_loss.detach().to(torch.float32).reshape(1)
    if ctx.scale_pending:
        # s is inf when no row counts; the gradients are 0 then, as F.cross_entropy's are
        factor = factor * torch.nan_to_num(scale, posinf=0.0)
    if traced(grad_loss):
        grads = [
            (grad * factor).to(grad.dtype) if need else None
            for grad, need in zip(grads, ctx.needs, strict=True)
        ]
    else:
        if ctx.backward_done:
            raise RuntimeError(
                "linear_cross_entropy: a second backward through the same graph is not supported "
                "(its gradients were made in the forward and scaled in place by the first)"
            )
        ctx.backward_done = True
        factor = factor.contiguous()
        for grad, need in zip(grads, ctx.needs, strict=True):
            if need:
                scale_in_place(grad, factor)
        grads = [grad if need else None for grad, need in zip(grads, ctx.needs, strict=True)]
    grad_hidden, grad_weight, grad_bias = grads
    return (grad_hidden, grad_weight, None, grad_bias) + (None,) * 12


_defined = False


def _define_op() -> bool:
    """Define ``fused_layers::linear_cross_entropy`` once per process; returns True.

    Called on first use, not at import (defining a custom op imports torch's compiler stack).
    Dynamo runs it once while tracing and uses the result as a constant (the attribute below).
    """
    global _defined
    if not _defined:
        op = torch.library.custom_op(f"{NAMESPACE}::{_OP_NAME}", _forward, mutates_args=())
        op.register_fake(_fake)
        op.register_autograd(_backward, setup_context=_setup_context)
        _defined = True
    return True


_define_op._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _check(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
) -> None:
    """One-line ValueErrors for inputs the op cannot take."""
    name = "linear_cross_entropy"
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{name}: hidden (..., H) and weight (V, H) must agree on H; got {tuple(hidden.shape)} "
            f"and {tuple(weight.shape)}"
        )
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"{name}: labels must have shape {tuple(hidden.shape[:-1])}, got {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"{name}: labels must be an integer tensor, got {labels.dtype}")
    if not hidden.dtype.is_floating_point or hidden.dtype != weight.dtype:
        raise ValueError(
            f"{name}: hidden and weight must share a float dtype, got {hidden.dtype} and {weight.dtype}"
        )
    if bias is not None and (tuple(bias.shape) != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError(
            f"{name}: bias must be ({weight.shape[0]},) {weight.dtype}, got {tuple(bias.shape)} {bias.dtype}"
        )
    if len({t.device for t in (hidden, weight, labels, bias) if t is not None}) != 1:
        raise ValueError(f"{name}: hidden, weight, labels and bias must be on one device")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{name}: softcap must be None or > 0, got {softcap}")


def _loss_scale(labels: Tensor, ignore_index: int, reduction: str, num_items_in_batch: Any) -> Tensor:
    """s: d(loss)/d(row loss) for a counted row, as a one-element fp32 tensor (no host sync)."""
    if num_items_in_batch is not None:
        items = torch.as_tensor(num_items_in_batch, device=labels.device)
        return torch.reciprocal(items.to(torch.float32).reshape(1))
    if reduction == "sum":
        return torch.ones(1, dtype=torch.float32, device=labels.device)
    return torch.reciprocal((labels != ignore_index).sum().to(torch.float32).reshape(1))


def _torch_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
    num_items_in_batch: Any,
) -> Tensor:
    """The plain torch version (all logits at once, in fp32): the CPU fallback."""
    logits = F.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(
        logits.reshape(-1, weight.shape[0]),
        labels.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum" if num_items_in_batch is not None else reduction,
        label_smoothing=label_smoothing,
    )
    return loss if num_items_in_batch is None else loss / num_items_in_batch


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | Tensor | None = None,
    backend: str | None = None,
    schedule: Schedule | None = None,
) -> Tensor:
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``labels``, without the full logits.

    Same value and gradients as ``F.cross_entropy(F.linear(hidden, weight, bias).float(), labels,
    ignore_index=..., reduction=..., label_smoothing=...)`` with the logits first capped to
    ``softcap * tanh(logits / softcap)`` when ``softcap`` is set. ``hidden`` is (..., H),
    ``weight`` (V, H) of the same float dtype (bf16, fp16 or fp32; under autocast both are cast to
    its dtype, as ``F.linear`` would), ``labels`` the leading shape of ``hidden``. Given
    ``num_items_in_batch`` (an int or a tensor), the loss is the sum divided by it, as Hugging
    Face's ``ForCausalLMLoss`` does, whatever ``reduction`` says. A mean over no counted rows is
    NaN, as in torch; a label outside [0, V) that is not ``ignore_index`` makes the loss NaN.

    Returns a 0-d fp32 tensor. Accumulates in fp32 everywhere except across phase 1's chunks of
    the weight gradient (backend docstring). ``backend`` is None or "triton" (the fused op; plain
    torch, with one warning, where it cannot run) or "torch"; ``schedule`` tunes the fused op's
    chunking (``fused_layers.backends.triton.linear_cross_entropy.Schedule``).
    """
    _check(hidden, weight, labels, bias, reduction, label_smoothing, softcap)
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    choice = resolve_backend(_OP_NAME, backend or "triton", hidden, weight)
    if choice == "torch":
        return _torch_linear_cross_entropy(
            hidden,
            weight,
            labels,
            bias,
            ignore_index,
            reduction,
            label_smoothing,
            softcap,
            num_items_in_batch,
        )
    schedule = schedule or DEFAULT_SCHEDULE
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])
    labels_1d = labels.reshape(-1).to(torch.int64)
    scale = _loss_scale(labels_1d, ignore_index, reduction, num_items_in_batch)
    grad_on = torch.is_grad_enabled()
    _define_op()
    loss, *_ = torch.ops.fused_layers.linear_cross_entropy(
        hidden_2d, weight, labels_1d, bias, scale, ignore_index, float(label_smoothing),
        None if softcap is None else float(softcap),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
        grad_on and bias is not None and bias.requires_grad,
        schedule.chunk_tokens, schedule.slice_columns, schedule.accumulate_fp32, schedule.block,
        schedule.blocks_per_program,
    )  # fmt: skip
    return loss


def causal_lm_loss(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    num_items_in_batch: int | Tensor | None = None,
    shift_labels: Tensor | None = None,
    softcap: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """Hugging Face's ``ForCausalLMLoss`` over ``hidden @ weight.T + bias``: token t predicts label t + 1.

    Without ``shift_labels``, ``labels`` (B, T) are shifted left by one and padded with
    ``ignore_index``; the loss is the mean over counted tokens, or the sum over
    ``num_items_in_batch`` when given. ``softcap`` is Gemma-2's ``final_logit_softcapping``.
    """
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return linear_cross_entropy(
        hidden, weight, shift_labels, bias, ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch, softcap=softcap, backend=backend,
    )  # fmt: skip
