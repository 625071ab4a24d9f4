"""The last step of a norm backward: the per-program partial sums of dweight (and dbias), summed.

The persistent backward kernels leave one fp32 row of partial sums per program, (P, K, N) for K
parameter gradients of width N. One small kernel sums them over P and writes each gradient in its
parameter's dtype: a single launch where ``partial.sum(0).to(dtype)`` took a reduction and a cast
(two launches and two kernels; on an H200 the reduction alone took 6 µs a call at P=264, N=2048).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fused_layers.backends.triton.language import tl, triton
from fused_layers.backends.triton.launch import launch

# Columns per program: narrow, so that even a 1024-wide norm's 2048 columns give 64 programs to
# spread the (up to a few MB of) partials over the SMs; BLOCK_P rows of them are loaded at once.
BLOCK_C = 32
BLOCK_P = 128
WARPS = 4


@triton.jit
def _sum_partials_kernel(
    partial_ptr,  # (P, C) fp32, contiguous: the partial sums, C = K * N
    out_ptr,  # (C,) contiguous, the gradients' dtype
    P,
    C,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + rows[:, None].to(tl.int64) * C + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_mask)


def sum_partials(partial: Tensor, dtype: torch.dtype) -> Tensor:
    """``partial.sum(0).to(dtype)`` for a contiguous fp32 (P, ...) tensor, in one launch."""
    out = torch.empty(partial.shape[1:], dtype=dtype, device=partial.device)
    columns = out.numel()
    if columns == 0:
        return out
    if partial.shape[0] == 0:
        return out.zero_()
    launch(
        _sum_partials_kernel, (triton.cdiv(columns, BLOCK_C),), (partial, out, partial.shape[0], columns),
        BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=WARPS,
    )  # fmt: skip
    return out
