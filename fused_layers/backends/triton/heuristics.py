"""Launch heuristics shared by the op launchers: flat blocks, row tiles, persistent grids.

Triton's autotuner needs a GPU to time candidates, and CI runs these kernels under the CPU
interpreter, so block sizes come from the fixed rules below; each rule says why.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from fused_layers.backends.triton.language import triton

# Elementwise ops: 1024 elements over 4 warps is 8 elements per thread, one 16-byte vector
# load per input in bf16. Measured on an H200 (2026-11-21, swiglu/geglu bf16, 32768x4096 and
# 8192x11008): 1024/4 reached 99-100% of copy bandwidth, 4096/8 1-2% less, 8192/4 12% less.
FLAT_BLOCK = 1024
FLAT_WARPS = 4

# Norms: a row up to this width is held in registers in one block (one read of x); wider rows
# take the looped path that walks the row in chunks of LOOP_BLOCK (re-reading it, from L2).
# An op's own limit (NormSettings.max_fused_width) can be lower; tests lower this one.
MAX_FUSED_WIDTH = 16384
LOOP_BLOCK = 4096
# The backward's limit. None: MAX_FUSED_WIDTH. The looped backward, whose sums live in L2, ran at
# 0.7-1.8 TB/s on an H200 at widths 4096-16384 (2026-11-23 sweep) against 1.9-3.5 held in
# registers, so it serves only rows too wide for registers at all.
MAX_FUSED_WIDTH_BWD: int | None = None
# num_warps of the looped kernels. H200, 2026-11-23: the looped forward at width 16384 ran at
# 3.42 TB/s (LayerNorm) / 3.92 (RMSNorm) with 16 warps against 2.70 / 3.01 with 8.
LOOP_WARPS = 16
# Narrow rows are packed into one 2-D tile of about this many elements per program (a 1024-wide
# row alone is little work), and num_warps is set so each thread holds ELEMENTS_PER_THREAD fp32
# values of it (clamped to 4..16 warps). Fewer, fuller warps won on an H200 (2026-11-21, bf16
# sweep of tile 2048..16384 x 8..32 per thread): each row statistic is a cross-warp reduction,
# and fewer warps make it cheaper. Forward at 2048 / 32: 3.95-4.08 TB/s at widths 1024-8192
# against 3.48-3.94 at 4096 / 16.
TILE_ELEMENTS = 2048
ELEMENTS_PER_THREAD = 32
# At most this many warps per program: 16 keeps wide rows at several programs per SM.
MAX_WARPS = 16


class NormSettings(NamedTuple):
    """One norm's launch settings, chosen by ``benchmarks/norm_backward_sweep.py``."""

    max_fused_width: int  # widest row the forward holds in registers (capped by MAX_FUSED_WIDTH)
    fwd_max_warps: int  # forward: at most this many warps per program (and MAX_WARPS)
    bwd_tile: int  # backward: elements per row tile (rows = tile // width, at least 1)
    bwd_per_thread: int  # backward: fp32 values a thread holds per loaded tensor (sets num_warps)
    resident_warps: int  # backward: warps per SM the persistent grid aims for
    bwd_stages: int  # backward: software-pipelining stages of the persistent loop (tl.range)


#: H200 sweeps, 2026-11-23, bf16, each pass timed alone from a CUDA graph, TB/s over the fewest
#: bytes (benchmarks/results/norm_sweep*.h200.json). Backward: 2-row tiles at width 1024 (else one
#: row), 16 values a thread, 16 resident warps and a 3-stage pipelined loop (Triton prefetches the
#: next tile while this one is computed): LayerNorm 3.82 / 4.03 / 3.95 TB/s and RMSNorm 3.78 / 3.84
#: / 4.11 at widths 1024 / 4096 / 8192, against 3.20-3.38 / 3.22 / 2.88 and 3.45-3.73 / 3.47 / 3.16
#: without stages. Rows wider than PIPELINED_MAX_WIDTH hold too much in registers for stages to help
#: (width 16384: LayerNorm 423 against 426 µs, RMSNorm 313 against 288). LayerNorm's forward holds
#: a 16384-wide row well with 8 warps (2026-11-24, back-to-back at
#: 8192x16384: 3.81 TB/s; 16 warps 2.36; looped 3.34: `fwd_max_warps`), RMSNorm's with 16 (4.04).
PIPELINED_MAX_WIDTH = 8192
SETTINGS: dict[str, NormSettings] = {
    "layer_norm": NormSettings(max_fused_width=16384, fwd_max_warps=8, bwd_tile=2048, bwd_per_thread=16,
                               resident_warps=16, bwd_stages=3),
    "rms_norm": NormSettings(max_fused_width=16384, fwd_max_warps=16, bwd_tile=2048, bwd_per_thread=16,
                             resident_warps=16, bwd_stages=3),
}


def flat_config(n_elements: int) -> tuple[int, int, int]:
    """Return (grid size, BLOCK, num_warps) for a flat elementwise kernel over ``n_elements``."""
    block = min(FLAT_BLOCK, max(16, triton.next_power_of_2(n_elements)))
    return triton.cdiv(n_elements, block), block, FLAT_WARPS


