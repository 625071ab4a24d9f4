"""GELU, tanh or erf form, in Triton: one flat kernel forward, one backward, one autograd.Function.

``gelu_value`` and ``gelu_value_and_grad`` are also GEGLU's gate (``gated.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import eager_function, registers, run_op
from fused_layers.backends.triton.blocks import flat_block, load_fp32
from fused_layers.backends.triton.heuristics import flat_config
from fused_layers.backends.triton.language import tl, triton
from fused_layers.backends.triton.launch import define, launch


@triton.jit
def gelu_value(x, APPROX_TANH: tl.constexpr):
    """GELU of an fp32 block."""
    if APPROX_TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        # 0.5 * (1 + tanh(z)) == sigmoid(2z): no libdevice tanh (the CPU interpreter lacks it)
        # and no cancellation in 1 + tanh(z) for large negative x.
        return x * tl.sigmoid(2.0 * inner)
    else:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def gelu_value_and_grad(x, APPROX_TANH: tl.constexpr):
    """(GELU(x), dGELU/dx) of an fp32 block."""
    if APPROX_TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        s = tl.sigmoid(2.0 * inner)
        # d/dx [x * sigmoid(2 z)] = s + x * 2 s (1 - s) * dz/dx
        dinner = 0.7978845608028654 * (1.0 + 0.134145 * x * x)
        return x * s, s + 2.0 * x * s * (1.0 - s) * dinner
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        # x * standard normal pdf(x)
        return x * cdf, cdf + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)


@triton.jit
def _gelu_fwd_kernel(
    x_ptr,  # (n_elements,) contiguous, input dtype
    y_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    APPROX_TANH: tl.constexpr,
):
    offsets, mask = flat_block(n_elements, BLOCK)
    x = load_fp32(x_ptr, offsets, mask)
    tl.store(y_ptr + offsets, gelu_value(x, APPROX_TANH).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_kernel(
    x_ptr,  # (n_elements,) contiguous, input dtype
    dy_ptr,  # (n_elements,) contiguous, grad dtype
    dx_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    APPROX_TANH: tl.constexpr,
):
    offsets, mask = flat_block(n_elements, BLOCK)
    x = load_fp32(x_ptr, offsets, mask)
    dy = load_fp32(dy_ptr, offsets, mask)
    _, dgelu = gelu_value_and_grad(x, APPROX_TANH)
    tl.store(dx_ptr + offsets, (dy * dgelu).to(dx_ptr.dtype.element_ty), mask=mask)


def _gelu_fwd(x: Tensor, approximate: str) -> Tensor:
    """Launch the forward; returns GELU(x), contiguous. The body of ``fused_layers::gelu``."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_elements = x.numel()
    if n_elements == 0:
        return y
    grid, block, num_warps = flat_config(n_elements)
    launch(_gelu_fwd_kernel, (grid,), (x, y, n_elements), BLOCK=block, APPROX_TANH=approximate == "tanh",
           num_warps=num_warps)  # fmt: skip
    return y


def _gelu_bwd(dy: Tensor, x: Tensor, approximate: str) -> Tensor:
    """Launch the backward; returns dx. The body of ``fused_layers::gelu_backward``."""
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_elements = x.numel()
    if n_elements == 0:
        return dx
    grid, block, num_warps = flat_config(n_elements)
    launch(_gelu_bwd_kernel, (grid,), (x, dy, dx, n_elements), BLOCK=block,
           APPROX_TANH=approximate == "tanh", num_warps=num_warps)  # fmt: skip
    return dx


def _setup_context(ctx: Any, inputs: tuple[Tensor, str], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])  # only x: the backward recomputes GELU'(x) from it
    ctx.approximate = inputs[1]


def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None]:
    """dx = dy * GELU'(x); shared by the eager Function and the custom op's autograd."""
    (x,) = ctx.saved_tensors
    return run_op("gelu_backward", _gelu_bwd, dy, x, ctx.approximate), None


GELUFunction = eager_function("GELUFunction", _gelu_fwd, _setup_context, _backward)


@registers
def _define() -> None:
    define("gelu_backward", _gelu_bwd)
    define("gelu", _gelu_fwd).register_autograd(_backward, setup_context=_setup_context)


def gelu(x: Tensor, approximate: str) -> Tensor:
    """GELU of ``x`` (``approximate`` "tanh" or "none", checked by ``fused_layers.ops.gelu``):
    the custom op when traced, else the autograd.Function."""
    return run_op("gelu", GELUFunction.apply, x, approximate)
