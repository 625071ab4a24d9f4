"""GEGLU and SwiGLU in plain torch."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def geglu(a: Tensor, b: Tensor, approximate: str) -> Tensor:
    """``gelu(a, approximate) * b``."""
    return F.gelu(a, approximate=approximate) * b


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """``silu(a) * b``."""
    return F.silu(a) * b