def row_tile(
    n_rows: int, width: int, tile: int, per_thread: int, max_warps: int | None = None
) -> tuple[int, int, int]:
    """Return (ROWS, BLOCK_N, num_warps) for a norm whose row fits one block: about ``tile``
    elements per program, ``per_thread`` fp32 values of each tensor per thread, at most
    ``max_warps`` (and MAX_WARPS) warps."""
    block_n = max(16, triton.next_power_of_2(width))
    rows = max(1, min(tile // block_n, triton.next_power_of_2(max(n_rows, 1))))
    # About per_thread fp32 values per thread (rows * block_n / (32 * warps)); 4 warps at least
    # so small tiles still hide latency, MAX_WARPS at most.
    cap = MAX_WARPS if max_warps is None else min(MAX_WARPS, max_warps)
    num_warps = min(cap, max(4, rows * block_n // (32 * per_thread)))
    return rows, block_n, num_warps


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(work_items: int, num_warps: int, resident_warps: int, device: torch.device) -> int:
    """Number of programs for a persistent backward kernel that strides over ``work_items``.

    Each program keeps its own fp32 partial sums of dweight/dbias in registers over all the
    rows it visits and writes them once, so the partials cost (programs x N) floats instead of
    a second pass over dy and x. ``resident_warps`` resident warps per SM keep HBM busy; more
    programs would only grow the partial buffer that ``sum_partials`` then reads.
    """
    if device.type == "cuda":
        slots = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
        slots *= max(1, resident_warps // num_warps)
    else:
        # Triton's CPU interpreter runs programs one after another: few programs, less overhead.
        slots = 4
    return max(1, min(work_items, slots))


class NormPlan(NamedTuple):
    """How a norm kernel is launched on (n_rows, width) rows."""

    fused: bool  # the row fits one block; else the looped kernel
    programs: int  # grid size
    rows: int  # ROWS: rows per tile (fused kernels only)
    block_n: int  # BLOCK_N: the row's block (fused) or the loop's chunk (looped)
    num_warps: int
    stages: int  # NUM_STAGES of the fused backward's persistent loop (1 elsewhere)


_plans: dict[tuple, NormPlan] = {}


def norm_plan(op: str, n_rows: int, width: int, device: torch.device, backward: bool = False) -> NormPlan:
    """The launch plan of norm ``op``'s forward or (persistent) backward, cached per shape.

    The cache spares each eager call the few microseconds of Python that the rules take; a
    traced call (symbolic row counts) computes its plan without caching it. The key holds the
    width limits (tests patch them); a sweep that changes the other settings clears ``_plans``.
    """
    if type(n_rows) is not int or type(width) is not int:
        return _norm_plan(op, n_rows, width, device, backward)
    key = (op, n_rows, width, device, backward, MAX_FUSED_WIDTH, MAX_FUSED_WIDTH_BWD, LOOP_BLOCK,
           PIPELINED_MAX_WIDTH)  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        plan = _norm_plan(op, n_rows, width, device, backward)
        if len(_plans) > 4096:  # a run with ever-changing shapes: start over
            _plans.clear()
        _plans[key] = plan
    return plan


def _norm_plan(op: str, n_rows: int, width: int, device: torch.device, backward: bool) -> NormPlan:
    settings = SETTINGS[op]
    if backward:
        limit = MAX_FUSED_WIDTH if MAX_FUSED_WIDTH_BWD is None else MAX_FUSED_WIDTH_BWD
    else:
        limit = min(MAX_FUSED_WIDTH, settings.max_fused_width)
    if width <= limit:
        if backward:
            rows, block_n, num_warps = row_tile(n_rows, width, settings.bwd_tile, settings.bwd_per_thread)
            tiles = triton.cdiv(n_rows, rows)
            programs = persistent_programs(tiles, num_warps, settings.resident_warps, device)
            stages = settings.bwd_stages if width <= PIPELINED_MAX_WIDTH else 1
            return NormPlan(True, programs, rows, block_n, num_warps, stages)
        rows, block_n, num_warps = row_tile(
            n_rows, width, TILE_ELEMENTS, ELEMENTS_PER_THREAD, settings.fwd_max_warps
        )
        return NormPlan(True, triton.cdiv(n_rows, rows), rows, block_n, num_warps, 1)
    if backward:
        programs = persistent_programs(n_rows, LOOP_WARPS, settings.resident_warps, device)
    else:
        programs = n_rows
    return NormPlan(False, programs, 1, LOOP_BLOCK, LOOP_WARPS, 1)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View ``x`` as (rows, width) with unit column stride; copies only when it must.

    A row-strided view (e.g. a slice of a wider buffer) keeps its row stride and is not copied.
    """
    width = x.shape[-1]
    x2d = x.reshape(-1, width)
    if x2d.stride(-1) != 1 and x2d.numel() > 0:
        x2d = x2d.contiguous()
    return x2d
