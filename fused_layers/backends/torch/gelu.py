"""GELU in plain torch."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def gelu(x: Tensor, approximate: str) -> Tensor:
    """``F.gelu(x, approximate=approximate)``."""
    return F.gelu(x, approximate=approximate)
