"""GPU memory over the profiled steps, and the largest blocks live at its peak (`profile_memory=True`).

The curve is the allocator's `Total Allocated` after each `[memory]` event, decimated to at most
`MEMORY_CURVE_POINTS` points (each bucket of time keeps its lowest and highest value, so the peak
is drawn). At the peak, the blocks allocated inside the trace and not yet freed are paired by
address (an allocation's `Bytes` > 0, its free's < 0) and the largest listed with the op that
allocated them; memory allocated before recording began is in the total but in no listed block.
"""

from __future__ import annotations

import msgspec
import numpy as np

from trainprof.analysis.result import Record
from trainprof.analysis.thresholds import ALLOCATIONS_AT_PEAK, MEMORY_CURVE_POINTS
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import FRAME_CATEGORIES


class BlockAtPeak(Record, frozen=True):
    """One block live at the memory peak: its size, when it was allocated (µs from the first step's
    start) and by which op (innermost; None outside any op) and Python function (innermost)."""

    bytes: int
    allocated_at_us: float
    op: str | None
    python: str | None


class MemoryCurve(msgspec.Struct, frozen=True):
    """Allocated bytes over the steps (`at_us` from the first step's start), the peak and its blocks."""

    at_us: np.ndarray
    allocated_bytes: np.ndarray
    peak_at_us: float
    peak_bytes: int
    blocks_at_peak: list[BlockAtPeak]


def memory_curve(timeline: Timeline) -> MemoryCurve | None:
    """The curve over the steps (module docstring); None when the trace recorded no GPU memory."""
    memory = timeline.trace.memory
    origin, end = timeline.steps[0].start_us, timeline.steps[-1].end_us
    lo = int(np.searchsorted(memory.start_us, origin, side="left"))
    hi = int(np.searchsorted(memory.start_us, end, side="right"))
    if hi <= lo:
        return None
    at = memory.start_us[lo:hi] - origin
    allocated = memory.value[lo:hi]
    peak = int(np.argmax(allocated))
    keep = _decimated(at, allocated, MEMORY_CURVE_POINTS)
    return MemoryCurve(
        at_us=at[keep],
        allocated_bytes=allocated[keep],
        peak_at_us=float(at[peak]),
        peak_bytes=int(allocated[peak]),
        blocks_at_peak=_blocks_at_peak(timeline, lo + peak, origin),
    )


def _decimated(at: np.ndarray, values: np.ndarray, points: int) -> np.ndarray:
    """Indices to draw: all when few, else per bucket of time its lowest and highest point, in order."""
    if len(at) <= points:
        return np.arange(len(at))
    buckets = points // 2
    span = max(float(at[-1] - at[0]), 1e-9)
    bucket = np.minimum(((at - at[0]) / span * buckets).astype(np.int64), buckets - 1)
    first = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    # Per bucket (consecutive in time), the positions of its minimum and maximum.
    order_low = np.lexsort((values, bucket))
    order_high = np.lexsort((-values, bucket))
    starts = np.searchsorted(bucket[order_low], bucket[first])
    picks = np.concatenate((order_low[starts], order_high[starts], [0, len(at) - 1]))
    return np.unique(picks)


def _blocks_at_peak(timeline: Timeline, peak: int, origin: float) -> list[BlockAtPeak]:
    """The largest blocks allocated at or before event `peak` and not freed by then."""
    memory, trace = timeline.trace.memory, timeline.trace
    if memory.block_bytes is None or memory.addr is None:
        return []
    size = memory.block_bytes[: peak + 1]
    addr = memory.addr[: peak + 1]
    known = np.isfinite(size) & np.isfinite(addr)
    rows = np.flatnonzero(known)
    # By address, then time: an allocation is live when no later event at its address follows it.
    order = rows[np.lexsort((rows, addr[rows]))]
    last_of_addr = np.concatenate((addr[order][1:] != addr[order][:-1], [True]))
    live = order[last_of_addr & (size[order] > 0)]
    largest = live[np.argsort(-size[live], kind="stable")[:ALLOCATIONS_AT_PEAK]]
    return [
        BlockAtPeak(
            bytes=int(size[i]),
            allocated_at_us=round(float(memory.start_us[i] - origin), 3),
            op=_innermost(trace, int(memory.thread[i]), float(memory.start_us[i]), "cpu_op"),
            python=_innermost(trace, int(memory.thread[i]), float(memory.start_us[i]), "python_function"),
        )
        for i in largest.tolist()
    ]


def _innermost(trace, thread: int, at_us: float, category: str) -> str | None:
    """The innermost frame of `category` around time `at_us` on `thread`, by name."""
    frames = trace.frames(thread)
    code = FRAME_CATEGORIES.index(category)
    for i in reversed(frames.chain(frames.innermost(at_us, at_us))):
        if frames.category_codes[i] == code:
            return trace.names[int(frames.name_ids[i])]
    return None
