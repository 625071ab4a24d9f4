"""LayerNorm over the last dim: Triton forward and backward kernels, launchers, one autograd.Function.

Rows up to ``MAX_FUSED_WIDTH`` wide are held in registers in one block (narrow rows packed
several to a program); wider rows take a looped path that walks the row in chunks. The
backward recomputes x_hat from x and the saved fp32 mean/rstd, and sums dweight/dbias per
program over many rows (see ``persistent_programs``) before a small torch reduction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from fused_layers.ops import _launch
from fused_layers.ops._dispatch import cuda_extension, resolve_backend


@triton.jit
def _layer_norm_fwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    mean_ptr,  # (M,) fp32
    rstd_ptr,  # (M,) fp32
    x_row_stride,
    M,
    N,
    eps,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    # two-pass variance on the registers: no E[x^2] - mean^2 cancellation
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _layer_norm_fwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride, unit column stride
    y_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    mean_ptr,  # (M,) fp32
    rstd_ptr,  # (M,) fp32
    x_row_stride,
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
        acc += tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        xc = tl.where(cols < N, x - mean, 0.0)
        acc += xc * xc
    rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layer_norm_bwd_fused(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    mean_ptr,  # (M,) fp32
    rstd_ptr,  # (M,) fp32
    dw_partial_ptr,  # (num_programs, N) fp32; unused unless COMPUTE_DW
    db_partial_ptr,  # (num_programs, N) fp32; unused unless COMPUTE_DB
    x_row_stride,
    dy_row_stride,
    M,
    N,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
):
    # Persistent: program p handles row tiles p, p + P, p + 2P, ... and keeps its dweight/dbias
    # sums in registers, writing one (N,) partial row each at the end. The sums stay (ROWS,
    # BLOCK_N) until then: summing over the tile's rows every iteration is a cross-warp
    # reduction (shared memory and a barrier) that made the narrow-row backward 2-3x slower.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for tile in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = tl.cast(tile, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
        else:
            wdy = dy
        c1 = tl.sum(x_hat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (x_hat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * N + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * x_hat
        if COMPUTE_DB:
            db_acc += dy
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if COMPUTE_DB:
        tl.store(db_partial_ptr + pid * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _layer_norm_bwd_looped(
    x_ptr,  # (M, N) input dtype, row stride x_row_stride
    dy_ptr,  # (M, N) grad dtype, row stride dy_row_stride
    dx_ptr,  # (M, N) contiguous, input dtype
    w_ptr,  # (N,) weight; unused unless HAS_WEIGHT
    mean_ptr,  # (M,) fp32
    rstd_ptr,  # (M,) fp32
    dw_partial_ptr,  # (num_programs, N) fp32, zero-filled; unused unless COMPUTE_DW
    db_partial_ptr,  # (num_programs, N) fp32, zero-filled; unused unless COMPUTE_DB
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
    dw_row = dw_partial_ptr + pid * N
    db_row = db_partial_ptr + pid * N
    for row in range(pid, M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * x_row_stride
        dy_row = dy_ptr + tl.cast(row, tl.int64) * dy_row_stride
        dx_row = dx_ptr + tl.cast(row, tl.int64) * N
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            x_hat = tl.where(col_mask, (x - mean) * rstd, 0.0)
            if HAS_WEIGHT:
                dy = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            acc1 += x_hat * dy
            acc2 += dy
        c1 = tl.sum(acc1, axis=0) / N
        c2 = tl.sum(acc2, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            x_hat = tl.where(col_mask, (x - mean) * rstd, 0.0)
            if HAS_WEIGHT:
                wdy = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            else:
                wdy = dy
            dx = (wdy - (x_hat * c1 + c2)) * rstd
            tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
            if COMPUTE_DW:
                tl.store(dw_row + cols, tl.load(dw_row + cols, mask=col_mask) + dy * x_hat, mask=col_mask)
            if COMPUTE_DB:
                tl.store(db_row + cols, tl.load(db_row + cols, mask=col_mask) + dy, mask=col_mask)


def _layer_norm_forward(
    x2d: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the forward on (M, N) rows; returns y (M, N) and fp32 mean, rstd (M,)."""
    n_rows, width = x2d.shape
    y = torch.empty((n_rows, width), dtype=x2d.dtype, device=x2d.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x2d.device)
    rstd = torch.empty_like(mean)
    if n_rows == 0:
        return y, mean, rstd
    # a dummy pointer for an absent weight/bias; the kernel never reads it (constexpr flag)
    w_arg = weight if weight is not None else x2d
    b_arg = bias if bias is not None else x2d
    if width <= _launch.MAX_FUSED_WIDTH:
        rows, block_n, num_warps = _launch.row_tile(n_rows, width)
        _layer_norm_fwd_fused[(triton.cdiv(n_rows, rows),)](
            x2d, y, w_arg, b_arg, mean, rstd, x2d.stride(0), n_rows, width, eps,
            ROWS=rows, BLOCK_N=block_n, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            num_warps=num_warps,
        )  # fmt: skip
    else:
        _layer_norm_fwd_looped[(n_rows,)](
            x2d, y, w_arg, b_arg, mean, rstd, x2d.stride(0), width, eps,
            BLOCK_N=_launch.LOOP_BLOCK, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            num_warps=_launch.loop_warps(),
        )  # fmt: skip
    return y, mean, rstd


