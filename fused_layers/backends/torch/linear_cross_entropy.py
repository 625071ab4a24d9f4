"""Linear cross-entropy in plain torch: the whole (tokens, vocab) logits, then ``F.cross_entropy``
on their fp32 copy, as Hugging Face's causal LMs compute their loss."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
    num_items_in_batch: int | float | Tensor | None,
    schedule: Any = None,
    weight_grad_fp32: bool = False,
) -> Tensor:
    """``F.cross_entropy(cap(F.linear(hidden, weight, bias).float()), labels)``; a sum over
    ``num_items_in_batch`` when it is given. ``schedule`` and ``weight_grad_fp32`` (the fused op's
    chunking and accumulation) are unused."""
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
