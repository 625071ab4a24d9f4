"""Fused linear cross-entropy on Triton and cuBLAS: the loss and every gradient, the logits never whole.

Names: ``N`` tokens (rows of ``hidden``), ``H`` hidden size, ``V`` vocabulary (rows of ``weight``),
``z = hidden @ weight.T + bias`` the (N, V) logits, capped to ``softcap * tanh(z / softcap)`` when
``softcap`` is set, ``y`` the labels, ``eps`` the label smoothing, ``s`` the loss scale (1 / counted
rows for a mean, 1 for a sum, 1 / num_items_in_batch). For a counted row (``y != ignore_index``)::

    lse  = log sum_j exp(z_j)
    loss = lse - (1 - eps) * z_y - eps / V * sum_j z_j                         (fp32, per row)
    g_j  = s * (exp(z_j - lse) - eps / V - (1 - eps) * [j == y]) * (1 - t_j**2)  (dloss/draw z_j)

with ``t = tanh(z_raw / softcap)`` (the last factor is 1 without a cap); ignored rows have
``loss = 0`` and ``g = 0``. Then ``grad_hidden = g @ weight``, ``grad_weight = g.T @ hidden`` and
``grad_bias = g.sum(0)``: three matrix products of ``2 N H V`` flops each, which dominate.

Gradients are computed in the forward, as Liger-Kernel does, so that the logits are made only once;
the backward multiplies them by the upstream gradient (free when it is 1). The peak memory is the
gradients themselves plus one buffer of at most ``N * slice_columns`` elements (``C * V`` when the
weight needs no gradient), in one of two layouts:

- **A buffer of its own** when a chunk of ``C = chunk_tokens`` tokens' logits fits that budget
  (``C * V <= N * slice_columns``: V = 32,000 at N = 8192). Per chunk: ``z_c = h_c @ W.T``, the
  cross-entropy kernels (the per-block log-sum-exp, then the gradient in place), ``grad_hidden_c
  = g_c @ W``, ``grad_weight += g_c.T @ h_c``, the bias gradient. Three products of ``2 N H V``.
- **The logits inside the weight gradient** otherwise (V = 128,256 and 151,936), since chunks of
  ``N * slice_columns / V`` tokens (Liger's ~``N H / V``: 128-256) are too few for the products:
  each chunk's update of the whole (V, H) weight gradient is then bound by memory, not arithmetic::

      grad_weight rows:  [ 0 ............. split | split ................ V )
      phase 1            accumulated per chunk  | scratch: the chunk's (C, V) logits live here
      phase 2            done                   | one product per vocabulary slice, all N tokens

  Phase 1 is the loop above, accumulating only ``grad_weight[:split]``; ``split ~ V * (1 - C / H)``
  leaves room for the chunk. Phase 2 makes the logits of all N tokens for each slice of
  ``slice_columns`` vocabulary rows from ``split`` on again (``lse`` is kept, so one pass makes the
  gradient) and writes ``grad_weight[slice] = g_slice.T @ hidden`` in one product over all tokens.
  Cost: ``3 + C / H`` products, at the sizes where they run near cuBLAS's rate.

The weight gradient is rounded to its dtype once per chunk (phase 1's rows) or once (phase 2's):
accumulating in fp32 would hold ``4 V H`` more bytes, more than Liger's whole peak
(``Schedule.accumulate_fp32`` measures it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import define, register_custom_ops, registers, traced
from fused_layers.backends.triton.language import tl, triton


@dataclass(frozen=True)
class Schedule:
    """How the work is cut. The defaults are the measured choice: H200, bf16, N = 8192, H = 2048,
    V = 32,000 / 128,256 / 151,936 (benchmarks/results/linear_cross_entropy.h200.md, 2026-11-25)."""

    chunk_tokens: int = 512
    """Tokens per chunk (C). Larger chunks make larger, faster products but, with the logits inside
    the weight gradient, move more of it into phase 2, whose products are paid twice (``3 + C / H``):
    256 / 512 / 1024 / 2048 took 29.1 / 25.6 / 26.5 / 29.9 ms at V = 128,256."""

    slice_columns: int = 2048
    """Phase 2's widest vocabulary slice; ``N * slice_columns`` elements bound the logits buffer.
    1024 took 26.4 ms at V = 128,256; 4096 took 25.8 with 31 MiB more, over Liger's peak."""

    accumulate_fp32: bool = False
    """Accumulate phase 1's weight-gradient rows in fp32 (one rounding instead of one per chunk):
    2.3x the peak memory and 14% slower at V = 128,256, for an error against fp32 math of 1.8e-3
    instead of 4.5e-3; off, for the memory bar."""

    block: int = 4096
    """Columns per block of the cross-entropy kernels (8 warps: 16 per thread)."""

    blocks_per_program: int = 4
    """Blocks per program of the gradient kernel, which so combines a row's block statistics once
    per 32 KiB of bf16 rather than per 8 KiB: 6.33 ms at V = 32,000 against 6.54 with 1."""


