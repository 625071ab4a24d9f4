"""Fused linear cross-entropy: ``lm_head`` and the loss in one op, the (tokens, vocab) logits never whole.

``linear_cross_entropy(hidden, weight, labels)`` equals ``F.cross_entropy(F.linear(hidden,
weight, bias).float(), labels)`` with Hugging Face's options: ``ignore_index``, mean or sum,
``label_smoothing``, Gemma-2's ``softcap`` (logits = softcap * tanh(logits / softcap)) and
``num_items_in_batch`` (a sum divided by it, as ``ForCausalLMLoss`` does); ``causal_lm_loss``
adds that function's label shift. The kernels, the schedule that bounds memory and the
``fused_layers::linear_cross_entropy`` custom op (one node under ``torch.compile``) are in
``fused_layers.backends.triton.linear_cross_entropy``; the plain torch version, which makes the
whole logits, in ``fused_layers.backends.torch.linear_cross_entropy``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fused_layers import dispatch

#: The reductions the op takes; "none" (a loss per token) is not offered: it would need the
#: per-row losses kept and a backward per row, for no Hugging Face model's training loss.
REDUCTIONS = ("mean", "sum")


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
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{name}: softcap must be None or > 0, got {softcap}")


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
    schedule: Any = None,
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

    Returns a 0-d fp32 tensor. Accumulates in fp32 everywhere except across chunks of a bf16/fp16
    weight's gradient (``fused_layers.backends.triton.linear_cross_entropy``); an fp32 weight cast
    by autocast has its gradient accumulated in fp32. ``backend`` is None
    (``DEFAULT_BACKEND["linear_cross_entropy"]``), "triton" (plain torch, with one warning, where
    it cannot run) or "torch" (the whole logits); ``schedule`` tunes the fused op's chunking
    (``fused_layers.backends.triton.linear_cross_entropy.Schedule``).
    """
    _check(hidden, weight, labels, bias, reduction, label_smoothing, softcap)
    device_type = hidden.device.type
    # fp32 weights computed in a lower precision (mixed precision's master weights): the fused op
    # accumulates their gradient in fp32 and rounds it once, as Hugging Face's one product does
    weight_grad_fp32 = False
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        weight_grad_fp32 = weight.dtype == torch.float32 and dtype != torch.float32
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    if isinstance(num_items_in_batch, Tensor) and num_items_in_batch.device != hidden.device:
        # A count on the host (Trainer's, on one device): its value, read without a device sync.
        num_items_in_batch = num_items_in_batch.item()
    return dispatch.call(
        "linear_cross_entropy", backend, hidden, weight, labels, bias, ignore_index, reduction,
        label_smoothing, softcap, num_items_in_batch, schedule, weight_grad_fp32,
    )  # fmt: skip


def causal_lm_loss(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor | None,
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
        hidden, weight, shift_labels.to(hidden.device), bias, ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch, softcap=softcap, backend=backend,
    )  # fmt: skip
