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
the backward multiplies them by the upstream gradient (free when it is 1). Two phases bound the
memory to the gradients themselves plus an (N, ``slice_columns``) slice:

    grad_weight rows:  [ 0 ............. split | split ................ V )
    phase 1            accumulated per chunk  | scratch: the chunk's (C, V) logits live here
    phase 2            done                   | one product per vocabulary slice, all N tokens

- **Phase 1**, token chunks of ``C`` rows: ``z_c = h_c @ W.T`` into the rows of ``grad_weight``
  that phase 1 does not write, the cross-entropy kernels (two passes over the chunk's logits: the
  per-block max and sum of exponentials, then the gradient in place), ``grad_hidden_c = g_c @ W``,
  ``grad_weight[:split] += g_c[:, :split].T @ h_c`` and the bias gradient. ``lse`` is kept.
- **Phase 2**, slices of ``slice_columns`` vocabulary rows from ``split`` on: the logits of all N
  tokens for the slice again (``lse`` is known, so one pass makes the gradient), then
  ``grad_weight[slice] = g_slice.T @ hidden`` in a single product over all N tokens.

``split`` is chosen so that a ``C``-token chunk of logits fits in ``grad_weight[split:]``:
``(V - split) * H >= C * V``, i.e. ``split ~ V * (1 - C / H)``. The cost is ``3 + C / H``
products of ``2 N H V`` (phase 2 makes its logits a second time) for chunks of ``C`` tokens at
any vocabulary size; Liger's chunks hold about ``N H / V`` tokens (256 at V = 128,256), few
enough that each chunk's update of the whole (V, H) weight gradient is bound by memory, not
arithmetic. The weight gradient's rows below ``split`` are rounded to its dtype once per
chunk, those above it once: accumulating in fp32 instead would hold ``4 V H`` more bytes (1 GiB
at V = 128,256, H = 2048), more than Liger's whole peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fused_layers.ops._triton import tl, triton


