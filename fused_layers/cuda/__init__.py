"""CUDA C++ GELU and LayerNorm, each an autograd Function with its own forward and backward kernels.

The extension is compiled by ``load_inline`` on the first call (never at import) into a cached
build folder (see ``fused_layers.cuda._build``). Inputs of any leading shape in float32, float16 or
bfloat16; math in fp32, results stored in the input's dtype; non-contiguous inputs are copied to
contiguous ones; zero rows are allowed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fused_layers.cuda._build import CudaExtensionUnavailable, load_extension

__all__ = ["CudaExtensionUnavailable", "gelu", "layer_norm", "load_extension"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GELU_APPROXIMATIONS = ("tanh", "none")


def _check_tensor(x: Tensor, op: str) -> None:
    if not x.is_cuda:
        raise ValueError(f"fused_layers.cuda.{op}: expected a CUDA tensor, got one on {x.device}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"fused_layers.cuda.{op}: unsupported dtype {x.dtype}; expected one of {_DTYPES}")


class _GeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tanh_approx: bool) -> Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x)
        ctx.tanh_approx = tanh_approx
        return load_extension().gelu_forward(x, tanh_approx)

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        grad_input = load_extension().gelu_backward(grad_output.contiguous(), x, ctx.tanh_approx)
        return grad_input, None


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
        width = x.shape[-1]
        x2d = x.contiguous().view(-1, width)
        y, mean, rstd = load_extension().layer_norm_forward(x2d, weight, bias, eps)
        ctx.save_for_backward(x2d, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        x2d, weight, mean, rstd = ctx.saved_tensors
        need_dweight = weight is not None and ctx.needs_input_grad[1]
        need_dbias = ctx.has_bias and ctx.needs_input_grad[2]
        dy2d = grad_output.contiguous().view(x2d.shape)
        dx, dweight, dbias = load_extension().layer_norm_backward(
            dy2d, x2d, weight, mean, rstd, need_dweight, need_dbias
        )
        # The extension returns fp32 weight/bias gradients (summed partials); cast to the parameter dtype.
        dweight_out = dweight.to(weight.dtype) if need_dweight else None
        dbias_out = dbias.to(x2d.dtype) if need_dbias else None
        return dx.view(grad_output.shape), dweight_out, dbias_out, None


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU of ``x`` with CUDA C++ kernels: ``approximate="tanh"`` (GPT-2's form) or ``"none"`` (erf).

    Raises ValueError for a CPU tensor or an unknown ``approximate``, TypeError for an unsupported
    dtype, and :class:`CudaExtensionUnavailable` when the extension cannot be built here.
    """
    if approximate not in _GELU_APPROXIMATIONS:
        raise ValueError(f"fused_layers.cuda.gelu: approximate must be one of {_GELU_APPROXIMATIONS}")
    _check_tensor(x, "gelu")
    return _GeluFunction.apply(x, approximate == "tanh")


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """LayerNorm over the last dim of ``x`` with CUDA C++ kernels (mean and rstd kept in fp32).

    ``weight`` and ``bias`` have shape ``(x.shape[-1],)`` and are cast to ``x``'s dtype when they
    differ (the cast is part of the autograd graph, so their gradients keep their own dtype).
    """
    _check_tensor(x, "layer_norm")
    if x.dim() == 0:
        raise ValueError("fused_layers.cuda.layer_norm: expected at least one dimension")
    width = x.shape[-1]
    affine = {"weight": weight, "bias": bias}
    for name, param in affine.items():
        if param is None:
            continue
        if param.shape != (width,):
            raise ValueError(
                f"fused_layers.cuda.layer_norm: {name} has shape {tuple(param.shape)}, expected ({width},)"
            )
        if param.device != x.device:
            raise ValueError(f"fused_layers.cuda.layer_norm: {name} is on {param.device}, x on {x.device}")
        affine[name] = param.to(x.dtype).contiguous()
    return _LayerNormFunction.apply(x, affine["weight"], affine["bias"], float(eps))
