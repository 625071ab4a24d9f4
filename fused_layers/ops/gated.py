"""Gated activations of two same-shape inputs: GEGLU ``gelu(a) * b`` and SwiGLU ``silu(a) * b``.

One flat Triton kernel each way for both (an ACTIVATION constexpr picks the gate), one
autograd.Function. The gate's GELU maths is shared with ``gelu.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from fused_layers.ops._dispatch import resolve_backend
from fused_layers.ops._launch import flat_config
from fused_layers.ops.gelu import _APPROXIMATIONS, _gelu_value, _gelu_value_and_grad

# ACTIVATION constexpr values
_GELU_TANH, _GELU_ERF, _SILU = 0, 1, 2


@triton.jit
def _gate_value(a, ACTIVATION: tl.constexpr):
    """act(a) of an fp32 block."""
    if ACTIVATION == 2:
        return a * tl.sigmoid(a)
    else:
        return _gelu_value(a, ACTIVATION == 0)


@triton.jit
def _gate_value_and_grad(a, ACTIVATION: tl.constexpr):
    """(act(a), act'(a)) of an fp32 block."""
    if ACTIVATION == 2:
        s = tl.sigmoid(a)
        return a * s, s * (1.0 + a * (1.0 - s))
    else:
        return _gelu_value_and_grad(a, ACTIVATION == 0)


@triton.jit
def _gated_fwd_kernel(
    a_ptr,  # (n_elements,) contiguous, input dtype
    b_ptr,  # (n_elements,) contiguous, input dtype
    c_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    c = _gate_value(a, ACTIVATION) * b
    tl.store(c_ptr + offsets, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_bwd_kernel(
    a_ptr,  # (n_elements,) contiguous, input dtype
    b_ptr,  # (n_elements,) contiguous, input dtype
    dc_ptr,  # (n_elements,) contiguous, grad dtype
    da_ptr,  # (n_elements,) contiguous, input dtype
    db_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dc = tl.load(dc_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    act, dact = _gate_value_and_grad(a, ACTIVATION)
    tl.store(da_ptr + offsets, (dc * b * dact).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offsets, (dc * act).to(db_ptr.dtype.element_ty), mask=mask)


def _check_pair(op: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"{op}: a and b must share shape, dtype and device; got {tuple(a.shape)} {a.dtype} {a.device} "
            f"and {tuple(b.shape)} {b.dtype} {b.device}"
        )


class GatedFunction(torch.autograd.Function):
    """``act(a) * b`` with Triton forward and backward; saves a and b, recomputes act in backward."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, activation: int) -> Tensor:
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty_like(a)
        ctx.save_for_backward(a, b)
        ctx.activation = activation
        if a.numel() > 0:
            grid, block, num_warps = flat_config(a.numel())
            _gated_fwd_kernel[(grid,)](
                a, b, c, a.numel(), BLOCK=block, ACTIVATION=activation, num_warps=num_warps
            )
        return c

    @staticmethod
    def backward(ctx, dc: Tensor) -> tuple[Tensor, Tensor, None]:
        a, b = ctx.saved_tensors
        dc = dc.contiguous()
        da, db = torch.empty_like(a), torch.empty_like(b)
        if a.numel() > 0:
            grid, block, num_warps = flat_config(a.numel())
            _gated_bwd_kernel[(grid,)](
                a, b, dc, da, db, a.numel(), BLOCK=block, ACTIVATION=ctx.activation, num_warps=num_warps
            )
        return da, db, None


def geglu(a: Tensor, b: Tensor, approximate: str = "tanh", backend: str | None = None) -> Tensor:
    """GEGLU: ``gelu(a, approximate) * b`` for same-shape, same-dtype ``a`` and ``b``.

    ``backend`` is None (``DEFAULT_BACKEND["geglu"]``), "triton" or "torch"; "cuda" raises
    ValueError. Computes in fp32 and returns the inputs' dtype.
    """
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"geglu: approximate must be one of {_APPROXIMATIONS}, got {approximate!r}")
    _check_pair("geglu", a, b)
    if resolve_backend("geglu", backend, a, b) == "torch":
        return F.gelu(a, approximate=approximate) * b
    return GatedFunction.apply(a, b, _GELU_TANH if approximate == "tanh" else _GELU_ERF)


def swiglu(a: Tensor, b: Tensor, backend: str | None = None) -> Tensor:
    """SwiGLU: ``silu(a) * b`` for same-shape, same-dtype ``a`` and ``b``.

    ``backend`` is None (``DEFAULT_BACKEND["swiglu"]``), "triton" or "torch"; "cuda" raises
    ValueError. Computes in fp32 and returns the inputs' dtype.
    """
    _check_pair("swiglu", a, b)
    if resolve_backend("swiglu", backend, a, b) == "torch":
        return F.silu(a) * b
    return GatedFunction.apply(a, b, _SILU)
