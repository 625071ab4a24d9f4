"""Launch heuristics shared by the op launchers: flat blocks, row tiles, persistent grids.

Triton's autotuner needs a GPU to time candidates, and CI runs these kernels under the CPU
interpreter, so block sizes come from the fixed rules below; each rule says why.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from fused_layers.ops._triton import triton

# Elementwise ops: 1024 elements over 4 warps is 8 elements per thread, one 16-byte vector
# load per input in bf16. Measured on an H200 (2026-11-21, swiglu/geglu bf16, 32768x4096 and
# 8192x11008): 1024/4 reached 99-100% of copy bandwidth, 4096/8 1-2% less, 8192/4 12% less.
FLAT_BLOCK = 1024
FLAT_WARPS = 4

# Norms: a row up to this width is held in registers in one block (one read of x); wider rows
# take the looped path that walks the row in chunks of LOOP_BLOCK (re-reading it, from L2).
# 16384 fp32 values over 16 warps is 32 registers per thread for x: no spills.
MAX_FUSED_WIDTH = 16384
LOOP_BLOCK = 4096
# Narrow rows are packed into one 2-D tile of about this many elements per program (a 1024-wide
# row alone is little work), and num_warps is set so each thread holds ELEMENTS_PER_THREAD fp32
# values of it (clamped to 4..16 warps). Fewer, fuller warps won on an H200 (2026-11-21, bf16
# sweep of tile 2048..16384 x 8..32 per thread): each row statistic is a cross-warp reduction,
# and fewer warps make it cheaper. Forward at 2048 / 32: 3.95-4.08 TB/s at widths 1024-8192
# against 3.48-3.94 at 4096 / 16; width 16384 was 3.73 in every setting.
TILE_ELEMENTS = 2048
ELEMENTS_PER_THREAD = 32
# Backward: 4096 / 16 (8 warps at width 1024). At width 1024, 16 warps ran at a third of the
# speed of 8. Beyond that the H200 forward+backward timings moved by up to +-40% between runs
# for every contender (torch.compile too), so these two are provisional: re-time before tuning.
BWD_TILE_ELEMENTS = 4096
BWD_ELEMENTS_PER_THREAD = 16
# Warps per SM the persistent backward grid aims to keep resident (see persistent_programs).
# benchmarks/norm_backward_sweep.py on an H200 (2026-11-21, bf16, backward alone, kernels queued
# back to back): 16 was best or within 2% of best for both norms at widths 1024-16384 (LayerNorm
# 3.01 / 3.04 / 2.75 / 1.85 TB/s, RMSNorm 3.33 / 3.35 / 3.09 / 2.73); 32 gave 2.79 / 2.82 / 2.65 /
# 1.75 for LayerNorm. At ~110-130 registers a thread, 32 warps of programs do not fit on an SM
# (64K registers), so a 32-warp grid ran in two uneven waves.
RESIDENT_WARPS_PER_SM = 16


def flat_config(n_elements: int) -> tuple[int, int, int]:
    """Return (grid size, BLOCK, num_warps) for a flat elementwise kernel over ``n_elements``."""
    block = min(FLAT_BLOCK, max(16, triton.next_power_of_2(n_elements)))
    return triton.cdiv(n_elements, block), block, FLAT_WARPS


def row_tile(n_rows: int, width: int, backward: bool = False) -> tuple[int, int, int]:
    """Return (ROWS, BLOCK_N, num_warps) for a norm whose row fits one block (width <= MAX_FUSED_WIDTH)."""
    block_n = max(16, triton.next_power_of_2(width))
    tile = BWD_TILE_ELEMENTS if backward else TILE_ELEMENTS
    per_thread = BWD_ELEMENTS_PER_THREAD if backward else ELEMENTS_PER_THREAD
    rows = max(1, min(tile // block_n, triton.next_power_of_2(max(n_rows, 1))))
    # About per_thread fp32 values per thread (rows * block_n / (32 * warps)); 4 warps at least
    # so small tiles still hide latency, 16 at most so wide rows keep several programs per SM.
    num_warps = min(16, max(4, rows * block_n // (32 * per_thread)))
    return rows, block_n, num_warps


def loop_warps() -> int:
    """num_warps for the looped (wide-row) kernels: 8 warps over LOOP_BLOCK is 16 values per thread."""
    return 8


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(work_items: int, num_warps: int, device: torch.device) -> int:
    """Number of programs for a persistent backward kernel that strides over ``work_items``.

    Each program keeps its own fp32 partial sums of dweight/dbias in registers over all the
    rows it visits and writes them once, so the partials cost (programs x N) floats instead of
    a second pass over dy and x. RESIDENT_WARPS_PER_SM (16) resident warps per SM keep HBM busy;
    more programs would only grow the partial buffer that torch then sums.
    """
    if device.type == "cuda":
        slots = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
        slots *= max(1, RESIDENT_WARPS_PER_SM // num_warps)
    else:
        # Triton's CPU interpreter runs programs one after another: few programs, less overhead.
        slots = 4
    return max(1, min(work_items, slots))


class NormPlan(NamedTuple):
    """How a norm kernel is launched on (n_rows, width) rows."""

    fused: bool  # the row fits one block (width <= MAX_FUSED_WIDTH); else the looped kernel
    programs: int  # grid size
    rows: int  # ROWS: rows per tile (fused kernels only)
    block_n: int  # BLOCK_N: the row's block (fused) or the loop's chunk (looped)
    num_warps: int


_plans: dict[tuple, NormPlan] = {}


def norm_plan(n_rows: int, width: int, device: torch.device, backward: bool = False) -> NormPlan:
    """The launch plan of a norm forward or (persistent) backward, cached per shape.

    The cache spares each eager call the few microseconds of Python that the rules take; a
    traced call (symbolic row counts) computes its plan without caching it.
    """
    if type(n_rows) is not int or type(width) is not int:
        return _norm_plan(n_rows, width, device, backward)
    key = (n_rows, width, device, backward, MAX_FUSED_WIDTH, LOOP_BLOCK)
    plan = _plans.get(key)
    if plan is None:
        plan = _norm_plan(n_rows, width, device, backward)
        if len(_plans) > 4096:  # a run with ever-changing shapes: start over
            _plans.clear()
        _plans[key] = plan
    return plan


def _norm_plan(n_rows: int, width: int, device: torch.device, backward: bool) -> NormPlan:
    if width <= MAX_FUSED_WIDTH:
        rows, block_n, num_warps = row_tile(n_rows, width, backward)
        tiles = triton.cdiv(n_rows, rows)
        programs = persistent_programs(tiles, num_warps, device) if backward else tiles
        return NormPlan(True, programs, rows, block_n, num_warps)
    num_warps = loop_warps()
    programs = persistent_programs(n_rows, num_warps, device) if backward else n_rows
    return NormPlan(False, programs, 1, LOOP_BLOCK, num_warps)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View ``x`` as (rows, width) with unit column stride; copies only when it must.

    A row-strided view (e.g. a slice of a wider buffer) keeps its row stride and is not copied.
    """
    width = x.shape[-1]
    x2d = x.reshape(-1, width)
    if x2d.stride(-1) != 1 and x2d.numel() > 0:
        x2d = x2d.contiguous()
    return x2d
