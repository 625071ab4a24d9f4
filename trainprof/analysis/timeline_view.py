"""The GPU timeline as report.html draws it: one lane per stream, each kernel or copy with its
category, op, module and phase; a lane of GPU-idle runs, each with its cause; the sync points.

    stream 7   |=gemm=|=elementwise=|  |=attention=====|      |=gemm=|
    GPU idle                        [l]                [sync  ]
    syncs                                              v

The view spans the profiled steps (from the first step's start to the end of the last GPU work its
steps launched). A lane holds at most `TIMELINE_EVENTS_PER_LANE` blocks: past that, the events
closest together are joined into one block (`count` > 1, the longest event names it), so the file
stays bounded and the largest gaps, the ones worth seeing, stay drawn at every zoom.
"""

from __future__ import annotations

import functools
import re

import msgspec
import numpy as np

from trainprof.analysis.arrays import StringTable, distinct
from trainprof.analysis.attribution import KernelOwners
from trainprof.analysis.idle import IdlePieces
from trainprof.analysis.syncs import SyncPoint
from trainprof.analysis.thresholds import TIMELINE_EVENTS_PER_LANE
from trainprof.analysis.timeline import Timeline

# A kernel's category from its name: the first row whose pattern matches the lowercased name, else
# `other`. Colours on the timeline; `kernel_categories` is the one place that assigns them.
KERNEL_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|rccl"),
    ("attention", r"flash|fmha|attention|attn|sdpa"),
    ("gemm", r"gemm|matmul|cutlass|cublas|xmma|wgmma|nvjet|cijk_|_mm_|splitk"),
    ("convolution", r"conv|winograd|implicit_convolve|cudnn"),
    ("normalization", r"norm"),
    ("softmax", r"softmax|cross_entropy|nll_loss"),
    ("reduction", r"reduce|_sum_|sum_kernel|argmax|max_kernel"),
    ("optimizer", r"adam|sgd|multi_tensor_apply|foreach"),
    ("triton", r"^triton_"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|copy_kernel|fill_kernel|cat_"),
)
OTHER = "other"
CATEGORIES: tuple[str, ...] = (*(label for label, _ in KERNEL_CATEGORIES), OTHER, "memcpy", "memset")
"""Every category, by code (`TimelineLane.category`)."""
# Lowercased names against case-sensitive patterns: re's IGNORECASE costs 5x on names that run to
# thousands of characters (73 gpt2_pathologies kernel names: 5.3 ms against 1.1 ms, 2026-11-25).
_PATTERNS = tuple(re.compile(pattern) for _, pattern in KERNEL_CATEGORIES)
_COPY_CATEGORY = {"gpu_memcpy": CATEGORIES.index("memcpy"), "gpu_memset": CATEGORIES.index("memset")}


def kernel_category(name: str) -> str:
    """The category of a kernel, from its name (`KERNEL_CATEGORIES`)."""
    return CATEGORIES[_category_code(name)]


@functools.lru_cache(maxsize=4096)  # the timeline and the kernel table ask about the same names
def _category_code(name: str) -> int:
    lowered = name.lower()
    return next((code for code, pattern in enumerate(_PATTERNS) if pattern.search(lowered)), len(_PATTERNS))


def kernel_categories(names: list[str], name_ids: np.ndarray) -> np.ndarray:
    """Per kernel (its name id into `names`), its category code into `CATEGORIES`: each distinct
    name is matched once (a trace has ~100 distinct kernel names and ~10^4 kernels)."""
    codes = np.zeros(len(names), dtype=np.int8)
    for name_id in distinct(name_ids).tolist():
        codes[name_id] = _category_code(names[name_id])
    return codes[name_ids]


class TimelineLane(msgspec.Struct, frozen=True):
    """One stream's kernels, copies and memsets, as blocks sorted by start (parallel arrays).

    Times in µs from the view's origin. A block is one event (`count` 1) or several joined
    (`busy_us` their GPU time, under `dur_us`, the block's span); `name`, `op` and `module` index
    `TimelineView.strings` (-1: unknown) and come from the block's longest event; `category` indexes
    `CATEGORIES`, `phase` `attribution.PHASES`.
    """

    label: str
    start_us: np.ndarray
    dur_us: np.ndarray
    busy_us: np.ndarray
    count: np.ndarray
    name: np.ndarray
    category: np.ndarray
    op: np.ndarray
    module: np.ndarray
    phase: np.ndarray


class IdleLane(msgspec.Struct, frozen=True):
    """The GPU-idle runs inside the steps, by cause (`causes.Cause` codes), as blocks like a lane's:
    `idle_us` is the idle time of a block, whose `cause` is that of its longest run; `one_off`
    marks runs left out of the steady-state figures (warm-up, context creation)."""

    start_us: np.ndarray
    dur_us: np.ndarray
    idle_us: np.ndarray
    count: np.ndarray
    cause: np.ndarray
    one_off: np.ndarray


class SyncMarks(msgspec.Struct, frozen=True):
    """The sync points: where the host blocked (from `at_us`, for `blocked_us`), the op and the
    runtime call (indices into `TimelineView.strings`)."""

    at_us: np.ndarray
    blocked_us: np.ndarray
    op: np.ndarray
    call: np.ndarray


class StepSpan(msgspec.Struct, frozen=True):
    """One step's window on the host, in µs from the view's origin."""

    number: int
    start_us: float
    end_us: float


class TimelineView(msgspec.Struct, frozen=True):
    """The GPU timeline of one trace's profiled steps (module docstring)."""

    origin_us: float
    """The first step's start on the trace's clock; every time of the view counts from it."""
    end_us: float
    """Where the view ends, from the origin."""
    strings: list[str]
    steps: list[StepSpan]
    lanes: list[TimelineLane]
    idle: IdleLane
    syncs: SyncMarks
    categories: tuple[str, ...] = CATEGORIES


