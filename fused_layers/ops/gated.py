"""Gated activations of two same-shape inputs: GEGLU ``gelu(a) * b`` and SwiGLU ``silu(a) * b``."""

from __future__ import annotations

from torch import Tensor

from fused_layers import dispatch
from fused_layers.ops.gelu import APPROXIMATIONS


def _check_pair(op: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"{op}: a and b must share shape, dtype and device; got {tuple(a.shape)} {a.dtype} {a.device} "
            f"and {tuple(b.shape)} {b.dtype} {b.device}"
        )


def geglu(a: Tensor, b: Tensor, approximate: str = "tanh", backend: str | None = None) -> Tensor:
    """GEGLU: ``gelu(a, approximate) * b`` for same-shape, same-dtype ``a`` and ``b``.

    ``backend`` is None (``DEFAULT_BACKEND["geglu"]``), "triton" or "torch"; "cuda" raises
    ValueError. Computes in fp32 and returns the inputs' dtype.
    """
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"geglu: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    _check_pair("geglu", a, b)
    return dispatch.call("geglu", backend, a, b, approximate)


def swiglu(a: Tensor, b: Tensor, backend: str | None = None) -> Tensor:
    """SwiGLU: ``silu(a) * b`` for same-shape, same-dtype ``a`` and ``b``.

    ``backend`` is None (``DEFAULT_BACKEND["swiglu"]``), "triton" or "torch"; "cuda" raises
    ValueError. Computes in fp32 and returns the inputs' dtype.
    """
    _check_pair("swiglu", a, b)
    return dispatch.call("swiglu", backend, a, b)
