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

import msgspec
import numpy as np

from trainprof.analysis.arrays import StringTable, distinct
from trainprof.analysis.attribution import KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.idle import IdlePieces
from trainprof.analysis.kernel_classes import CLASSES, classify_name
from trainprof.analysis.syncs import SyncPoint
from trainprof.analysis.thresholds import TIMELINE_EVENTS_PER_LANE
from trainprof.analysis.timeline import Timeline

# A kernel's category is its class (`kernel_classes.KernelClass`: the busy analysis' table of GEMMs
# by dtype, attention by implementation, norms, ...), then the copies and memsets. Colours on the
# timeline; `kernel_categories` is the one place that assigns them.
CATEGORIES: tuple[str, ...] = (*(kernel_class.key for kernel_class in CLASSES), "memcpy", "memset")
"""Every category, by code (`TimelineLane.category`): a class's code is its `KernelClass.code`."""
CATEGORY_LABELS: dict[str, str] = {
    **{kernel_class.key: kernel_class.label for kernel_class in CLASSES},
    "memcpy": "memcpy",
    "memset": "memset",
}
"""Each category's words in the report."""
_COPY_CATEGORY = {"gpu_memcpy": CATEGORIES.index("memcpy"), "gpu_memset": CATEGORIES.index("memset")}


def kernel_category(name: str) -> str:
    """The category of a kernel from its name alone (`kernel_classes.classify_name`)."""
    return classify_name(name)[0].key


def kernel_categories(timeline: Timeline, rows: np.ndarray, work: KernelWork | None) -> np.ndarray:
    """Per kernel (`rows` of `timeline.kernels`), its category code into `CATEGORIES`: the class the
    busy analysis gave it (`busy.KernelWork`: refined by its op's dtype, the attention op it runs
    under, the optimizer step), else its name's class (a kernel outside the profiled steps, or no
    busy analysis). Each distinct name is matched once (a trace has ~100 distinct kernel names and
    ~10^4 kernels)."""
    names, name_ids = timeline.trace.names, timeline.kernels.name[rows]
    by_name = np.zeros(len(names), dtype=np.int8)
    for name_id in distinct(name_ids).tolist():
        by_name[name_id] = classify_name(names[name_id])[0].code
    codes = by_name[name_ids]
    if work is not None and len(work.rows) and len(rows):
        at = np.minimum(np.searchsorted(work.rows, rows), len(work.rows) - 1)  # work.rows is sorted
        known = work.rows[at] == rows
        codes[known] = work.kernel_class[at[known]]
    return codes


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
    timeline: Timeline,
    owners: KernelOwners,
    idle: IdlePieces | None,
    points: list[SyncPoint],
    work: KernelWork | None = None,
) -> TimelineView:
    """The timeline of `timeline`'s steps (module docstring); `owners` from `attribute_kernels`,
    `idle` from `idle_breakdown`, `points` from `find_sync_points`, `work` from `busy.kernel_work`
    (None: categories by kernel name)."""
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
        kernels, rows, kernel_categories(timeline, rows, work),
        owners.op[rows], owners.module[rows], owners.phase[rows],
    ))
    for kind, code in _COPY_CATEGORY.items():
        table = trace.events[kind]
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
            name=strings.coded(name[rep], trace.names.__getitem__),
            category=category[rep],
            op=strings.coded(op[rep], lambda i: owners.ops[i] if i >= 0 else None),
            module=strings.coded(module[rep], lambda i: owners.modules[i].path if i >= 0 else None),
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
