"""LayerNorm over the last dim in Triton: forward and backward kernels, launchers, one autograd.Function.

Rows up to ``MAX_FUSED_WIDTH`` wide are held in registers in one block (narrow rows packed
several to a program); wider rows take a looped path that walks the row in chunks. The
backward recomputes x_hat from x and the saved fp32 mean/rstd, and sums dweight/dbias per
program over many rows (see ``persistent_programs``) before one small reduction kernel.
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
def _layer_norm_fwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    stats_ptr,  # (2, M) fp32: mean, rstd
    x_row_stride,
    M,
    N,
    eps,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    rows, row_mask, mask = row_tile(tl.program_id(0), M, col_mask, ROWS)
    x = load_fp32(x_ptr, tile_offsets(rows, x_row_stride, cols), mask)
    mean = tl.sum(x, axis=1) / N
    # two-pass variance on the registers: no E[x^2] - mean^2 cancellation
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        y = y * load_fp32(w_ptr, cols, col_mask)[None, :]
    if HAS_BIAS:
        y = y + load_fp32(b_ptr, cols, col_mask)[None, :]
    tl.store(y_ptr + tile_offsets(rows, N, cols), y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(stats_ptr + rows, mean, mask=row_mask)
    tl.store(stats_ptr + M + rows, rstd, mask=row_mask)


@triton.jit
def _layer_norm_fwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    stats_ptr,  # (2, M) fp32: mean, rstd
    x_row_stride,
    M,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    # One program per row, three walks over it (mean, variance, output); the re-reads of a
    # row of at most a few hundred KiB come from L2, not HBM.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        acc += load_fp32(x_row, cols, cols < N)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = load_fp32(x_row, cols, cols < N)
        xc = tl.where(cols < N, x - mean, 0.0)
        acc += xc * xc
    rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = load_fp32(x_row, cols, col_mask)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * load_fp32(w_ptr, cols, col_mask)
        if HAS_BIAS:
            y = y + load_fp32(b_ptr, cols, col_mask)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(stats_ptr + row, mean)
    tl.store(stats_ptr + M + row, rstd)


@triton.jit
def _layer_norm_bwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    stats_ptr,  # (2, M) fp32: mean, rstd
    partial_ptr,  # (num_programs, 2, N) fp32: dweight, dbias sums; unused unless COMPUTE_DW or COMPUTE_DB
    x_row_stride,
    dy_row_stride,
    M,
    N,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # Persistent: program p handles row tiles p, p + P, p + 2P, ... and keeps its dweight/dbias
    # sums in registers, writing one (N,) partial row each at the end. The sums stay (ROWS,
    # BLOCK_N) until then: summing over the tile's rows every iteration is a cross-warp
    # reduction (shared memory and a barrier) that made the narrow-row backward 2-3x slower.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = load_fp32(w_ptr, cols, col_mask)
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # NUM_STAGES > 1 lets Triton prefetch the next tile's x and dy while this one is computed
    for tile in tl.range(pid, tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=NUM_STAGES):
        rows, row_mask, mask = row_tile(tile, M, col_mask, ROWS)
        x = load_fp32(x_ptr, tile_offsets(rows, x_row_stride, cols), mask)
        dy = load_fp32(dy_ptr, tile_offsets(rows, dy_row_stride, cols), mask)
        mean = tl.load(stats_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(stats_ptr + M + rows, mask=row_mask, other=0.0)
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
        else:
            wdy = dy
        c1 = tl.sum(x_hat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (x_hat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + tile_offsets(rows, N, cols), dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * x_hat
        if COMPUTE_DB:
            db_acc += dy
    if COMPUTE_DW:
        tl.store(partial_ptr + pid * 2 * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if COMPUTE_DB:
        tl.store(partial_ptr + (pid * 2 + 1) * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _layer_norm_bwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    stats_ptr,  # (2, M) fp32: mean, rstd
    partial_ptr,  # (num_programs, 2, N) fp32, zero-filled: dweight, dbias sums; unused unless COMPUTE_DW/DB
    x_row_stride,
    dy_row_stride,
    M,
    N,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
):
    # Persistent over rows; a row is too wide for registers, so the partial sums live in this
    # program's own row of the partial buffer (no other program touches it: no atomics).
    pid = tl.program_id(0)
    dw_row = partial_ptr + pid * 2 * N
    db_row = dw_row + N
    for row in range(pid, M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * x_row_stride
        dy_row = dy_ptr + tl.cast(row, tl.int64) * dy_row_stride
        dx_row = dx_ptr + tl.cast(row, tl.int64) * N
        mean = tl.load(stats_ptr + row)
        rstd = tl.load(stats_ptr + M + row)
        acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = load_fp32(x_row, cols, col_mask)
            dy = load_fp32(dy_row, cols, col_mask)
            x_hat = tl.where(col_mask, (x - mean) * rstd, 0.0)
            if HAS_WEIGHT:
                dy = dy * load_fp32(w_ptr, cols, col_mask)
            acc1 += x_hat * dy
            acc2 += dy
        c1 = tl.sum(acc1, axis=0) / N
        c2 = tl.sum(acc2, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = load_fp32(x_row, cols, col_mask)
            dy = load_fp32(dy_row, cols, col_mask)
            x_hat = tl.where(col_mask, (x - mean) * rstd, 0.0)
            if HAS_WEIGHT:
                wdy = dy * load_fp32(w_ptr, cols, col_mask)
            else:
                wdy = dy
            dx = (wdy - (x_hat * c1 + c2)) * rstd
            tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
            if COMPUTE_DW:
                tl.store(dw_row + cols, tl.load(dw_row + cols, mask=col_mask) + dy * x_hat, mask=col_mask)
            if COMPUTE_DB:
                tl.store(db_row + cols, tl.load(db_row + cols, mask=col_mask) + dy, mask=col_mask)


def _layer_norm_fwd(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """Launch the forward over x's last dim; returns y (x's shape) and fp32 stats (2, rows): mean, rstd.

    The body of the custom op ``fused_layers::layer_norm`` and of the eager Function alike.
    """
    width = x.shape[-1]
    x2d = heuristics.as_rows(x)
    n_rows = x2d.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    stats = torch.empty((2, n_rows), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, stats
    plan = heuristics.norm_plan("layer_norm", n_rows, width, x.device)
    # a dummy pointer for an absent weight/bias; the kernel never reads it (constexpr flag)
    args = (x2d, y, x2d if weight is None else weight, x2d if bias is None else bias, stats,
            x2d.stride(0), n_rows, width, eps)  # fmt: skip
    if plan.fused:
        launch(
            _layer_norm_fwd_fused, (plan.programs,), args, ROWS=plan.rows, BLOCK_N=plan.block_n,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, num_warps=plan.num_warps,
        )  # fmt: skip
    else:
        launch(
            _layer_norm_fwd_looped, (plan.programs,), args, BLOCK_N=plan.block_n,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, num_warps=plan.num_warps,
        )  # fmt: skip
    return y, stats


def _layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, stats: Tensor, compute_dw: bool, compute_db: bool
) -> tuple[Tensor, Tensor]:
    """Launch the backward; returns dx (x's shape) and (2, N) sums of dweight, dbias in weight's dtype.

    The (2, N) rows not asked for hold zeros; with neither asked for it is (0, N). The body of
    the custom op ``fused_layers::layer_norm_backward``.
    """
    width = x.shape[-1]
    x2d, dy2d = heuristics.as_rows(x), heuristics.as_rows(dy)
    n_rows = x2d.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    sums_dtype = weight.dtype if weight is not None else x.dtype
    want_sums = compute_dw or compute_db
    if n_rows == 0:
        return dx, torch.zeros((2 if want_sums else 0, width), dtype=sums_dtype, device=x.device)
    plan = heuristics.norm_plan("layer_norm", n_rows, width, x.device, backward=True)
    # Per-program partial sums, reduced by sum_partials below: the fused kernel writes each
    # partial row once, the looped one adds into them. With only one of dweight/dbias asked for,
    # the other rows are summed too: zeros, not whatever the allocation held.
    alloc = torch.empty if plan.fused and compute_dw == compute_db else torch.zeros
    partial_shape = (plan.programs, 2, width) if want_sums else (1,)
    partial = alloc(partial_shape, dtype=torch.float32, device=x.device)
    args = (x2d, dy2d, dx, x2d if weight is None else weight, stats, partial,
            x2d.stride(0), dy2d.stride(0), n_rows, width)  # fmt: skip
    kernel = _layer_norm_bwd_fused if plan.fused else _layer_norm_bwd_looped
    extra = {"ROWS": plan.rows, "NUM_STAGES": plan.stages} if plan.fused else {}
    launch(
        kernel, (plan.programs,), args, **extra, BLOCK_N=plan.block_n, HAS_WEIGHT=weight is not None,
        COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, num_warps=plan.num_warps,
    )  # fmt: skip
    if not want_sums:
        return dx, torch.empty((0, width), dtype=sums_dtype, device=x.device)
    return dx, sum_partials(partial, sums_dtype)


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero-filled gradient for the stats output


def _backward(ctx: Any, dy: Tensor | None, _dstats: None) -> tuple[Tensor | None, ...]:
    """dx, dweight, dbias, None (eps); shared by the eager Function and the custom op's autograd.

    With x_hat = (x - mean) * rstd and g = dy * weight:
    dx = rstd * (g - mean(g * x_hat) * x_hat - mean(g)), dweight = sum(dy * x_hat), dbias = sum(dy),
    means over the row, sums over the rows.
    """
    if dy is None:
        return None, None, None, None
    x, weight, stats = ctx.saved_tensors
    compute_dw = weight is not None and ctx.needs_input_grad[1]
    compute_db = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
    dx, sums = run_op("layer_norm_backward", _layer_norm_bwd, dy, x, weight, stats, compute_dw, compute_db)
    dw = sums[0] if compute_dw else None
    db = sums[1].to(ctx.bias_dtype) if compute_db else None
    return dx, dw, db, None


LayerNormFunction = eager_function("LayerNormFunction", _layer_norm_fwd, _setup_context, _backward)


@registers
def _define() -> None:
    define("layer_norm_backward", _layer_norm_bwd)
    define("layer_norm", _layer_norm_fwd).register_autograd(_backward, setup_context=_setup_context)


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm of ``x`` over its last dim (arguments checked by ``fused_layers.ops.layer_norm``):
    the custom op when traced, else the autograd.Function."""
    return run_op("layer_norm", LayerNormFunction.apply, x, weight, bias, eps)[0]