DEFAULT_SCHEDULE = Schedule()


@triton.jit
def _tanh(x):
    # 2 * sigmoid(2x) - 1: no libdevice tanh, which Triton's CPU interpreter lacks
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _block_stats_kernel(
    logits_ptr,  # (rows, V) input dtype, row stride stride_row: hidden @ weight.T without bias
    bias_ptr,  # (V,) bias dtype; unused unless HAS_BIAS
    labels_ptr,  # (rows,) int64
    block_lse_ptr,  # (rows, n_blocks) fp32: log of the sum of exp(z) over the block
    block_sum_ptr,  # (rows, n_blocks) fp32: sum of z over it; unused unless SMOOTHING
    target_logit_ptr,  # (rows,) fp32: z at the label, NaN for an ignored or out-of-range label
    stride_row,
    V,
    n_blocks,
    softcap,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
):
    # Program (row, block) covers columns block * BLOCK + [0, BLOCK). No load waits for the label
    # (ignored rows are read like the others) and one exp per element: at V = 128,256 this kernel
    # took 0.80 ms per step, 1.39 with loads masked by the label, 2.04 with a per-lane running max
    # over 4 blocks (two exps an element; profiles of runs 4 / 2 / 3, H200, 2026-11-25).
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    z = tl.load(logits_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        z = softcap * _tanh(z / softcap)
    z = tl.where(mask, z, float("-inf"))
    z_max = tl.max(z, axis=0)  # finite: every block holds a column
    out = row * n_blocks + block
    tl.store(block_lse_ptr + out, z_max + tl.log(tl.sum(tl.exp(z - z_max), axis=0)))
    if SMOOTHING:
        tl.store(block_sum_ptr + out, tl.sum(tl.where(mask, z, 0.0), axis=0))
    # The target logit: one scalar load, by the first block of the row.
    label = tl.load(labels_ptr + row)
    in_range = label.to(tl.uint64) < V  # negative labels (ignore_index) wrap to large
    target = tl.load(logits_ptr + row * stride_row + tl.where(in_range, label, 0)).to(tl.float32)
    if HAS_BIAS:
        target += tl.load(bias_ptr + tl.where(in_range, label, 0)).to(tl.float32)
    if HAS_SOFTCAP:
        target = softcap * _tanh(target / softcap)
    tl.store(target_logit_ptr + row, tl.where(in_range, target, float("nan")), mask=block == 0)


@triton.jit
def _logit_grad_kernel(
    logits_ptr,  # (rows, cols) input dtype, row stride stride_row; overwritten by g when WRITE_GRAD
    bias_ptr,  # (V,) bias dtype; unused unless HAS_BIAS
    labels_ptr,  # (rows,) int64
    lse_ptr,  # (rows,) fp32: written when FROM_BLOCKS and STORE_LSE, read when not FROM_BLOCKS
    block_lse_ptr,  # (rows, n_blocks) fp32; read when FROM_BLOCKS
    block_sum_ptr,  # (rows, n_blocks) fp32; read when FROM_BLOCKS and SMOOTHING
    target_loss_ptr,  # (rows,) fp32: the target logit in, the row's loss out, when FROM_BLOCKS
    scale_ptr,  # (1,) fp32: s; read when SCALE_IN_GRAD
    stride_row,
    col0,
    cols,
    V,
    n_blocks,
    ignore_index,
    label_smoothing,
    softcap,
    BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCKS_POW2: tl.constexpr,
    FROM_BLOCKS: tl.constexpr,
    STORE_LSE: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    SCALE_IN_GRAD: tl.constexpr,
):
    # Program (row, group) covers columns col0 + group * BLOCK * ITERS + [0, BLOCK * ITERS).
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    label = tl.load(labels_ptr + row)
    counted = label != ignore_index
    if FROM_BLOCKS:
        # Combine the row's block statistics (a few dozen floats, read by every program of the row).
        b = tl.arange(0, BLOCKS_POW2)
        b_mask = b < n_blocks
        b_lse = tl.load(block_lse_ptr + row * n_blocks + b, mask=b_mask, other=float("-inf"))
        lse_max = tl.max(b_lse, axis=0)
        lse = lse_max + tl.log(tl.sum(tl.exp(b_lse - lse_max), axis=0))
        # Only the row's first program reads the target logit and writes the loss in its place.
        # The target is NaN for an ignored row, or a label outside [0, V): the latter's loss stays NaN.
        first = group == 0
        loss = lse - (1.0 - label_smoothing) * tl.load(target_loss_ptr + row, mask=first, other=0.0)
        if SMOOTHING:
            z_sum = tl.sum(tl.load(block_sum_ptr + row * n_blocks + b, mask=b_mask, other=0.0), axis=0)
            loss -= label_smoothing / V * z_sum
        tl.store(target_loss_ptr + row, tl.where(counted, loss, 0.0), mask=first)
        if STORE_LSE:
            tl.store(lse_ptr + row, lse, mask=first)
    else:
        lse = tl.load(lse_ptr + row)
    if WRITE_GRAD:
        scale = tl.load(scale_ptr) if SCALE_IN_GRAD else 1.0
        for step in range(ITERS):
            local = (group * ITERS + step) * BLOCK + tl.arange(0, BLOCK)
            mask = local < cols
            col = col0 + local
            z = tl.load(logits_ptr + row * stride_row + local, mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                z += tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                t = _tanh(z / softcap)
                z = softcap * t
            grad = tl.exp(z - lse) - label_smoothing / V - tl.where(col == label, 1.0 - label_smoothing, 0.0)
            if HAS_SOFTCAP:
                grad *= 1.0 - t * t
            grad = tl.where(counted, grad * scale, 0.0)  # where, not a product: s is inf when no row counts
            tl.store(logits_ptr + row * stride_row + local, grad.to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_kernel(
    x_ptr,  # (n,) contiguous, any float dtype; multiplied in place
    factor_ptr,  # (1,) fp32
    n,
    BLOCK: tl.constexpr,
):
    factor = tl.load(factor_ptr)
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # A factor of exactly 1 (a loss's own backward) masks every load and store off: the launch
    # then costs microseconds instead of a pass over the (V, H) weight gradient, without a sync.
    mask = offsets < tl.where(factor != 1.0, n, 0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + offsets, (x * factor).to(x_ptr.dtype.element_ty), mask=mask)


def scale_in_place(x: Tensor, factor: Tensor) -> None:
    """``x *= factor`` for a contiguous ``x`` and a one-element fp32 ``factor``; nothing moves if it is 1."""
    n = x.numel()
    if n:
        block = 4096
        _scale_kernel[(triton.cdiv(n, block),)](x, factor, n, BLOCK=block, num_warps=8)


def _fp32_accumulate(out: Tensor, a: Tensor, b: Tensor, first: bool) -> None:
    """``out (=|+=) a @ b`` in fp32 from half-precision ``a`` and ``b``.

    On a GPU cuBLAS accumulates and writes fp32 itself (``out_dtype``), with no fp32 copies of
    ``a`` or ``b``; the CPU has no such product, and the copies are small at the sizes run there.
    """
    if out.is_cuda:
        torch.addmm(out, a, b, beta=0 if first else 1, out_dtype=torch.float32, out=out)
    else:
        out.addmm_(a.float(), b.float(), beta=0 if first else 1)


def _aligned_parts(vocab: int) -> tuple[slice, ...]:
    """``[0, V)`` split at the last multiple of 8, for the products with V as a dimension: cuBLAS
    runs a product whose V is odd (GPT-2's 50,257) in align1 kernels. The logits of 512 tokens at
    H = 768: 0.42 ms in one product, 0.07 ms in two (H200, 2026-11-25; Inductor pads instead)."""
    aligned = vocab // 8 * 8
    if aligned == vocab or aligned == 0:
        return (slice(0, vocab),)
    return slice(0, aligned), slice(aligned, vocab)


def _logits_product(hidden: Tensor, weight: Tensor, out: Tensor) -> None:
    """``out = hidden @ weight.T`` for (rows, H) and (V, H), by parts of V (`_aligned_parts`)."""
    for part in _aligned_parts(weight.shape[0]):
        torch.mm(hidden, weight[part].t(), out=out[:, part])


def _product_over_vocabulary(grad_logits: Tensor, weight: Tensor, out: Tensor) -> None:
    """``out = grad_logits @ weight`` for (rows, V) and (V, H): the reduction over V by parts
    (`_aligned_parts`), the second added to the first."""
    first, *rest = _aligned_parts(weight.shape[0])
    torch.mm(grad_logits[:, first], weight[first], out=out)
    for part in rest:
        out.addmm_(grad_logits[:, part], weight[part])


def _iters(schedule: Schedule, cols: int) -> int:
    """Steps per program for rows of ``cols`` columns: as many as asked, no more than the row needs."""
    return max(1, min(schedule.blocks_per_program, triton.cdiv(cols, schedule.block)))


def linear_cross_entropy_fwd(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    need_grad_hidden: bool,
    need_grad_weight: bool,
    need_grad_bias: bool,
    schedule: Schedule = DEFAULT_SCHEDULE,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Loss and the requested gradients of ``sum over counted rows of loss * scale``.

    ``hidden`` (N, H) and ``weight`` (V, H) share a float dtype, ``labels`` is (N,) int64,
    ``bias`` (V,) or None, ``scale`` a one-element fp32 tensor (s in the module docstring). Returns
    (loss as a 0-d fp32 tensor, grad_hidden, grad_weight, grad_bias), a gradient None where not
    requested. In fp16 the gradients leave out the factor s (``s * g`` of a mean over thousands of
    rows falls below fp16's smallest number for most vocabulary entries): the caller multiplies it in.
    """
    hidden, weight, labels = hidden.contiguous(), weight.contiguous(), labels.contiguous()
    n_tokens, width = hidden.shape
    vocab = weight.shape[0]
    device, dtype = hidden.device, hidden.dtype
    bias_arg = bias.contiguous() if bias is not None else hidden  # never read without HAS_BIAS
    grad_hidden = torch.empty_like(hidden) if need_grad_hidden else None
    grad_weight = torch.empty_like(weight) if need_grad_weight else None
    grad_bias = torch.zeros(vocab, dtype=torch.float32, device=device) if need_grad_bias else None
    need_grads = need_grad_hidden or need_grad_weight or need_grad_bias

    chunk = max(1, min(n_tokens, schedule.chunk_tokens))
    # The logits' row stride: V rounded up to 8 elements, so that every row starts 16-byte aligned
    # (cuBLAS's requirement for its tensor-core kernels); the padding columns are never read.
    row = -(-vocab // 8) * 8
    # Where phase 1 stops when the chunk's logits live in grad_weight[split:] (which phase 1 leaves
    # unwritten): a multiple of 8, which keeps the logits 16-byte aligned and gives phase 1's
    # weight-gradient product a row count cuBLAS runs faster (GPT-2's V = 50,257, H = 768: 0.84 ms
    # a call of the op at 16,747 rows, 0.47 at 16,744; H200, 2026-11-25). Negative when the logits
    # do not fit (a chunk about as wide as H or wider).
    split = (vocab - -(-chunk * row // width)) // 8 * 8
    if grad_weight is not None and chunk * row > n_tokens * schedule.slice_columns and split >= 0:
        logits_buffer = grad_weight[split:].view(-1)[: chunk * row].view(chunk, row)[:, :vocab]
    else:
        # A chunk within phase 2's slice budget (a small vocabulary), logits that do not fit after
        # split, or no weight gradient: a buffer of its own, and phase 1 does every row. At
        # V = 32,000 phase 2's kernels took 0.78 ms, accumulating its rows in phase 1 0.77 (H200
        # profiles, 2026-11-25); this layout has the fewer launches.
        split = vocab
        logits_buffer = torch.empty(chunk, row, dtype=dtype, device=device)[:, :vocab]

    block = schedule.block
    n_blocks = triton.cdiv(vocab, block)
    block_lse = torch.empty(chunk, n_blocks, dtype=torch.float32, device=device)
    block_sum = torch.empty_like(block_lse) if label_smoothing else block_lse
    # The chunk's target logits, then its rows' losses, summed per chunk; the rows' lse kept only
    # for phase 2. With both per token, the peak at V = 32,000 was 60 KB over Liger's (H200, 2026-11-25).
    target_loss = torch.empty(chunk, dtype=torch.float32, device=device)
    n_chunks = triton.cdiv(n_tokens, chunk)
    chunk_loss = torch.empty(n_chunks, dtype=torch.float32, device=device)
    store_lse = grad_weight is not None and split < vocab
    lse = torch.empty(n_tokens, dtype=torch.float32, device=device) if store_lse else target_loss
    cap = float(softcap) if softcap is not None else 1.0
    meta = dict(
        BLOCK=block,
        HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None,
        SMOOTHING=label_smoothing != 0.0,
        num_warps=8,
    )
    scale_in_grad = dtype != torch.float16
    accumulator = None
    if grad_weight is not None and split > 0 and schedule.accumulate_fp32 and dtype != torch.float32:
        accumulator = torch.empty(split, width, dtype=torch.float32, device=device)

    iters = _iters(schedule, vocab)
    for start in range(0, n_tokens, chunk):
        rows = min(chunk, n_tokens - start)
        hidden_chunk = hidden[start : start + rows]
        logits = logits_buffer[:rows]
        _logits_product(hidden_chunk, weight, logits)
        _block_stats_kernel[(rows, n_blocks)](
            logits, bias_arg, labels[start:], block_lse, block_sum, target_loss,
            logits.stride(0), vocab, n_blocks, cap, **meta,
        )  # fmt: skip
        _logit_grad_kernel[(rows, triton.cdiv(vocab, block * iters) if need_grads else 1)](
            logits, bias_arg, labels[start:], lse[start:] if store_lse else lse,
            block_lse, block_sum, target_loss, scale,
            logits.stride(0), 0, vocab, vocab, n_blocks, ignore_index, label_smoothing, cap,
            ITERS=iters, BLOCKS_POW2=triton.next_power_of_2(n_blocks), FROM_BLOCKS=True,
            STORE_LSE=store_lse, WRITE_GRAD=need_grads, SCALE_IN_GRAD=scale_in_grad, **meta,
        )  # fmt: skip
        torch.sum(target_loss[:rows], 0, out=chunk_loss[start // chunk])
        if grad_hidden is not None:
            _product_over_vocabulary(logits, weight, grad_hidden[start : start + rows])
        if accumulator is not None:
            _fp32_accumulate(accumulator, logits[:, :split].t(), hidden_chunk, first=start == 0)
        elif grad_weight is not None and split > 0:
            head = logits[:, :split].t()
            if start == 0:
                torch.mm(head, hidden_chunk, out=grad_weight[:split])
            else:
                grad_weight[:split].addmm_(head, hidden_chunk)
        if grad_bias is not None:
            grad_bias += logits.sum(0, dtype=torch.float32)
    if accumulator is not None:
        grad_weight[:split].copy_(accumulator)
        del accumulator

    if grad_weight is not None and split < vocab:
        # Equal slices no wider than slice_columns, rounded up to 8 columns: a row stride that is
        # not a multiple of 16 bytes sent cuBLAS to kernels 2-3x slower (H200, 2026-11-25).
        n_slices = triton.cdiv(vocab - split, max(8, schedule.slice_columns))
        columns = triton.cdiv(triton.cdiv(vocab - split, n_slices), 8) * 8
        slice_buffer = torch.empty(n_tokens, columns, dtype=dtype, device=device)
        for col0 in range(split, vocab, columns):
            cols = min(columns, vocab - col0)
            logits = slice_buffer[:, :cols]  # the last slice keeps the aligned row stride
            _logits_product(hidden, weight[col0 : col0 + cols], logits)
            iters = _iters(schedule, cols)
            _logit_grad_kernel[(n_tokens, triton.cdiv(cols, block * iters))](
                logits, bias_arg, labels, lse, block_lse, block_sum, target_loss, scale,
                logits.stride(0), col0, cols, vocab, n_blocks, ignore_index, label_smoothing, cap,
                ITERS=iters, BLOCKS_POW2=1, FROM_BLOCKS=False, STORE_LSE=False, WRITE_GRAD=True,
                SCALE_IN_GRAD=scale_in_grad, **meta,
            )  # fmt: skip
            torch.mm(logits.t(), hidden, out=grad_weight[col0 : col0 + cols])

    loss = chunk_loss.sum() * scale[0]
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return loss, grad_hidden, grad_weight, grad_bias


# ---- the custom op ------------------------------------------------------------------------------
#
# ``fused_layers::linear_cross_entropy`` returns (loss, grad_hidden, grad_weight, grad_bias): the
# gradients are made in the forward and its backward multiplies them by the upstream gradient, in
# place when eager (no second (V, H) tensor, and nothing moves when that gradient is 1), as a
# product when traced (Inductor reuses the saved gradient's memory: the compiled op's peak equalled
# the eager one's on an H200, 2026-11-25). A second backward through the same graph is refused.
# Eager calls go through the custom op too: its dispatch, tens of microseconds, is under 1% of the
# op at the sizes it is for.


def _op_forward(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    need_grad_hidden: bool,
    need_grad_weight: bool,
    need_grad_bias: bool,
    chunk_tokens: int,
    slice_columns: int,
    accumulate_fp32: bool,
    block: int,
    blocks_per_program: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The custom op's body: (loss, grad_hidden, grad_weight, grad_bias), a gradient not asked for empty."""
    schedule = Schedule(chunk_tokens, slice_columns, accumulate_fp32, block, blocks_per_program)
    loss, grad_hidden, grad_weight, grad_bias = linear_cross_entropy_fwd(
        hidden, weight, labels, bias, scale, ignore_index, label_smoothing, softcap,
        need_grad_hidden, need_grad_weight, need_grad_bias, schedule,
    )  # fmt: skip
    empty = hidden.new_empty(0)
    return (
        loss,
        grad_hidden if grad_hidden is not None else empty,
        grad_weight if grad_weight is not None else empty.clone(),
        grad_bias if grad_bias is not None else empty.clone(),
    )


def _op_fake(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    need_grad_hidden: bool,
    need_grad_weight: bool,
    need_grad_bias: bool,
    chunk_tokens: int,
    slice_columns: int,
    accumulate_fp32: bool,
    block: int,
    blocks_per_program: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Shapes and dtypes of the op's outputs."""

    def like(tensor: Tensor | None, needed: bool) -> Tensor:
        if tensor is None or not needed:
            return hidden.new_empty(0)
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)

    loss = hidden.new_empty((), dtype=torch.float32)
    return loss, like(hidden, need_grad_hidden), like(weight, need_grad_weight), like(bias, need_grad_bias)


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, ...]) -> None:
    _, grad_hidden, grad_weight, grad_bias = output
    ctx.mark_non_differentiable(grad_hidden, grad_weight, grad_bias)
    ctx.set_materialize_grads(False)  # else the backward gets zero (V, H) grads for those outputs
    hidden, scale, needs = inputs[0], inputs[4], inputs[8:11]
    ctx.needs = needs
    # fp16 gradients come without the loss scale s (linear_cross_entropy_fwd): the backward multiplies it in
    ctx.scale_pending = hidden.dtype == torch.float16
    ctx.save_for_backward(grad_hidden, grad_weight, grad_bias, scale)
    ctx.backward_done = False


def _backward(ctx: Any, grad_loss: Tensor | None, *_: Any) -> tuple:
    """Each saved gradient times grad_output (times s in fp16); None for the other inputs."""
    grads = list(ctx.saved_tensors[:3])
    scale = ctx.saved_tensors[3]
    if grad_loss is None:
        return (None,) * 16
    factor = grad_loss.detach().to(torch.float32).reshape(1)
    if ctx.scale_pending:
        # s is inf when no row counts; the gradients are 0 then, as F.cross_entropy's are
        factor = factor * torch.nan_to_num(scale, posinf=0.0)
    if traced(grad_loss):
        grads = [
            (grad * factor).to(grad.dtype) if need else None
            for grad, need in zip(grads, ctx.needs, strict=True)
        ]
    else:
        if ctx.backward_done:
            raise RuntimeError(
                "linear_cross_entropy: a second backward through the same graph is not supported "
                "(its gradients were made in the forward and scaled in place by the first)"
            )
        ctx.backward_done = True
        factor = factor.contiguous()
        for grad, need in zip(grads, ctx.needs, strict=True):
            if need:
                scale_in_place(grad, factor)
        grads = [grad if need else None for grad, need in zip(grads, ctx.needs, strict=True)]
    grad_hidden, grad_weight, grad_bias = grads
    return (grad_hidden, grad_weight, None, grad_bias) + (None,) * 12


@registers
def _define() -> None:
    op = define("linear_cross_entropy", _op_forward, _op_fake)
    op.register_autograd(_backward, setup_context=_setup_context)


def _loss_scale(labels: Tensor, ignore_index: int, reduction: str, num_items_in_batch: Any) -> Tensor:
    """s: d(loss)/d(row loss) for a counted row, as a one-element fp32 tensor on the labels' device.

    No host sync: a count or divisor already on the device stays there, a Python number is filled in.
    """
    if isinstance(num_items_in_batch, Tensor):
        return torch.reciprocal(num_items_in_batch.to(labels.device, torch.float32).reshape(1))
    if num_items_in_batch is not None:
        inverse = 1.0 / num_items_in_batch if num_items_in_batch else float("inf")
        return torch.full((1,), inverse, dtype=torch.float32, device=labels.device)
    if reduction == "sum":
        return torch.ones(1, dtype=torch.float32, device=labels.device)
    return torch.reciprocal((labels != ignore_index).sum().to(torch.float32).reshape(1))


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
    num_items_in_batch: int | float | Tensor | None,
    schedule: Schedule | None,
    weight_grad_fp32: bool = False,
) -> Tensor:
    """The loss through ``fused_layers::linear_cross_entropy`` (arguments checked and cast by
    ``fused_layers.ops.linear_cross_entropy``; ``num_items_in_batch`` a number or a tensor on
    hidden's device); a 0-d fp32 tensor. ``schedule``: :data:`DEFAULT_SCHEDULE` when None.

    ``weight_grad_fp32`` (the weight was fp32 before autocast: mixed precision's master weights)
    makes phase 1 accumulate in fp32 and round once, as Hugging Face's one product rounds: the
    gradient is fp32 anyway. Accumulated in bf16 per chunk, GPT-2 124M's loss curve under
    ``trainprof ab`` (fp32 parameters, bf16 autocast) missed the unswapped run's loss spike at
    step 24 that every other variant showed (H200, 2026-11-25: max rel diff 0.27, 0.038 allowed).
    """
    schedule = schedule or DEFAULT_SCHEDULE
    if weight_grad_fp32 and not schedule.accumulate_fp32:
        schedule = dataclasses.replace(schedule, accumulate_fp32=True)
    labels_1d = labels.reshape(-1).to(torch.int64)
    scale = _loss_scale(labels_1d, ignore_index, reduction, num_items_in_batch)
    grad_on = torch.is_grad_enabled()
    register_custom_ops()
    loss, *_ = torch.ops.fused_layers.linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels_1d, bias, scale, ignore_index,
        float(label_smoothing), None if softcap is None else float(softcap),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
        grad_on and bias is not None and bias.requires_grad,
        schedule.chunk_tokens, schedule.slice_columns, schedule.accumulate_fp32, schedule.block,
        schedule.blocks_per_program,
    )  # fmt: skip
    return loss