@dataclass(frozen=True)
class Schedule:
    """How the work is cut. The defaults were chosen on an H200 (benchmarks/linear_cross_entropy.py,
    bf16, N = 8192, H = 2048, V = 32,000 / 128,256 / 151,936; BENCHMARKS.md)."""

    chunk_tokens: int = 512
    """Phase 1's tokens per chunk (C). Larger chunks make larger, faster matrix products and move
    more of the weight gradient into phase 2, whose products are paid twice (cost ``3 + C / H``);
    256 / 512 / 1024 / 2048 took 29.1 / 25.1 / 26.2 / 29.2 ms at V = 128,256 (2026-11-25)."""

    slice_columns: int = 2048
    """Phase 2's widest vocabulary slice; its logits buffer is ``N * slice_columns`` elements.
    4096 was 0.2% faster and 32 MiB larger, over Liger's peak (2026-11-25)."""

    accumulate_fp32: bool = False
    """Accumulate phase 1's weight-gradient rows in fp32 (one rounding instead of one per chunk),
    for ``4 * split * H`` more bytes at the peak: 2.2x the memory and 15% slower at V = 128,256
    (2026-11-25), so off by default; the weight gradient's error against fp32 math was 4.5e-3
    either way, the bf16 rounding of the logits' gradient dominating."""

    block: int = 4096
    """Columns per step of the cross-entropy kernels (8 warps: 16 per thread)."""

    blocks_per_program: int = 4
    """Blocks per program of the gradient kernel, which streams ``block * blocks_per_program``
    columns of one row: its row statistics are combined once per 32 KiB of bf16 rather than per
    8 KiB (1.80 ms against 2.05 for that kernel at V = 128,256, 2026-11-25)."""


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
    block_max_ptr,  # (rows, n_blocks) fp32: max of z over the block
    block_sumexp_ptr,  # (rows, n_blocks) fp32: sum of exp(z - block max) over it
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
    # (ignored rows are read like the others): that wait would add a load's latency to each program.
    # One exp per element: a per-lane running max across several blocks (two exps) measured slower.
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
    tl.store(block_max_ptr + out, z_max)
    tl.store(block_sumexp_ptr + out, tl.sum(tl.exp(z - z_max), axis=0))
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
    lse_ptr,  # (rows,) fp32: written when FROM_BLOCKS, read otherwise
    loss_ptr,  # (rows,) fp32: written when FROM_BLOCKS
    block_max_ptr,  # (rows, n_blocks) fp32; read when FROM_BLOCKS
    block_sumexp_ptr,  # (rows, n_blocks) fp32; read when FROM_BLOCKS
    block_sum_ptr,  # (rows, n_blocks) fp32; read when FROM_BLOCKS and SMOOTHING
    target_logit_ptr,  # (rows,) fp32; read when FROM_BLOCKS
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
        b_max = tl.load(block_max_ptr + row * n_blocks + b, mask=b_mask, other=float("-inf"))
        b_sumexp = tl.load(block_sumexp_ptr + row * n_blocks + b, mask=b_mask, other=0.0)
        row_max = tl.max(b_max, axis=0)
        lse = row_max + tl.log(tl.sum(b_sumexp * tl.exp(b_max - row_max), axis=0))
        # target_logit is NaN for an ignored row, or a label outside [0, V): the latter's loss stays NaN
        loss = lse - (1.0 - label_smoothing) * tl.load(target_logit_ptr + row)
        if SMOOTHING:
            z_sum = tl.sum(tl.load(block_sum_ptr + row * n_blocks + b, mask=b_mask, other=0.0), axis=0)
            loss -= label_smoothing / V * z_sum
        first = group == 0
        tl.store(lse_ptr + row, lse, mask=first)
        tl.store(loss_ptr + row, tl.where(counted, loss, 0.0), mask=first)
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
    lse = torch.empty(n_tokens, dtype=torch.float32, device=device)
    row_loss = torch.empty(n_tokens, dtype=torch.float32, device=device)
    grad_hidden = torch.empty_like(hidden) if need_grad_hidden else None
    grad_weight = torch.empty_like(weight) if need_grad_weight else None
    grad_bias = torch.zeros(vocab, dtype=torch.float32, device=device) if need_grad_bias else None
    need_grads = need_grad_hidden or need_grad_weight or need_grad_bias

    chunk = max(1, min(n_tokens, schedule.chunk_tokens))
    if grad_weight is not None and chunk * vocab > n_tokens * schedule.slice_columns and chunk <= width:
        # The chunk's logits live in grad_weight[split:], which phase 1 leaves unwritten; split
        # keeps them 16-byte aligned (cuBLAS takes slower kernels otherwise).
        split = vocab - -(-chunk * vocab // width)
        while split * width * hidden.element_size() % 16:
            split -= 1
        logits_buffer = grad_weight[split:].view(-1)[: chunk * vocab].view(chunk, vocab)
    else:
        # A chunk within phase 2's slice budget (a small vocabulary) or no weight gradient: a
        # buffer of its own, and phase 1 does every row, its products the cheaper (at V = 32,000
        # the phase-2 products took 0.8 ms, accumulating those rows in phase 1 0.45).
        split = vocab
        logits_buffer = torch.empty(chunk, vocab, dtype=dtype, device=device)

    block = schedule.block
    n_blocks = triton.cdiv(vocab, block)
    block_max = torch.empty(chunk, n_blocks, dtype=torch.float32, device=device)
    block_sumexp = torch.empty_like(block_max)
    block_sum = torch.empty_like(block_max) if label_smoothing else block_max
    target_logit = torch.empty(chunk, dtype=torch.float32, device=device)
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
        torch.mm(hidden_chunk, weight.t(), out=logits)
        _block_stats_kernel[(rows, n_blocks)](
            logits, bias_arg, labels[start:], block_max, block_sumexp, block_sum, target_logit,
            logits.stride(0), vocab, n_blocks, cap, **meta,
        )  # fmt: skip
        _logit_grad_kernel[(rows, triton.cdiv(vocab, block * iters) if need_grads else 1)](
            logits, bias_arg, labels[start:], lse[start:], row_loss[start:],
            block_max, block_sumexp, block_sum, target_logit, scale,
            logits.stride(0), 0, vocab, vocab, n_blocks, ignore_index, label_smoothing, cap,
            ITERS=iters, BLOCKS_POW2=triton.next_power_of_2(n_blocks), FROM_BLOCKS=True,
            WRITE_GRAD=need_grads, SCALE_IN_GRAD=scale_in_grad, **meta,
        )  # fmt: skip
        if grad_hidden is not None:
            torch.mm(logits, weight, out=grad_hidden[start : start + rows])
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
        # not a multiple of 16 bytes sends cuBLAS to kernels 2-3x slower (seen on an H200, 2026-11-25).
        n_slices = triton.cdiv(vocab - split, max(8, schedule.slice_columns))
        columns = triton.cdiv(triton.cdiv(vocab - split, n_slices), 8) * 8
        slice_buffer = torch.empty(n_tokens * columns, dtype=dtype, device=device)
        for col0 in range(split, vocab, columns):
            cols = min(columns, vocab - col0)
            logits = slice_buffer[: n_tokens * cols].view(n_tokens, cols)
            torch.mm(hidden, weight[col0 : col0 + cols].t(), out=logits)
            iters = _iters(schedule, cols)
            _logit_grad_kernel[(n_tokens, triton.cdiv(cols, block * iters))](
                logits, bias_arg, labels, lse, row_loss,
                block_max, block_sumexp, block_sum, target_logit, scale,
                logits.stride(0), col0, cols, vocab, n_blocks, ignore_index, label_smoothing, cap,
                ITERS=iters, BLOCKS_POW2=1, FROM_BLOCKS=False, WRITE_GRAD=True,
                SCALE_IN_GRAD=scale_in_grad, **meta,
            )  # fmt: skip
            torch.mm(logits.t(), hidden, out=grad_weight[col0 : col0 + cols])

    loss = row_loss.sum() * scale[0]
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return loss, grad_hidden, grad_weight, grad_bias
