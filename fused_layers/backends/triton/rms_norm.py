"""RMSNorm over the last dim with Llama's casting, in Triton: forward and backward, one autograd.Function.

Matches Hugging Face ``LlamaRMSNorm``: the variance and inverse RMS are fp32, the normalised
row is rounded to the input dtype, and only then multiplied by the weight, in the dtype torch
promotes (weight, input) to. Rows wider than ``MAX_FUSED_WIDTH`` take a looped path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import eager_function, registers, run_op
from fused_layers.backends.triton import heuristics
from fused_layers.backends.triton.blocks import load_fp32, row_tile, tile_offsets
from fused_layers.backends.triton.language import tl, triton
from fused_layers.backends.triton.launch import define, launch
from fused_layers.backends.triton.partials import sum_partials


@triton.jit
def _rms_norm_fwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, promote(weight, input) dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    rstd_ptr,  # (M,) fp32
    x_row_stride,
    M,
    N,
    eps,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    rows, row_mask, mask = row_tile(tl.program_id(0), M, col_mask, ROWS)
    x = tl.load(x_ptr + tile_offsets(rows, x_row_stride, cols), mask=mask, other=0.0)
    x_f32 = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x_f32 * x_f32, axis=1) / N + eps)
    # Llama rounds x * rstd to the input dtype before the weight multiply
    y = (x_f32 * rstd[:, None]).to(x.dtype).to(tl.float32)
    if HAS_WEIGHT:
        y = load_fp32(w_ptr, cols, col_mask)[None, :] * y
    tl.store(y_ptr + tile_offsets(rows, N, cols), y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _rms_norm_fwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, promote(weight, input) dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    rstd_ptr,  # (M,) fp32
    x_row_stride,
    M,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
):
    # One program per row, two walks over it (sum of squares, output); the second reads from L2.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = load_fp32(x_row, cols, cols < N)
        acc += x * x
    rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0)
        y = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
        if HAS_WEIGHT:
            y = load_fp32(w_ptr, cols, col_mask) * y
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_bwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    rstd_ptr,  # (M,) fp32
    dw_partial_ptr,  # (num_programs, N) fp32; unused unless COMPUTE_DW
    x_row_stride,
    dy_row_stride,
    M,
    N,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # Persistent: program p handles row tiles p, p + P, ... and keeps its dweight sum in
    # registers, writing one (N,) partial row at the end; the sum stays (ROWS, BLOCK_N) until
    # then, as summing over the tile's rows every iteration is a cross-warp reduction.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = load_fp32(w_ptr, cols, col_mask)
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # NUM_STAGES > 1 lets Triton prefetch the next tile's x and dy while this one is computed
    for tile in tl.range(pid, tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=NUM_STAGES):
        rows, row_mask, mask = row_tile(tile, M, col_mask, ROWS)
        x = tl.load(x_ptr + tile_offsets(rows, x_row_stride, cols), mask=mask, other=0.0)
        dy = load_fp32(dy_ptr, tile_offsets(rows, dy_row_stride, cols), mask)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x_hat = x.to(tl.float32) * rstd[:, None]
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
        else:
            wdy = dy
        c = tl.sum(x_hat * wdy, axis=1) / N
        dx = (wdy - x_hat * c[:, None]) * rstd[:, None]
        tl.store(dx_ptr + tile_offsets(rows, N, cols), dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            # the weight saw x_hat rounded to the input dtype (Llama casting)
            dw_acc += dy * x_hat.to(x.dtype).to(tl.float32)
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


@triton.jit
def _rms_norm_bwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    rstd_ptr,  # (M,) fp32
    dw_partial_ptr,  # (num_programs, N) fp32, zero-filled; unused unless COMPUTE_DW
    x_row_stride,
    dy_row_stride,
    M,
    N,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
):
    # Persistent over rows; the dweight partial sums live in this program's own row of the
    # partial buffer (no other program touches it: no atomics).
    pid = tl.program_id(0)
    dw_row = dw_partial_ptr + pid * N
    for row in range(pid, M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * x_row_stride
        dy_row = dy_ptr + tl.cast(row, tl.int64) * dy_row_stride
        dx_row = dx_ptr + tl.cast(row, tl.int64) * N
        rstd = tl.load(rstd_ptr + row)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = load_fp32(x_row, cols, col_mask)
            dy = load_fp32(dy_row, cols, col_mask)
            if HAS_WEIGHT:
                dy = dy * load_fp32(w_ptr, cols, col_mask)
            acc += x * rstd * dy
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0)
            dy = load_fp32(dy_row, cols, col_mask)
            x_hat = x.to(tl.float32) * rstd
            if HAS_WEIGHT:
                wdy = dy * load_fp32(w_ptr, cols, col_mask)
            else:
                wdy = dy
            dx = (wdy - x_hat * c) * rstd
            tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
            if COMPUTE_DW:
                x_normed = x_hat.to(x.dtype).to(tl.float32)
                tl.store(dw_row + cols, tl.load(dw_row + cols, mask=col_mask) + dy * x_normed, mask=col_mask)


def _rms_norm_fwd(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """Launch the forward over x's last dim; returns y (x's shape) and fp32 rstd (rows,).

    The body of the custom op ``fused_layers::rms_norm`` and of the eager Function alike.
    """
    width = x.shape[-1]
    x2d = heuristics.as_rows(x)
    n_rows = x2d.shape[0]
    out_dtype = torch.promote_types(weight.dtype, x.dtype) if weight is not None else x.dtype
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    plan = heuristics.norm_plan("rms_norm", n_rows, width, x.device)
    args = (x2d, y, x2d if weight is None else weight, rstd, x2d.stride(0), n_rows, width, eps)
    kernel = _rms_norm_fwd_fused if plan.fused else _rms_norm_fwd_looped
    extra = {"ROWS": plan.rows} if plan.fused else {}
    launch(kernel, (plan.programs,), args, **extra, BLOCK_N=plan.block_n, HAS_WEIGHT=weight is not None,
           num_warps=plan.num_warps)  # fmt: skip
    return y, rstd


def _rms_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor, compute_dw: bool
) -> tuple[Tensor, Tensor]:
    """Launch the backward; returns dx (x's shape) and dweight (N,) in weight's dtype ((0,) if not asked).

    The body of the custom op ``fused_layers::rms_norm_backward``.
    """
    width = x.shape[-1]
    x2d, dy2d = heuristics.as_rows(x), heuristics.as_rows(dy)
    n_rows = x2d.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw_dtype = weight.dtype if weight is not None else x.dtype
    if n_rows == 0:
        return dx, torch.zeros(width if compute_dw else 0, dtype=dw_dtype, device=x.device)
    plan = heuristics.norm_plan("rms_norm", n_rows, width, x.device, backward=True)
    # Per-program partial sums, reduced by sum_partials below: the fused kernel writes each
    # partial row once, the looped one adds into them.
    alloc = torch.empty if plan.fused else torch.zeros
    partial = alloc((plan.programs, width) if compute_dw else (1,), dtype=torch.float32, device=x.device)
    args = (x2d, dy2d, dx, x2d if weight is None else weight, rstd, partial, x2d.stride(0), dy2d.stride(0),
            n_rows, width)  # fmt: skip
    kernel = _rms_norm_bwd_fused if plan.fused else _rms_norm_bwd_looped
    extra = {"ROWS": plan.rows, "NUM_STAGES": plan.stages} if plan.fused else {}
    launch(kernel, (plan.programs,), args, **extra, BLOCK_N=plan.block_n, HAS_WEIGHT=weight is not None,
           COMPUTE_DW=compute_dw, num_warps=plan.num_warps)  # fmt: skip
    if not compute_dw:
        return dx, torch.empty(0, dtype=dw_dtype, device=x.device)
    return dx, sum_partials(partial, dw_dtype)


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero-filled gradient for the rstd output


def _backward(ctx: Any, dy: Tensor | None, _drstd: None) -> tuple[Tensor | None, ...]:
    """dx, dweight, None (eps); shared by the eager Function and the custom op's autograd.

    With x_hat = x * rstd and g = dy * weight: dx = rstd * (g - mean(g * x_hat) * x_hat) (mean
    over the row), dweight = sum over rows of dy * x_hat rounded to x's dtype (Llama's casting).
    """
    if dy is None:
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    compute_dw = weight is not None and ctx.needs_input_grad[1]
    dx, dw = run_op("rms_norm_backward", _rms_norm_bwd, dy, x, weight, rstd, compute_dw)
    return dx, dw if compute_dw else None, None


RMSNormFunction = eager_function("RMSNormFunction", _rms_norm_fwd, _setup_context, _backward)


@registers
def _define() -> None:
    define("rms_norm_backward", _rms_norm_bwd)
    define("rms_norm", _rms_norm_fwd).register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm of ``x`` over its last dim (arguments checked by ``fused_layers.ops.rms_norm``): the
    custom op when traced, else the autograd.Function. The result has torch's promotion of weight's
    and x's dtypes."""
    return run_op("rms_norm", RMSNormFunction.apply, x, weight, eps)[0]
