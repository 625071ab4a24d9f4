"""Rotary position embedding with Hugging Face's ``rotate_half`` in Triton: one kernel for q and k
together each way, one autograd.Function.

Matches ``transformers``' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (Llama, Mistral,
Qwen2, Qwen3): ``q_embed = q * cos + rotate_half(q) * sin`` with ``cos``/``sin`` unsqueezed at
``unsqueeze_dim``, the same for k. With x = [x1, x2] split in halves of the head dim and cos, sin
split alike into [c1, c2], [s1, s2] (``rotate_half(x) = [-x2, x1]``):

    y1 = x1 * c1 - x2 * s1            y2 = x2 * c2 + x1 * s2

Each output is linear in x, so the backward is the transposed map, applied to dy:

    dx1 = dy1 * c1 + dy2 * s2         dx2 = dy2 * c2 - dy1 * s1

cos and sin take no gradient (Hugging Face computes them under ``no_grad``); when either requires
one, the plain torch version runs (:func:`covers`). The backward needs cos and sin only, not q or k.

Memory-bound: one program per block of positions (b, t..t+BLOCK_T) loads their cos and sin rows
once and applies them to every head of q and of k, reading each element of q and k once and
writing it once.
q and k may be any strided views (Hugging Face passes ``view(...).transpose(1, 2)``): the kernel
takes their strides, nothing is copied, and the outputs keep the inputs' memory layout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import eager_function, registers, run_op
from fused_layers.backends.triton.language import tl, triton
from fused_layers.backends.triton.launch import define, launch

# The dtypes the kernel loads and stores (it computes in fp32); others take the torch version.
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Elements of each half in one program's tile (BLOCK_T positions x BLOCK_H heads x BLOCK_HALF);
# positions fill the tile after the heads, and more heads than fit loop. Small programs won:
# benchmarks/rope_sweep.py on an H200 (2026-11-24, bf16, kernel time from the profiler, % of copy
# bandwidth over the fewest bytes, forward / backward): at 256 (Llama-3.2-1B's 32 q heads of 64
# take 4 loops of 8 heads, one warp) 87 / 87% at B4 x T2048, 89 / 89% with head_dim 128, 103 /
# 104% at 16 heads (partly from L2); at 512 84 / 84, 92 / 92, 93 / 94; at 2048 73 / 73, 75 / 75,
# 85 / 86; at 128 80-100.
MAX_TILE = 256
# About 8 elements of each half-tile per thread: one 16-byte load per half in bf16, as the flat
# elementwise kernels use (heuristics.py); 4 and 16 were within 1-2% at 256.
ELEMENTS_PER_THREAD = 8


@triton.jit
def _rotate_heads(
    x_rows,  # (BLOCK_T, 1, 1) pointers: these positions' (n_heads, 2 * half) blocks of the input
    y_rows,  # (BLOCK_T, 1, 1) pointers: the same blocks of the output
    n_heads,
    x_head_stride,
    x_col_stride,
    y_head_stride,
    y_col_stride,
    half,
    position_mask,  # (BLOCK_T, 1, 1)
    c1,  # (BLOCK_T, 1, BLOCK_HALF) fp32: multiplies x1 in y1
    c2,  # (BLOCK_T, 1, BLOCK_HALF) fp32: multiplies x2 in y2
    s_x2,  # (BLOCK_T, 1, BLOCK_HALF) fp32: multiplies x2 in y1
    s_x1,  # (BLOCK_T, 1, BLOCK_HALF) fp32: multiplies x1 in y2
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """y1 = x1 * c1 + x2 * s_x2, y2 = x2 * c2 + x1 * s_x1 for every head, BLOCK_H heads at a time."""
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    col_mask = cols < half
    for first_head in range(0, n_heads, BLOCK_H):
        heads = (first_head + tl.arange(0, BLOCK_H)).to(tl.int64)[None, :, None]  # * stride may pass 2^31
        mask = position_mask & (heads < n_heads) & col_mask
        x_ptrs = x_rows + heads * x_head_stride + cols * x_col_stride
        x1 = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptrs + half * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * c1 + x2 * s_x2
        y2 = x2 * c2 + x1 * s_x1
        y_ptrs = y_rows + heads * y_head_stride + cols * y_col_stride
        tl.store(y_ptrs, y1.to(y_rows.dtype.element_ty), mask=mask)
        tl.store(y_ptrs + half * y_col_stride, y2.to(y_rows.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,  # (B, Hq, T, D) input dtype (forward: q; backward: dq_embed), any strides
    k_ptr,  # (B, Hk, T, D) likewise
    q_out_ptr,  # (B, Hq, T, D) output dtype (forward: q_embed; backward: dq), any strides
    k_out_ptr,  # (B, Hk, T, D) likewise
    cos_ptr,  # (B, T, D) cos dtype; batch stride 0 where one table serves every sequence
    sin_ptr,  # (B, T, D) sin dtype, cos's strides
    seq_len,
    n_q_heads,
    n_k_heads,
    half,  # D // 2
    q_stride_b, q_stride_h, q_stride_t, q_stride_d,
    k_stride_b, k_stride_h, k_stride_t, k_stride_d,
    q_out_stride_b, q_out_stride_h, q_out_stride_t, q_out_stride_d,
    k_out_stride_b, k_out_stride_h, k_out_stride_t, k_out_stride_d,
    cs_stride_b, cs_stride_t, cs_stride_d,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):  # fmt: skip
    # One program per BLOCK_T positions of one sequence: their cos/sin rows are read once, for all
    # Hq + Hk heads.
    blocks_per_sequence = tl.cdiv(seq_len, BLOCK_T)
    b = tl.program_id(0).to(tl.int64) // blocks_per_sequence
    t = (tl.program_id(0) % blocks_per_sequence) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    t = t[:, None, None]
    position_mask = t < seq_len
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    cs_mask = position_mask & (cols < half)
    cs_offsets = b * cs_stride_b + t * cs_stride_t + cols * cs_stride_d
    c1 = tl.load(cos_ptr + cs_offsets, mask=cs_mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + cs_offsets + half * cs_stride_d, mask=cs_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + cs_offsets, mask=cs_mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + cs_offsets + half * cs_stride_d, mask=cs_mask, other=0.0).to(tl.float32)
    if BACKWARD:  # dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1
        s_x2 = s2
        s_x1 = -s1
    else:  # y1 = x1 * c1 - x2 * s1, y2 = x2 * c2 + x1 * s2
        s_x2 = -s1
        s_x1 = s2
    _rotate_heads(
        q_ptr + b * q_stride_b + t * q_stride_t,
        q_out_ptr + b * q_out_stride_b + t * q_out_stride_t,
        n_q_heads, q_stride_h, q_stride_d, q_out_stride_h, q_out_stride_d,
        half, position_mask, c1, c2, s_x2, s_x1, BLOCK_HQ, BLOCK_HALF,
    )  # fmt: skip
    _rotate_heads(
        k_ptr + b * k_stride_b + t * k_stride_t,
        k_out_ptr + b * k_out_stride_b + t * k_out_stride_t,
        n_k_heads, k_stride_h, k_stride_d, k_out_stride_h, k_out_stride_d,
        half, position_mask, c1, c2, s_x2, s_x1, BLOCK_HK, BLOCK_HALF,
    )  # fmt: skip


def _heads_first(x: Tensor, unsqueeze_dim: int) -> Tensor:
    """(B, H, T, D) view of q or k: as it is for unsqueeze_dim 1, transposed from (B, T, H, D) for 2."""
    return x if unsqueeze_dim == 1 else x.transpose(1, 2)


def _launch_rope(
    x_q: Tensor, x_k: Tensor, out_q: Tensor, out_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
    backward: bool,
) -> None:  # fmt: skip
    """Run the kernel from x_q, x_k into out_q, out_k (all in the caller's layout)."""
    x_q, x_k = _heads_first(x_q, unsqueeze_dim), _heads_first(x_k, unsqueeze_dim)
    out_q, out_k = _heads_first(out_q, unsqueeze_dim), _heads_first(out_k, unsqueeze_dim)
    batch, n_q_heads, seq_len, head_dim = x_q.shape
    n_k_heads = x_k.shape[1]
    if batch * seq_len == 0 or n_q_heads + n_k_heads == 0:
        return
    # (B, T, D) with stride 0 where cos is shared (Hugging Face's position_ids are (1, T)).
    cos, sin = cos.expand(batch, seq_len, head_dim), sin.expand(batch, seq_len, head_dim)
    if cos.stride() != sin.stride():  # the kernel takes one set of strides for both: rare, small
        cos, sin = cos.contiguous(), sin.contiguous()
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    max_heads = max(1, MAX_TILE // block_half)
    block_hq = min(triton.next_power_of_2(max(n_q_heads, 1)), max_heads)
    block_hk = min(triton.next_power_of_2(max(n_k_heads, 1)), max_heads)
    heads_tile = max(block_hq, block_hk) * block_half
    block_t = min(triton.next_power_of_2(seq_len), max(1, MAX_TILE // heads_tile))
    num_warps = min(8, max(1, block_t * heads_tile // (32 * ELEMENTS_PER_THREAD)))
    args = (x_q, x_k, out_q, out_k, cos, sin, seq_len, n_q_heads, n_k_heads, half,
            *x_q.stride(), *x_k.stride(), *out_q.stride(), *out_k.stride(), *cos.stride())  # fmt: skip
    grid = (batch * triton.cdiv(seq_len, block_t),)
    launch(_rope_kernel, grid, args, BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk,
           BLOCK_HALF=block_half, BACKWARD=backward, num_warps=num_warps)  # fmt: skip


def _out_dtype(x: Tensor, cos: Tensor, sin: Tensor) -> torch.dtype:
    """``x * cos + rotate_half(x) * sin``'s dtype: torch's promotion of the three."""
    return torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _rope_fwd(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    """Launch the forward; returns (q_embed, k_embed), each in its input's memory layout.

    The body of the custom op ``fused_layers::rope`` and of the eager Function alike.
    """
    q_embed = torch.empty_like(q, dtype=_out_dtype(q, cos, sin))
    k_embed = torch.empty_like(k, dtype=_out_dtype(k, cos, sin))
    _launch_rope(q, k, q_embed, k_embed, cos, sin, unsqueeze_dim, backward=False)
    return q_embed, k_embed


def _rope_bwd(
    dq_embed: Tensor, dk_embed: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, grad_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Launch the backward; returns (dq, dk) in ``grad_dtype`` (q's), each in its dy's memory layout
    (as torch's elementwise backward allocates). The body of ``fused_layers::rope_backward``."""
    dq = torch.empty_like(dq_embed, dtype=grad_dtype)
    dk = torch.empty_like(dk_embed, dtype=grad_dtype)
    _launch_rope(dq_embed, dk_embed, dq, dk, cos, sin, unsqueeze_dim, backward=True)
    return dq, dk


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, _, cos, sin, unsqueeze_dim = inputs
    ctx.save_for_backward(cos, sin)  # the backward needs neither q nor k
    ctx.unsqueeze_dim = unsqueeze_dim
    ctx.grad_dtype = q.dtype


def _backward(ctx: Any, dq_embed: Tensor, dk_embed: Tensor) -> tuple[Tensor | None, ...]:
    """dq, dk, then None for cos, sin and unsqueeze_dim; shared by the eager Function and the custom op."""
    cos, sin = ctx.saved_tensors
    dq, dk = run_op("rope_backward", _rope_bwd, dq_embed, dk_embed, cos, sin, ctx.unsqueeze_dim,
                    ctx.grad_dtype)  # fmt: skip
    return dq, dk, None, None, None


RopeFunction = eager_function("RopeFunction", _rope_fwd, _setup_context, _backward)


@registers
def _define() -> None:
    define("rope_backward", _rope_bwd)
    define("rope", _rope_fwd).register_autograd(_backward, setup_context=_setup_context)


def covers(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> bool:
    """Whether the kernel computes this call: Hugging Face's shapes, an even head dim, no cos/sin grad.

    q (B, Hq, T, D) and k (B, Hk, T, D) (or (B, T, H, D) with unsqueeze_dim 2), cos and sin
    (B or 1, T or 1, D), fp32/fp16/bf16, q and k of one dtype, all on one device.
    """
    if (
        unsqueeze_dim not in (1, 2)
        or q.dim() != 4
        or k.dim() != 4
        or cos.dim() != 3
        or cos.shape != sin.shape
    ):
        return False
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return False
    if q.dtype != k.dtype or any(t.dtype not in _KERNEL_DTYPES for t in (q, k, cos, sin)):
        return False
    if len({q.device, k.device, cos.device, sin.device}) != 1:
        return False
    head_axis = unsqueeze_dim
    q_rest = tuple(size for axis, size in enumerate(q.shape) if axis != head_axis)
    k_rest = tuple(size for axis, size in enumerate(k.shape) if axis != head_axis)
    head_dim = q.shape[-1]
    return (
        q_rest == k_rest
        and head_dim % 2 == 0
        and all(size in (1, target) for size, target in zip(cos.shape, q_rest, strict=True))
        and cos.shape[-1] == head_dim
    )


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    """(q_embed, k_embed) for a call the kernel :func:`covers`: the custom op when traced, else the
    autograd.Function."""
    q_embed, k_embed = run_op("rope", RopeFunction.apply, q, k, cos, sin, unsqueeze_dim)
    return q_embed, k_embed
