"""GELU, tanh or erf form."""

from __future__ import annotations

from torch import Tensor

from fused_layers import dispatch

#: The forms of GELU: "tanh" (GPT-2's NewGELU) or "none" (the erf form), as ``F.gelu`` names them.
APPROXIMATIONS = ("tanh", "none")


def gelu(x: Tensor, approximate: str = "tanh", backend: str | None = None) -> Tensor:
    """GELU of ``x``, like ``F.gelu(x, approximate=approximate)``.

    ``approximate`` is "tanh" (GPT-2's NewGELU) or "none" (the erf form). ``backend`` is
    None (``DEFAULT_BACKEND["gelu"]``), "triton", "numba" (float32/float16; bf16 runs on Triton)
    or "torch". Computes in fp32 and returns the input's dtype and shape (contiguous).
    """
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    return dispatch.call("gelu", backend, x, approximate)
