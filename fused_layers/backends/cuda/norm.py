"""CUDA C++ GELU, LayerNorm and RMSNorm, each with its own forward and backward kernels.

The extension is compiled by ``load_inline`` on the first call (never at import) into a cached
build folder (see ``fused_layers.cuda._build``). Inputs of any leading shape in float32, float16 or
bfloat16; math in fp32, results stored in the input's dtype; non-contiguous inputs are copied to
contiguous ones; zero rows are allowed. Eager norm calls go through an autograd node written in
C++ (``norm_autograd``: no Python between the forward, the backward and their kernels); GELU's is
a Python autograd.Function. Traced calls (torch.compile, fake tensors) use the custom ops
``torch.ops.fused_layers.cuda_*`` (opaque to torch.compile, with fake implementations; see
``fused_layers.ops._library``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.cuda import _build
from fused_layers.cuda._build import CudaExtensionUnavailable, load_extension
from fused_layers.ops._dispatch import DEFAULT_BACKEND
from fused_layers.ops._library import define, register_custom_ops, registers, traced

__all__ = ["CudaExtensionUnavailable", "gelu", "layer_norm", "load_extension", "rms_norm"]

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


# ctx in forward, not setup_context staticmethods: Function.apply binds a setup_context Function's
# arguments with inspect.signature on every call.
class _GeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tanh_approx: bool) -> Tensor:
        output = _gelu_fwd(x, tanh_approx)
        _gelu_setup_context(ctx, (x, tanh_approx), output)
        return output

    backward = staticmethod(_gelu_backward)


@registers
def _define() -> None:
    define("cuda_gelu_backward", _gelu_bwd, fake=_gelu_bwd_fake)
    gelu_op = define("cuda_gelu", _gelu_fwd, fake=_like)
    gelu_op.register_autograd(_gelu_backward, setup_context=_gelu_setup_context)
    define("cuda_norm_backward", _norm_bwd, fake=_norm_bwd_fake)
    norm_op = define("cuda_norm", _norm_fwd, fake=_norm_fwd_fake)
    norm_op.register_autograd(_norm_backward, setup_context=_norm_setup_context)


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


def _checked_affine(x: Tensor, param: Tensor | None, name: str, op: str) -> Tensor | None:
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


def _norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, rms: bool) -> Tensor:
    if traced(x) and register_custom_ops():
        return torch.ops.fused_layers.cuda_norm(x, weight, bias, eps, rms)[0]
    # Eager: the autograd node is C++ (forward and backward launch from C++, no Python in between).
    return load_extension().norm_autograd(x, weight, bias, eps, rms)


def eager_norm(
    op: str, backend: str | None, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor | None:
    """The result of this ``fused_layers.ops`` LayerNorm/RMSNorm call (``op``) through the C++
    autograd node, when the call can go there with no Python in between; else None, and the call
    takes the checked path (``resolve_backend``, then ``layer_norm`` / ``rms_norm`` here), which
    gives the same result or raises the error.

    Not None for an eager call on a plain CUDA tensor of a supported dtype, with parameters of its
    dtype, shape and device, when the backend is "cuda" or the default (a call autograd
    differentiates), once a call has built the extension; the extension's ``norm_eager`` makes those
    checks. It exists for host time: on the H200's host the checked path's Python added 13-14 µs to
    a forward whose autograd node took 46-48 µs; through here, a LayerNorm forward took 23-34 µs of
    host time against eager's 35-47 (``benchmarks/results/host_phases_node.h200.json``).
    """
    ext = _build._extension
    if ext is None or type(x) is not Tensor or torch.compiler.is_compiling():
        return None
    rms = op == "rms_norm"
    if backend is None:
        if DEFAULT_BACKEND[op][0] != "cuda":
            return None
        return ext.norm_eager(x, weight, bias, eps, rms, True)
    return ext.norm_eager(x, weight, bias, eps, rms, False) if backend == "cuda" else None


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
    weight = _checked_affine(x, weight, "weight", "layer_norm")
    bias = _checked_affine(x, bias, "bias", "layer_norm")
    return _norm(x, weight, bias, float(eps), False)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim of ``x`` with CUDA C++ kernels, like Hugging Face ``LlamaRMSNorm``.

    ``x_normed = (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)``, then
    ``weight * x_normed``. ``weight`` (optional, shape ``(x.shape[-1],)``) must have x's dtype:
    Llama's casting gives a result in torch's promotion of the two, which this kernel does not
    produce (``fused_layers.ops.rms_norm`` routes such calls to Triton).
    """
    _check_tensor(x, "rms_norm")
    if x.dim() == 0:
        raise ValueError("fused_layers.cuda.rms_norm: expected at least one dimension")
    if weight is not None and weight.dtype != x.dtype:
        raise TypeError(
            f"fused_layers.cuda.rms_norm: weight is {weight.dtype} and x {x.dtype}; the CUDA kernel needs "
            "one dtype (use backend='triton' for Llama's mixed-dtype casting)"
        )
    weight = _checked_affine(x, weight, "weight", "rms_norm")
    return _norm(x, weight, None, float(eps), True)
