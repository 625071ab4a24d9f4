"""RMSNorm in plain torch, written as Hugging Face's ``LlamaRMSNorm.forward``."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """Normalise in fp32, round to x's dtype, then scale by ``weight`` (Llama's casting)."""
    input_dtype = x.dtype
    x_f32 = x.to(torch.float32)
    variance = x_f32.pow(2).mean(-1, keepdim=True)
    x_normed = (x_f32 * torch.rsqrt(variance + eps)).to(input_dtype)
    return weight * x_normed if weight is not None else x_normed