def timeline_view(
    timeline: Timeline, owners: KernelOwners, idle: IdlePieces | None, points: list[SyncPoint]
) -> TimelineView:
    """The timeline of `timeline`'s steps (module docstring); `owners` from `attribute_kernels`,
    `idle` from `idle_breakdown`, `points` from `find_sync_points`."""
    trace, kernels = timeline.trace, timeline.kernels
    origin = timeline.steps[0].start_us
    in_steps = timeline.kernel_step >= 0
    end = max(timeline.steps[-1].end_us, float(kernels.end_us[in_steps].max()) if in_steps.any() else 0.0)
    strings = StringTable()

    # Every GPU event overlapping the view: kernels (with their owners), then copies and memsets.
    parts = []
    seen = (kernels.end_us > origin) & (kernels.start_us < end)
    rows = np.flatnonzero(seen)
    parts.append((
        kernels, rows, kernel_categories(trace.names, kernels.name[rows]),
        owners.op[rows], owners.module[rows], owners.phase[rows],
    ))
    for category, code in _COPY_CATEGORY.items():
        table = trace.events[category]
        rows = np.flatnonzero((table.end_us > origin) & (table.start_us < end))
        unknown = np.full(len(rows), -1, dtype=np.int64)
        no_phase = np.zeros(len(rows), np.int8)
        parts.append((table, rows, np.full(len(rows), code, dtype=np.int8), unknown, unknown, no_phase))
    thread = np.concatenate([table.thread[rows] for table, rows, *_ in parts])
    start = np.concatenate([table.start_us[rows] for table, rows, *_ in parts]) - origin
    dur = np.concatenate([table.dur_us[rows] for table, rows, *_ in parts])
    name = np.concatenate([table.name[rows] for table, rows, *_ in parts]).astype(np.int64)
    category = np.concatenate([part[2] for part in parts])
    op = np.concatenate([part[3] for part in parts])
    module = np.concatenate([part[4] for part in parts])
    phase = np.concatenate([part[5] for part in parts])

    lanes = []
    for lane_thread in distinct(thread).tolist():
        on = np.flatnonzero(thread == lane_thread)
        on = on[np.argsort(start[on], kind="stable")]
        first, rep = _blocks(start[on], start[on] + dur[on], TIMELINE_EVENTS_PER_LANE, dur[on])
        ends = np.maximum.reduceat(start[on] + dur[on], first)  # a lane has events: `first` is not empty
        rep = on[rep]
        lanes.append(TimelineLane(
            label=_lane_label(trace.threads[lane_thread]),
            start_us=start[on][first],
            dur_us=ends - start[on][first],
            busy_us=np.add.reduceat(dur[on], first),
            count=np.diff(np.append(first, len(on))),
            name=strings.ids([trace.names[i] for i in name[rep].tolist()]),
            category=category[rep],
            op=strings.ids([owners.ops[i] if i >= 0 else None for i in op[rep].tolist()]),
            module=strings.ids([owners.modules[i].path if i >= 0 else None for i in module[rep].tolist()]),
            phase=phase[rep],
        ))
    syncs = SyncMarks(  # before the table is read below: these add the ops and calls they name
        at_us=np.array([p.start_us - origin for p in points]),
        blocked_us=np.array([p.blocked_us for p in points]),
        op=strings.ids([p.op for p in points]),
        call=strings.ids([p.calls[0] if p.calls else None for p in points]),
    )
    return TimelineView(
        origin_us=origin,
        end_us=end - origin,
        strings=strings.strings,
        steps=[StepSpan(s.number, s.start_us - origin, s.end_us - origin) for s in timeline.steps],
        lanes=lanes,
        idle=_idle_lane(idle, origin),
        syncs=syncs,
    )


def _lane_label(thread: tuple) -> str:
    """A GPU row's name: `stream 7` (Kineto writes the device as pid, the stream as tid)."""
    device, stream = thread
    return f"GPU {device} stream {stream}"


def _idle_lane(idle: IdlePieces | None, origin: float) -> IdleLane:
    if idle is None or not len(idle.start_us):
        empty = np.zeros(0)
        return IdleLane(empty, empty, empty, np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, bool))
    length = idle.end_us - idle.start_us
    first, rep = _blocks(idle.start_us, idle.end_us, TIMELINE_EVENTS_PER_LANE, length)
    return IdleLane(
        start_us=idle.start_us[first] - origin,
        dur_us=np.maximum.reduceat(idle.end_us, first) - idle.start_us[first],
        idle_us=np.add.reduceat(length, first),
        count=np.diff(np.append(first, len(length))),
        cause=idle.cause[rep],
        one_off=idle.one_off[rep],
    )


def _blocks(
    starts: np.ndarray, ends: np.ndarray, limit: int, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Events sorted by start, joined into at most `limit` blocks by closing the smallest gaps
    between neighbours: (first event of each block, heaviest event of each block)."""
    n = len(starts)
    if n <= limit:
        every = np.arange(n)
        return every, every
    reach = np.maximum.accumulate(ends)
    gaps = starts[1:] - reach[:-1]
    join = np.zeros(n - 1, dtype=bool)
    join[np.argpartition(gaps, n - limit - 1)[: n - limit]] = True
    block = np.concatenate(([0], np.cumsum(~join)))
    first = np.flatnonzero(np.concatenate(([True], ~join)))
    # Sorted by block, then heaviest first: the first of each block's run is its heaviest event.
    order = np.lexsort((-weight, block))
    return first, order[first]
