"""Rotary position embedding in plain torch, written as Hugging Face's ``apply_rotary_pos_emb``."""

from __future__ import annotations

import torch
from torch import Tensor


def _rotate_half(x: Tensor) -> Tensor:
    """Hugging Face's ``rotate_half``: [-x2, x1] over the last dim's halves."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    """``q * cos + rotate_half(q) * sin`` with cos and sin unsqueezed at ``unsqueeze_dim``; the same for k."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
