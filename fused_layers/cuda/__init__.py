"""CUDA C++ GELU and LayerNorm, each an autograd Function with its own forward and backward kernels.

The extension is compiled by ``load_inline`` on the first call (never at import) into a cached
build folder (see ``fused_layers.cuda._build``). Inputs of any leading shape in float32, float16 or
bfloat16; math in fp32, results stored in the input's dtype; non-contiguous inputs are copied to
contiguous ones; zero rows are allowed. Like the Triton ops, eager calls run an autograd.Function
over the launchers and traced calls the custom ops ``torch.ops.fused_layers.cuda_*`` (opaque to
torch.compile, with fake implementations; see ``fused_layers.ops._library``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.cuda._build import CudaExtensionUnavailable, load_extension
from fused_layers.ops._library import define, register_custom_ops, registers, traced

__all__ = ["CudaExtensionUnavailable", "gelu", "layer_norm", "load_extension"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GELU_APPROXIMATIONS = ("tanh", "none")


def _check_tensor(x: Tensor, op: str) -> None:
    if not x.is_cuda:
        raise ValueError(f"fused_layers.cuda.{op}: expected a CUDA tensor, got one on {x.device}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"fused_layers.cuda.{op}: unsupported dtype {x.dtype}; expected one of {_DTYPES}")


# ---- launchers (each also the body of a custom op) and their fake implementations -------------------


def _gelu_fwd(x: Tensor, tanh_approx: bool) -> Tensor:
    return load_extension().gelu_forward(x.contiguous(), tanh_approx)


def _gelu_bwd(dy: Tensor, x: Tensor, tanh_approx: bool) -> Tensor:
    return load_extension().gelu_backward(dy.contiguous(), x.contiguous(), tanh_approx)


def _like(x: Tensor, tanh_approx: bool) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _gelu_bwd_fake(dy: Tensor, x: Tensor, tanh_approx: bool) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _gelu_setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.tanh_approx = inputs[1]


def _gelu_backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None]:
    (x,) = ctx.saved_tensors
    if traced(dy) and register_custom_ops():
        return torch.ops.fused_layers.cuda_gelu_backward(dy, x, ctx.tanh_approx), None
    return _gelu_bwd(dy, x, ctx.tanh_approx), None


def _layer_norm_fwd(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    x2d = x.contiguous().view(-1, x.shape[-1])
    y, mean, rstd = load_extension().layer_norm_forward(x2d, weight, bias, eps)
    return y.view(x.shape), mean, rstd


def _layer_norm_fwd_fake(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    stats = [torch.empty(rows, dtype=torch.float32, device=x.device) for _ in range(2)]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), *stats


def _layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, need_dw: bool, need_db: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """dx (x's shape) and fp32 dweight, dbias (N,), each (0,) when not asked for."""
    width = x.shape[-1]
    x2d, dy2d = x.contiguous().view(-1, width), dy.contiguous().view(-1, width)
    dx, dw, db = load_extension().layer_norm_backward(dy2d, x2d, weight, mean, rstd, need_dw, need_db)
    return dx.view(x.shape), dw, db


def _layer_norm_bwd_fake(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, need_dw: bool, need_db: bool
) -> tuple[Tensor, Tensor, Tensor]:
    width = x.shape[-1]
    sums = [
        torch.empty(width if need else 0, dtype=torch.float32, device=x.device) for need in (need_dw, need_db)
    ]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), *sums


def _layer_norm_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> None:
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)


def _layer_norm_backward(
    ctx: Any, dy: Tensor | None, _dmean: None, _drstd: None
) -> tuple[Tensor | None, ...]:
    if dy is None:
        return None, None, None, None
    x, weight, mean, rstd = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = ctx.has_bias and ctx.needs_input_grad[2]
    if traced(dy) and register_custom_ops():
        backward_op = torch.ops.fused_layers.cuda_layer_norm_backward
        dx, dw, db = backward_op(dy, x, weight, mean, rstd, need_dw, need_db)
    else:
        dx, dw, db = _layer_norm_bwd(dy, x, weight, mean, rstd, need_dw, need_db)
    # fp32 sums of the partials; the parameters were cast to x's dtype before the call
    return dx, dw.to(x.dtype) if need_dw else None, db.to(x.dtype) if need_db else None, None


# ctx in forward, not setup_context staticmethods: Function.apply binds a setup_context Function's
# arguments with inspect.signature on every call.
class _GeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tanh_approx: bool) -> Tensor:
        output = _gelu_fwd(x, tanh_approx)
        _gelu_setup_context(ctx, (x, tanh_approx), output)
        return output

    backward = staticmethod(_gelu_backward)


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        output = _layer_norm_fwd(x, weight, bias, eps)
        _layer_norm_setup_context(ctx, (x, weight, bias, eps), output)
        return output

    backward = staticmethod(_layer_norm_backward)


@registers
def _define() -> None:
    define("cuda_gelu_backward", _gelu_bwd, fake=_gelu_bwd_fake)
    gelu_op = define("cuda_gelu", _gelu_fwd, fake=_like)
    gelu_op.register_autograd(_gelu_backward, setup_context=_gelu_setup_context)
    define("cuda_layer_norm_backward", _layer_norm_bwd, fake=_layer_norm_bwd_fake)
    layer_norm_op = define("cuda_layer_norm", _layer_norm_fwd, fake=_layer_norm_fwd_fake)
    layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup_context)


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU of ``x`` with CUDA C++ kernels: ``approximate="tanh"`` (GPT-2's form) or ``"none"`` (erf).

    Raises ValueError for a CPU tensor or an unknown ``approximate``, TypeError for an unsupported
    dtype, and :class:`CudaExtensionUnavailable` when the extension cannot be built here.
    """
    if approximate not in _GELU_APPROXIMATIONS:
        raise ValueError(f"fused_layers.cuda.gelu: approximate must be one of {_GELU_APPROXIMATIONS}")
    _check_tensor(x, "gelu")
    if traced(x) and register_custom_ops():
        return torch.ops.fused_layers.cuda_gelu(x, approximate == "tanh")
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
    if traced(x) and register_custom_ops():
        return torch.ops.fused_layers.cuda_layer_norm(x, affine["weight"], affine["bias"], float(eps))[0]
    return _LayerNormFunction.apply(x, affine["weight"], affine["bias"], float(eps))[0]
