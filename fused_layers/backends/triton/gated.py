"""Gated activations of two same-shape inputs in Triton: GEGLU ``gelu(a) * b`` and SwiGLU ``silu(a) * b``.

One flat kernel each way for both (the ACTIVATION constexpr, one of the named modes below, picks
the gate), one autograd.Function. The gate's GELU maths is shared with ``gelu.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import eager_function, registers, run_op
from fused_layers.backends.gradients import output_gradient_is_private
from fused_layers.backends.triton.blocks import flat_block, load_fp32
from fused_layers.backends.triton.gelu import gelu_value, gelu_value_and_grad
from fused_layers.backends.triton.heuristics import flat_config
from fused_layers.backends.triton.language import tl, triton
from fused_layers.backends.triton.launch import define, launch

# The gate, as the kernels' ACTIVATION constexpr (the custom ops pass its .value, an int).
GELU_TANH = tl.constexpr(0)
GELU_ERF = tl.constexpr(1)
SILU = tl.constexpr(2)


@triton.jit
def _gate_value(a, ACTIVATION: tl.constexpr):
    """act(a) of an fp32 block."""
    if ACTIVATION == SILU:
        return a * tl.sigmoid(a)
    else:
        return gelu_value(a, ACTIVATION == GELU_TANH)


@triton.jit
def _gate_value_and_grad(a, ACTIVATION: tl.constexpr):
    """(act(a), act'(a)) of an fp32 block."""
    if ACTIVATION == SILU:
        s = tl.sigmoid(a)
        return a * s, s * (1.0 + a * (1.0 - s))
    else:
        return gelu_value_and_grad(a, ACTIVATION == GELU_TANH)


@triton.jit
def _gated_fwd_kernel(
    a_ptr,  # (n_elements,) contiguous, input dtype
    b_ptr,  # (n_elements,) contiguous, input dtype
    c_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    offsets, mask = flat_block(n_elements, BLOCK)
    a = load_fp32(a_ptr, offsets, mask)
    b = load_fp32(b_ptr, offsets, mask)
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
    offsets, mask = flat_block(n_elements, BLOCK)
    a = load_fp32(a_ptr, offsets, mask)
    b = load_fp32(b_ptr, offsets, mask)
    dc = load_fp32(dc_ptr, offsets, mask)
    act, dact = _gate_value_and_grad(a, ACTIVATION)
    tl.store(da_ptr + offsets, (dc * b * dact).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offsets, (dc * act).to(db_ptr.dtype.element_ty), mask=mask)


def _gated_fwd(a: Tensor, b: Tensor, activation: int) -> Tensor:
    """Launch the forward; returns act(a) * b, contiguous. The body of ``fused_layers::gated``."""
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    n_elements = a.numel()
    if n_elements > 0:
        grid, block, num_warps = flat_config(n_elements)
        launch(_gated_fwd_kernel, (grid,), (a, b, c, n_elements), BLOCK=block, ACTIVATION=activation,
               num_warps=num_warps)  # fmt: skip
    return c


def _gated_bwd(
    dc: Tensor, a: Tensor, b: Tensor, activation: int, overwrite_dc: bool = False
) -> tuple[Tensor, Tensor]:
    """Launch the backward; returns da, db. The body of ``fused_layers::gated_backward``.

    ``overwrite_dc``: da is written over dc where dc can hold it (each element is read before it
    is written, by the same program), rather than into a new tensor."""
    a, b, dc = a.contiguous(), b.contiguous(), dc.contiguous()
    reuse = overwrite_dc and dc.dtype == a.dtype and dc.shape == a.shape and not dc.requires_grad
    da = dc if reuse else torch.empty(a.shape, dtype=a.dtype, device=a.device)
    db = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    n_elements = a.numel()
    if n_elements > 0:
        grid, block, num_warps = flat_config(n_elements)
        launch(_gated_bwd_kernel, (grid,), (a, b, dc, da, db, n_elements), BLOCK=block,
               ACTIVATION=activation, num_warps=num_warps)  # fmt: skip
    return da, db


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, int], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])  # a and b; the backward recomputes act(a)
    ctx.activation = inputs[2]


def _backward(ctx: Any, dc: Tensor) -> tuple[Tensor, Tensor, None]:
    """da = dc * b * act'(a), db = dc * act(a); shared by the eager Function and the custom op."""
    a, b = ctx.saved_tensors
    # overwrite_dc: the eager Function's flag (`_eager_setup_context`); the custom op has none
    eager = functools.partial(_gated_bwd, overwrite_dc=getattr(ctx, "overwrite_dc", False))
    da, db = run_op("gated_backward", eager, dc, a, b, ctx.activation)
    return da, db, None


def _eager_setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, int], output: Tensor) -> None:
    """The eager Function's: its backward may write da over dc (`gradients.output_gradient_is_private`)."""
    _setup_context(ctx, inputs, output)
    ctx.overwrite_dc = output_gradient_is_private()


GatedFunction = eager_function("GatedFunction", _gated_fwd, _eager_setup_context, _backward)


@registers
def _define() -> None:
    define("gated_backward", _gated_bwd)
    define("gated", _gated_fwd).register_autograd(_backward, setup_context=_setup_context)


def _gated(a: Tensor, b: Tensor, activation: int) -> Tensor:
    return run_op("gated", GatedFunction.apply, a, b, activation)


def geglu(a: Tensor, b: Tensor, approximate: str) -> Tensor:
    """``gelu(a, approximate) * b``; the arguments are checked by ``fused_layers.ops.geglu``."""
    return _gated(a, b, (GELU_TANH if approximate == "tanh" else GELU_ERF).value)


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """``silu(a) * b``; the arguments are checked by ``fused_layers.ops.swiglu``."""
    return _gated(a, b, SILU.value)