def _layer_norm_backward(
    x2d: Tensor,
    dy2d: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    compute_dw: bool,
    compute_db: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Launch the backward; returns dx (M, N) and dweight, dbias summed to (N,) fp32 (or None)."""
    n_rows, width = x2d.shape
    dx = torch.empty((n_rows, width), dtype=x2d.dtype, device=x2d.device)
    if n_rows == 0:
        zeros = torch.zeros(width, dtype=torch.float32, device=x2d.device)
        return dx, zeros if compute_dw else None, zeros if compute_db else None
    fused = width <= _launch.MAX_FUSED_WIDTH
    if fused:
        rows, block_n, num_warps = _launch.row_tile(n_rows, width, backward=True)
        programs = _launch.persistent_programs(triton.cdiv(n_rows, rows), num_warps, x2d.device)
    else:
        num_warps = _launch.loop_warps()
        programs = _launch.persistent_programs(n_rows, num_warps, x2d.device)
    # The fused kernel writes every partial row once; the looped one adds into them.
    alloc = torch.empty if fused else torch.zeros
    dw_partial = alloc((programs, width) if compute_dw else (1,), dtype=torch.float32, device=x2d.device)
    db_partial = alloc((programs, width) if compute_db else (1,), dtype=torch.float32, device=x2d.device)
    w_arg = weight if weight is not None else x2d
    common = dict(
        HAS_WEIGHT=weight is not None, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, num_warps=num_warps
    )
    if fused:
        _layer_norm_bwd_fused[(programs,)](
            x2d, dy2d, dx, w_arg, mean, rstd, dw_partial, db_partial,
            x2d.stride(0), dy2d.stride(0), n_rows, width, ROWS=rows, BLOCK_N=block_n, **common,
        )  # fmt: skip
    else:
        _layer_norm_bwd_looped[(programs,)](
            x2d, dy2d, dx, w_arg, mean, rstd, dw_partial, db_partial,
            x2d.stride(0), dy2d.stride(0), n_rows, width, BLOCK_N=_launch.LOOP_BLOCK, **common,
        )  # fmt: skip
    dw = dw_partial.sum(0) if compute_dw else None
    db = db_partial.sum(0) if compute_db else None
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim with Triton forward and backward; saves x, mean and rstd."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
        x2d = _launch.as_rows(x)
        y, mean, rstd = _layer_norm_forward(x2d, weight, bias, eps)
        ctx.save_for_backward(x2d, weight, bias, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        x2d, weight, bias, mean, rstd = ctx.saved_tensors
        compute_dw = weight is not None and ctx.needs_input_grad[1]
        compute_db = bias is not None and ctx.needs_input_grad[2]
        dy2d = _launch.as_rows(dy)
        dx, dw, db = _layer_norm_backward(x2d, dy2d, weight, mean, rstd, compute_dw, compute_db)
        return (
            dx.view(dy.shape),
            dw.to(weight.dtype) if dw is not None else None,
            db.to(bias.dtype) if db is not None else None,
            None,
        )


def layer_norm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    backend: str | None = None,
) -> Tensor:
    """LayerNorm of ``x`` over its last dim, like ``F.layer_norm(x, (N,), weight, bias, eps)``.

    ``weight`` and ``bias`` are optional, of shape (N,). ``backend`` is None
    (``DEFAULT_BACKEND["layer_norm"]``), "triton", "torch" or "cuda". Statistics are fp32;
    the output has x's dtype and shape.
    """
    width = x.shape[-1]
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and param.shape != (width,):
            raise ValueError(f"layer_norm: {name} must have shape ({width},), got {tuple(param.shape)}")
    tensors = [t for t in (x, weight, bias) if t is not None]
    choice = resolve_backend("layer_norm", backend, *tensors)
    if choice == "torch":
        return F.layer_norm(x, (width,), weight, bias, eps)
    if choice == "cuda":
        return cuda_extension().layer_norm(x, weight, bias, eps)
    return LayerNormFunction.apply(x, weight, bias, eps)
