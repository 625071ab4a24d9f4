"""What the CUDA C++ LayerNorm and RMSNorm share: one extension entry point per pass for both norms
(``rms`` picks RMSNorm), the custom ops of traced calls, and the checks of the public functions in
``layer_norm.py`` and ``rms_norm.py``.

Eager calls go to ``norm_autograd``, whose autograd node is written in C++ (``NormBackward`` in
norm.cu: no Python between the forward, the backward and their kernels). Traced calls
(torch.compile, fake tensors) use the custom ops ``torch.ops.fused_layers.cuda_norm`` and
``cuda_norm_backward`` (opaque to torch.compile, with fake implementations; see
``fused_layers.backends.custom_ops``), whose autograd is Python.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.cuda.build import load_extension
from fused_layers.backends.custom_ops import define, register_custom_ops, registers, traced

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_input(x: Tensor, op: str) -> None:
    """A CUDA tensor of a supported dtype with at least one dimension, or a clear error."""
    if not x.is_cuda:
        raise ValueError(f"fused_layers.cuda.{op}: expected a CUDA tensor, got one on {x.device}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"fused_layers.cuda.{op}: unsupported dtype {x.dtype}; expected one of {_DTYPES}")
    if x.dim() == 0:
        raise ValueError(f"fused_layers.cuda.{op}: expected at least one dimension")


def checked_affine(x: Tensor, param: Tensor | None, name: str, op: str) -> Tensor | None:
    """``param`` cast to x's dtype (in the autograd graph, so its gradient keeps its own dtype)."""
    if param is None:
        return None
    width = x.shape[-1]
    if param.shape != (width,):
        shape = tuple(param.shape)
        raise ValueError(f"fused_layers.cuda.{op}: {name} has shape {shape}, expected ({width},)")
    if param.device != x.device:
        raise ValueError(f"fused_layers.cuda.{op}: {name} is on {param.device}, x on {x.device}")
    return param if param.dtype == x.dtype else param.to(x.dtype)


# ---- launchers (each the body of a custom op) and their fake implementations ----------------------


def _norm_fwd(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, rms: bool
) -> tuple[Tensor, Tensor]:
    """y (x's shape) and the rows' fp32 statistics: [2, rows] (mean, rstd) for LayerNorm, [rows]
    (rstd) for RMSNorm, in one tensor (one allocation); the traced path's forward."""
    return tuple(load_extension().norm_forward(x, weight, bias, eps, rms))


def _norm_fwd_fake(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, rms: bool
) -> tuple[Tensor, Tensor]:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    stats = torch.empty((rows,) if rms else (2, rows), dtype=torch.float32, device=x.device)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), stats


def _norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, stats: Tensor, need_dw: bool, need_db: bool, rms: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """dx (x's shape) and dweight, dbias (N,) in x's dtype, each (0,) when not asked for."""
    return tuple(load_extension().norm_backward(dy, x, weight, stats, need_dw, need_db, rms))


def _norm_bwd_fake(
    dy: Tensor, x: Tensor, weight: Tensor | None, stats: Tensor, need_dw: bool, need_db: bool, rms: bool
) -> tuple[Tensor, Tensor, Tensor]:
    width = x.shape[-1]
    sums = [torch.empty(width if need else 0, dtype=x.dtype, device=x.device) for need in (need_dw, need_db)]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), *sums


def _norm_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    x, weight, bias, _, rms = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_bias = bias is not None
    ctx.rms = rms
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _norm_backward(ctx: Any, dy: Tensor | None, _dstats: None) -> tuple[Tensor | None, ...]:
    if dy is None:
        return None, None, None, None, None
    x, weight, stats = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = ctx.has_bias and ctx.needs_input_grad[2]
    backward_op = torch.ops.fused_layers.cuda_norm_backward
    dx, dw, db = backward_op(dy, x, weight, stats, need_dw, need_db, ctx.rms)
    return dx, dw if need_dw else None, db if need_db else None, None, None


@registers
def _define() -> None:
    define("cuda_norm_backward", _norm_bwd, fake=_norm_bwd_fake)
    norm_op = define("cuda_norm", _norm_fwd, fake=_norm_fwd_fake)
    norm_op.register_autograd(_norm_backward, setup_context=_norm_setup_context)


def norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, rms: bool) -> Tensor:
    """LayerNorm (``rms`` False) or RMSNorm of checked arguments: the custom op when traced, else
    the extension's C++ autograd node (forward and backward launch from C++)."""
    if traced(x) and register_custom_ops():
        return torch.ops.fused_layers.cuda_norm(x, weight, bias, eps, rms)[0]
    return load_extension().norm_autograd(x, weight, bias, eps, rms)
