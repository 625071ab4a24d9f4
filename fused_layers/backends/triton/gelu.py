"""GELU, tanh or erf form: one flat Triton kernel forward, one backward, one autograd.Function."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import fused_layers.cuda as fused_cuda
from fused_layers.ops._dispatch import resolve_backend
from fused_layers.ops._launch import flat_config
from fused_layers.ops._library import define, launch, register_custom_ops, registers, traced
from fused_layers.ops._triton import tl, triton

_APPROXIMATIONS = ("tanh", "none")


@triton.jit
def _gelu_value(x, APPROX_TANH: tl.constexpr):
    """GELU of an fp32 block."""
    if APPROX_TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        # 0.5 * (1 + tanh(z)) == sigmoid(2z): no libdevice tanh (the CPU interpreter lacks it)
        # and no cancellation in 1 + tanh(z) for large negative x.
        return x * tl.sigmoid(2.0 * inner)
    else:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _gelu_value_and_grad(x, APPROX_TANH: tl.constexpr):
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
    # int64 offsets: tensors past 2**31 elements are common at these widths
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, _gelu_value(x, APPROX_TANH).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_kernel(
    x_ptr,  # (n_elements,) contiguous, input dtype
    dy_ptr,  # (n_elements,) contiguous, grad dtype
    dx_ptr,  # (n_elements,) contiguous, input dtype
    n_elements,
    BLOCK: tl.constexpr,
    APPROX_TANH: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    _, dgelu = _gelu_value_and_grad(x, APPROX_TANH)
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
    if traced(dy) and register_custom_ops():
        return torch.ops.fused_layers.gelu_backward(dy, x, ctx.approximate), None
    return _gelu_bwd(dy, x, ctx.approximate), None


class GELUFunction(torch.autograd.Function):
    """The eager path: the launchers called directly, with no dispatcher in between."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, approximate: str) -> Tensor:
        # ctx in forward, not a setup_context staticmethod: Function.apply binds a setup_context
        # Function's arguments with inspect.signature on every call.
        output = _gelu_fwd(x, approximate)
        _setup_context(ctx, (x, approximate), output)
        return output

    backward = staticmethod(_backward)


@registers
def _define() -> None:
    define("gelu_backward", _gelu_bwd)
    define("gelu", _gelu_fwd).register_autograd(_backward, setup_context=_setup_context)


def gelu(x: Tensor, approximate: str = "tanh", backend: str | None = None) -> Tensor:
    """GELU of ``x``, like ``F.gelu(x, approximate=approximate)``.

    ``approximate`` is "tanh" (GPT-2's NewGELU) or "none" (the erf form). ``backend`` is
    None (``DEFAULT_BACKEND["gelu"]``), "triton", "torch" or "cuda". Computes in fp32 and
    returns the input's dtype and shape (contiguous).
    """
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be one of {_APPROXIMATIONS}, got {approximate!r}")
    choice = resolve_backend("gelu", backend, x)
    if choice == "torch":
        return F.gelu(x, approximate=approximate)
    if choice == "cuda":
        return fused_cuda.gelu(x, approximate)
    if traced(x) and register_custom_ops():
        return torch.ops.fused_layers.gelu(x, approximate)
    return GELUFunction.apply(x, approximate)
