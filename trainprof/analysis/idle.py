"""Question 4: while the GPU sat idle inside a step, what was the host doing?

Every GPU-idle interval inside a step is cut into pieces at every boundary of every thread's host
activity, and each piece gets the cause the host was in over it: the rules and the tables are in
`trainprof.analysis.causes` (with a picture). Each thread's activity is worked out once as a step
function of time (`_ThreadLabels`: its frames' causes, overlaid with its runtime calls'); the loop's
thread decides, and where it is only in `host`, `unknown`, `profiler` or waiting on other threads,
the strongest cause another thread has at that moment decides instead.

A holder is what decided a group of pieces (a runtime call or a frame, on one thread, for one
cause). Warm-up and context creation whose holder shows in one step only are one-off costs: they
are kept apart from the steady-state per-cause figures, so that per step
`sum(costs) + one_off_ms == gpu_idle_ms`.

`idle_breakdown` returns an `IdleBreakdown`: per step a `StepIdle` (ms by `Cause`), the largest
holders, the `host` time by Python function, and the one-off holders. The findings on it are in
`trainprof.analysis.idle_findings`; the verdict, which weighs it against GPU-busy time, in
`trainprof.analysis.verdict`.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct, median, unique_inverse
from trainprof.analysis.causes import (
    CALL_CAUSES,
    CAPTURE_CALLS,
    FRAME_RULES,
    GPU_WORK_KINDS,
    LENDING_KINDS,
    LENT_BY_OTHER_THREADS,
    WARMUP_OPS,
    Cause,
    CauseCosts,
)
from trainprof.analysis.frames import PyFrame, parse_py_frame
from trainprof.analysis.name_patterns import NamePattern, NameText
from trainprof.analysis.records import Record
from trainprof.analysis.runtime_calls import KINDS, blocking_copies
from trainprof.analysis.thresholds import (
    HOLDERS_KEPT,
    HOLDERS_SCANNED,
    HOST_FUNCTION_STACK_FRAMES,
    HOST_FUNCTIONS_KEPT,
    LOOP_HOLDERS_KEPT,
    Thresholds,
)
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import FRAME_CATEGORIES, NESTING_SLACK_US, nearest_marked
from trainprof.user_code import CodeLayout, current_layout, is_user_file, library_of

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.intervals import Coverage


class StepIdle(msgspec.Struct, frozen=True):
    """One step's GPU-idle time: steady-state ms by cause, one-off ms, and its number of idle gaps.

    JSON (in the step row, `trainprof.analysis.result`): `idle_<cause>_ms` per cause in `Cause`
    order, `idle_one_off_ms`, `idle_gap_count`.
    """

    costs: CauseCosts
    one_off_ms: float
    gap_count: int

    def to_dict(self) -> dict[str, Any]:
        """The step row's idle fields."""
        row: dict[str, Any] = {f"idle_{cause.key}_ms": ms for cause, ms in self.costs.items()}
        row["idle_one_off_ms"] = self.one_off_ms
        row["idle_gap_count"] = self.gap_count
        return row


class IdleHolder(msgspec.Struct, frozen=True):
    """What held the host for a share of GPU-idle time: one (cause, thread, deciding event) group.

    `event` is the runtime call or frame that decided (`source`: `"runtime call"` or `"frame"`;
    both None when nothing was recorded), `op` the outermost op (else the innermost annotation)
    around its longest piece. `steps`: for a one-off holder, the steps it happened in.
    """

    cause: Cause
    event: str | None
    source: str | None
    op: str | None
    idle_ms: float
    idle_ms_per_step: float
    steps: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """`{"cause", "event", "source", "op", "idle_ms", "idle_ms_per_step"}`, and `steps` when one-off."""
        row: dict[str, Any] = {
            "cause": self.cause.key,
            "event": self.event,
            "source": self.source,
            "op": self.op,
            "idle_ms": self.idle_ms,
            "idle_ms_per_step": self.idle_ms_per_step,
        }
        if self.steps is not None:
            row["steps"] = list(self.steps)
        return row


class HostFunction(Record, frozen=True):
    """`host` idle time held by one Python function (else op or annotation), per step.

    `code` is `"user"` or `"library"` (None for an op or annotation); `called_from` the innermost
    frame outside torch and the standard library that led there, when it is not the function
    itself; `stack` named frames (`file function`), innermost first, at its longest gap.
    """

    file: str | None
    function: str
    code: str | None
    idle_ms_per_step: float
    called_from: str | None
    stack: list[str]


class IdlePieces(msgspec.Struct, frozen=True):
    """The classified GPU-idle time itself, for drawing it on a timeline: maximal runs of touching
    pieces with one cause, sorted by start (µs on the trace's clock; parallel arrays).

    `cause` holds `Cause` codes; `one_off` marks the runs left out of the steady-state figures.
    """

    start_us: np.ndarray
    end_us: np.ndarray
    cause: np.ndarray
    one_off: np.ndarray


class IdleBreakdown(msgspec.Struct, frozen=True):
    """What `idle_breakdown` returns: per-step idle ms by cause, and who held the host for each cause."""

    per_step: list[StepIdle]
    holders: list[IdleHolder]
    """The largest steady-state holders of GPU-idle time, largest first."""
    host_functions: list[HostFunction]
    """`host` time by innermost Python function, largest first."""
    one_off: list[IdleHolder]
    """One-off holders (context creation, warm-up), largest first, each with its steps."""
    pieces: IdlePieces | None = None
    """The idle time as runs of one cause (for a timeline; not in the JSON)."""


_NONE = -1  # no cause: nothing recorded there
# Internal code of a `waits_on_other_threads` rule's time until other threads are consulted.
_WAITING = len(Cause)
_FRAME_RULE_CODES = tuple(_WAITING if r.waits_on_other_threads else int(r.cause) for r in FRAME_RULES)
_WAITING_CAUSE = next(int(r.cause) for r in FRAME_RULES if r.waits_on_other_threads)
# The call-kind sets as lookup tables over call kind codes (np.isin per thread costs 100x more).
_GPU_WORK_KIND = np.array([k in GPU_WORK_KINDS for k in KINDS])
_LENDING_KIND = np.array([k in LENDING_KINDS for k in KINDS])
_STEP_ANNOTATION = re.compile(r"^ProfilerStep#\d+$")

FIRST_LAUNCH_SAMPLE = 256  # launches whose median is the typical launch the first one is set against

# Compiled once for `NameText` scans, as the plain patterns are (those serve names holding a newline).
_FRAME_PATTERNS = tuple(NamePattern(rule.pattern) for rule in FRAME_RULES)
_WARMUP_OPS_PATTERN = NamePattern(WARMUP_OPS.pattern, anchored=True)
_STEP_ANNOTATION_PATTERN = NamePattern(_STEP_ANNOTATION.pattern, anchored=True)


class _ThreadLabels(msgspec.Struct):
    """A thread's host activity as a step function of time: per segment, a cause and who decided it."""

    times: np.ndarray  # segment starts, sorted; segment k is [times[k], times[k+1])
    cause: np.ndarray  # cause code per segment (_NONE: nothing recorded)
    key: np.ndarray  # per segment: name id * 2 + (1 if a runtime call decided, 0 if a frame)


class HostLabels(NamedTuple):
    """Every thread's host activity as a step function of cause (`_ThreadLabels`), worked out once
    for a trace: the GPU-idle split and the loop thread's time (`loop_thread_time`) both read it."""

    threads: list[int]
    """The loop's thread first, then those with runtime calls or ops (`_threads`)."""
    labels: dict[int, _ThreadLabels]
    facts: _NameFacts


def host_labels(timeline: Timeline, thresholds: Thresholds) -> HostLabels:
    """The trace's `HostLabels`."""
    threads = _threads(timeline)
    main = timeline.main_thread
    facts = _NameFacts(timeline.trace)
    # Grouped and classified once for all threads: per thread, a mask over every call would cost
    # O(threads x calls) (150k threads: minutes).
    calls_of = _rows_by_thread(timeline.calls.thread)
    call_cause = _call_causes(timeline, thresholds)
    no_calls = np.zeros(0, dtype=np.int64)
    labels = {
        t: _thread_labels(timeline, t, calls_of.get(t, no_calls), call_cause, thresholds, t != main, facts)
        for t in threads
    }
    return HostLabels(threads, labels, facts)


def idle_breakdown(
    timeline: Timeline, thresholds: Thresholds, host: HostLabels | None = None
) -> IdleBreakdown:
    """Classify every GPU-idle piece of every step by cause (module docstring; rules: `causes`);
    `host`: the trace's `host_labels`, when already worked out."""
    trace = timeline.trace
    n_steps = len(timeline.steps)
    gap_s, gap_e, gap_step = _gaps(timeline)
    host = host if host is not None else host_labels(timeline, thresholds)
    threads, labels, facts = host.threads, host.labels, host.facts
    main = timeline.main_thread

    # Cut the gaps at every boundary of every thread's step function.
    inside = _inside([lab.times for lab in labels.values()], gap_s, gap_e)
    edges = distinct(np.concatenate((gap_s, gap_e, inside)))
    mids = (edges[:-1] + edges[1:]) / 2 if len(edges) > 1 else np.zeros(0)
    g = np.searchsorted(gap_s, mids, side="right") - 1
    in_gap = (g >= 0) & (mids < gap_e[np.maximum(g, 0)]) if len(gap_s) else np.zeros(len(mids), bool)
    mids, g = mids[in_gap], g[in_gap]
    lengths = (edges[1:] - edges[:-1])[in_gap]

    cause = np.full(len(mids), Cause.UNKNOWN, dtype=np.int64)
    key = np.full(len(mids), -1, dtype=np.int64)
    slot = np.full(len(mids), -1, dtype=np.int64)
    if main in labels:
        cause, key = _lookup(labels[main], mids)
        cause = np.where(cause == _NONE, Cause.UNKNOWN, cause)
        slot = np.where(key >= 0, threads.index(main), -1)
    # Where the loop's thread is only in `host`/`unknown`, the profiler's code or waiting on other
    # threads, the strongest cause another thread has at that moment decides.
    lendable = np.isin(cause, (Cause.HOST, Cause.UNKNOWN, Cause.PROFILER, _WAITING))
    piece, lent_cause, lent_key, lent_slot = _lent_by_other_threads(labels, threads, main, mids, lendable)
    cause[piece], key[piece], slot[piece] = lent_cause, lent_key, lent_slot
    cause = np.where(cause == _WAITING, _WAITING_CAUSE, cause)

    # Pieces grouped by (cause, thread, deciding event): the holders of idle time.
    step = gap_step[g] if len(g) else np.zeros(0, dtype=np.int64)
    names_span = 2 * len(trace.names) + 2
    group = (cause * (len(threads) + 1) + (slot + 1)) * names_span + key + 1
    unique, inverse = unique_inverse(group)
    # One-off: warm-up and context creation, when that holder shows in a single step (the same
    # warm-up in several steps, e.g. a search for every new shape, is a steady cost).
    pairs = distinct(inverse * max(n_steps, 1) + step)
    steps_per_group = np.bincount(pairs // max(n_steps, 1), minlength=len(unique))
    decided_by_call = (key >= 0) & (key % 2 == 1)
    context_call = decided_by_call & _context_names(timeline)[np.where(key >= 0, key // 2, 0)]
    one_off_cause = (cause == Cause.WARMUP) | ((cause == Cause.BLOCKING) & context_call)
    one_off = one_off_cause & (steps_per_group[inverse] == 1)

    n_causes = len(Cause)
    steady = ~one_off
    by_step = np.bincount(
        step[steady] * n_causes + cause[steady], weights=lengths[steady], minlength=n_steps * n_causes
    ).reshape(n_steps, n_causes)
    one_off_by_step = np.bincount(step[one_off], weights=lengths[one_off], minlength=n_steps)
    gap_count = np.bincount(gap_step, minlength=n_steps)
    per_step = [
        StepIdle(
            costs=CauseCosts(tuple(round(ms / 1e3, 4) for ms in by_step[i].tolist())),
            one_off_ms=round(float(one_off_by_step[i]) / 1e3, 4),
            gap_count=int(gap_count[i]),
        )
        for i in range(n_steps)
    ]

    holders, one_offs = _holders(timeline, threads, cause, key, slot, pairs, lengths, mids, inverse, one_off)
    host = cause == Cause.HOST
    return IdleBreakdown(
        per_step=per_step,
        holders=holders,
        host_functions=_host_functions(
            trace, threads, key[host], slot[host], mids[host], lengths[host], n_steps, facts
        ),
        one_off=one_offs,
        pieces=_runs(mids - lengths / 2, mids + lengths / 2, cause, one_off),
    )


def _runs(starts: np.ndarray, ends: np.ndarray, cause: np.ndarray, one_off: np.ndarray) -> IdlePieces:
    """Pieces (sorted, not overlapping) joined into runs where one touches the next with the same
    cause and one-off flag: a gap is cut at every host boundary, but drawn once per cause."""
    if not len(starts):
        empty = np.zeros(0)
        return IdlePieces(empty, empty, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=bool))
    touching = starts[1:] <= ends[:-1] + NESTING_SLACK_US
    same = touching & (cause[1:] == cause[:-1]) & (one_off[1:] == one_off[:-1])
    first = np.flatnonzero(np.concatenate(([True], ~same)))
    last = np.concatenate((first[1:] - 1, [len(starts) - 1]))
    return IdlePieces(starts[first], ends[last], cause[first].astype(np.int8), one_off[first])


def _gaps(timeline: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every GPU-idle interval inside a step: starts, ends, step index (sorted by start).

    `Coverage.gaps` for all steps at once (a call per step costs seconds at 200k steps): step i's
    gaps run from its start and each busy interval's end to each busy interval's start and its end,
    clipped to the step.
    """
    busy = timeline.gpu_busy
    a = np.array([w.start_us for w in timeline.steps], dtype=np.float64)
    b = np.array([w.end_us for w in timeline.steps], dtype=np.float64)
    lo = np.searchsorted(busy.ends, a, side="right")
    hi = np.searchsorted(busy.starts, b, side="left")
    per_step = np.maximum(hi - lo, 0) + 1  # busy intervals inside a step, plus one
    step = np.repeat(np.arange(len(a), dtype=np.int64), per_step)
    j = np.arange(len(step)) - np.repeat(np.cumsum(per_step) - per_step, per_step)  # gap j of its step
    first, last = j == 0, j == per_step[step] - 1
    row = lo[step] + j  # gap j lies between busy intervals row - 1 and row
    n_busy = len(busy.starts)
    gs = np.where(first, a[step], busy.ends[np.maximum(row - 1, 0)] if n_busy else 0.0)
    ge = np.where(last, b[step], busy.starts[np.minimum(row, n_busy - 1)] if n_busy else 0.0)
    gs, ge = np.clip(gs, a[step], b[step]), np.clip(ge, a[step], b[step])
    keep = ge > gs
    gs, ge, step = gs[keep], ge[keep], step[keep]
    order = np.argsort(gs, kind="stable")
    return gs[order], ge[order], step[order]


def _inside(sorted_times: list[np.ndarray], gap_s: np.ndarray, gap_e: np.ndarray) -> np.ndarray:
    """The times that fall inside a gap: before the end of the last gap that starts at or before
    them. Every time is bisected once among the gap starts, all threads together: slicing each
    thread's times gap by gap would cost O(threads x gaps) (16k threads with a gap each: seconds)."""
    if len(gap_s) == 0 or not sorted_times:
        return np.zeros(0)
    stop = np.minimum(gap_e, np.append(gap_s[1:], np.inf))  # a time past the next gap's start is that gap's
    times = np.concatenate(sorted_times)
    last = np.searchsorted(gap_s, times, side="right") - 1
    held = last >= 0
    held[held] = times[held] < stop[last[held]]
    return times[held]


def _threads(timeline: Timeline) -> list[int]:
    """The threads whose activity can explain idle time: the loop's, then those with runtime calls."""
    trace = timeline.trace
    threads = [timeline.main_thread] if timeline.main_thread is not None else []
    active = set(timeline.calls.thread.tolist()) | set(trace.events["cpu_op"].thread.tolist())
    return threads + sorted(t for t in active if t != timeline.main_thread)


def _lent_by_other_threads(
    labels: dict[int, _ThreadLabels],
    threads: list[int],
    main: int | None,
    mids: np.ndarray,
    lendable: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the loop's thread can be lent a cause (`lendable`, per piece at `mids`), what the other
    threads lend: (piece, cause, key, slot). The strongest cause of `LENT_BY_OTHER_THREADS` wins,
    the earliest thread in `threads` on a tie.

    Only the segments with a lendable cause are matched to the pieces they cover, by bisection over
    all threads at once: looking every piece up in every thread's step function would cost
    O(threads x pieces) (150k threads: hours).
    """
    n_lent = len(LENT_BY_OTHER_THREADS)
    strength = np.full(len(Cause) + 2, n_lent, dtype=np.int64)  # _NONE (-1) reads the last entry
    strength[[int(c) for c in LENT_BY_OTHER_THREADS]] = np.arange(n_lent)
    others = [(s, labels[t]) for s, t in enumerate(threads) if t != main]
    empty = np.zeros(0, dtype=np.int64)
    if not others or not len(mids):
        return empty, empty, empty, empty
    sizes = np.array([len(lab.times) for _, lab in others], dtype=np.int64)
    times = np.concatenate([lab.times for _, lab in others])
    seg_cause = np.concatenate([lab.cause for _, lab in others]).astype(np.int64)
    seg_key = np.concatenate([lab.key for _, lab in others]).astype(np.int64)
    seg_slot = np.repeat(np.array([s for s, _ in others], dtype=np.int64), sizes)
    # Segment k of a thread is [times[k], times[k+1]); its last one never ends. Where each time
    # falls among the pieces, bisected once: a segment ends where the next one starts.
    at = np.append(np.searchsorted(mids, times, side="left"), len(mids))
    at_end = at[1:].copy()
    at_end[np.cumsum(sizes)[sizes > 0] - 1] = len(mids)
    seg = np.flatnonzero(strength[seg_cause] < n_lent)
    lo = at[seg]
    counts = at_end[seg] - lo
    # Every (piece, segment) pair: the pieces lo, lo+1, ... of each segment.
    seg = np.repeat(seg, counts)
    piece = np.repeat(lo, counts) + np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
    take = lendable[piece]
    piece, seg = piece[take], seg[take]
    order = np.lexsort((seg_slot[seg], strength[seg_cause[seg]], piece))
    first = order[np.r_[True, piece[order][1:] != piece[order][:-1]]] if len(order) else order
    seg = seg[first]
    return piece[first], seg_cause[seg], seg_key[seg], seg_slot[seg]


def _rows_by_thread(thread: np.ndarray) -> dict[int, np.ndarray]:
    """Per thread, the rows of a table on it, in table order."""
    order = np.argsort(thread, kind="stable")
    values, first = np.unique(thread[order], return_index=True)
    if not len(order):
        return {}
    return dict(zip(values.tolist(), np.split(order, first[1:]), strict=True))


def _lookup(labels: _ThreadLabels, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (cause, key) of a thread's step function at each time."""
    k = np.searchsorted(labels.times, times, side="right") - 1
    kc = np.maximum(k, 0)
    if len(labels.times) == 0:
        return np.full(len(times), _NONE, dtype=np.int64), np.full(len(times), -1, dtype=np.int64)
    return np.where(k >= 0, labels.cause[kc], _NONE), np.where(k >= 0, labels.key[kc], -1)


class _NameFacts:
    """What the classification needs to know about a frame name, worked out once per name.

    Kept as columns over all names, so a thread's lookup is a few array indexings (with 150k threads
    a per-thread Python pass over its names cost seconds).
    """

    def __init__(self, trace):
        self.names = trace.names
        self._trace = trace
        n = len(self.names)
        self._done = np.zeros(n, dtype=bool)
        self._rule = np.full(n, _NONE, dtype=np.int64)
        self._flags = np.zeros((4, n), dtype=bool)

    @cached_property
    def layout(self) -> CodeLayout:
        """The run's code layout, else this process's: only Python frames need it (working out this
        process's costs ~11M instructions, a trace without stacks skips it)."""
        return getattr(self._trace, "code_layout", None) or current_layout()

    def of(self, name_ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per name id (repeats allowed): rule cause, warm-up op, step annotation, named Python,
        stdlib Python."""
        new = distinct(name_ids[~self._done[name_ids]])
        if new.size:
            names = [self.names[nid] for nid in new.tolist()]
            self._rule[new], self._flags[0, new], self._flags[1, new] = _name_rules(names)
            parsed = [parse_py_frame(name) for name in names]
            self._flags[2, new] = [frame is not None for frame in parsed]
            self._flags[3, new] = [
                frame is not None and library_of(frame.file, self.layout) == "python" for frame in parsed
            ]
            self._done[new] = True
        flags = self._flags[:, name_ids]
        return (self._rule[name_ids], flags[0], flags[1], flags[2], flags[3])


def _name_rules(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame name: its FRAME_RULES cause (the first rule that matches, else _NONE), whether it
    is a warm-up op, and whether it is a step annotation; all names at once (`name_patterns`)."""
    text = NameText(names)
    rule = np.full(len(names), _NONE, dtype=np.int64)
    for code, pattern in zip(_FRAME_RULE_CODES, _FRAME_PATTERNS, strict=True):
        rule[(rule == _NONE) & text.matches(pattern)] = code
    return rule, text.matches(_WARMUP_OPS_PATTERN), text.matches(_STEP_ANNOTATION_PATTERN)


def _thread_labels(
    timeline: Timeline,
    thread: int,
    on_thread: np.ndarray,
    call_cause: np.ndarray,
    thresholds: Thresholds,
    lend_only: bool,
    facts: _NameFacts,
) -> _ThreadLabels:
    """A thread's cause at every moment: its frames' causes, overlaid with its runtime calls'.

    `on_thread`: the rows of `timeline.calls` on the thread; `call_cause`: `_call_causes` of every call.
    """
    trace = timeline.trace
    frames = trace.frames(thread)
    n = len(frames.parent)
    parent = frames.parents
    name_ids = np.asarray(frames.name_ids, dtype=np.int64)
    is_op = frames.category_codes == FRAME_CATEGORIES.index("cpu_op")
    is_py = frames.category_codes == FRAME_CATEGORIES.index("python_function")
    starts, ends = frames.starts, frames.ends

    calls = timeline.calls
    kinds = timeline.call_kind[on_thread]
    gpu_work = _GPU_WORK_KIND[kinds]
    work_starts = calls.start_us[on_thread[gpu_work]]

    # Per frame, from its name (worked out once per name): its FRAME_RULES cause, whether it is a
    # warm-up op, a step annotation, a named Python frame, a standard-library one.
    own, warm_op, step_frame, named_py, stdlib_py = facts.of(name_ids)
    if lend_only:  # other threads lend only what they do in ops and calls, not their Python
        own = np.where((own == Cause.INPUT) | (own == _WAITING) | (own == Cause.PROFILER), _NONE, own)

    # Warm-up op calls: first of their op on this thread, or an outlier; and long enough. Not inside
    # a warm-up frame (torch.compile tracing through `aten::linear`): that frame's warm-up holds there,
    # so a compile that recurs every step stays one recurring cost.
    candidates = np.flatnonzero(is_op & warm_op)
    if candidates.size and (own == Cause.WARMUP).any():
        candidates = candidates[nearest_marked(parent, own == Cause.WARMUP)[candidates] < 0]
    if candidates.size:
        durations = ends[candidates] - starts[candidates]
        cand_names = name_ids[candidates]
        for nid in distinct(cand_names).tolist():
            members = candidates[cand_names == nid]
            member_dur = durations[cand_names == nid]
            first = members[np.argmin(starts[members])]
            typical = median(member_dur.tolist())
            warm = (member_dur >= thresholds.warmup_call_min_ms * 1e3) & (
                (members == first) | (member_dur >= thresholds.warmup_call_ratio * typical)
            )
            own[members[warm & (own[members] == _NONE)]] = Cause.WARMUP

    # The nearest enclosing rule holds inside its frame (a `profiler` one over its own code only); a
    # launching op chain is `launch` for its innermost time unless a rule sits inside the chain
    # (innermost first).
    named_code = is_py & named_py & ~stdlib_py  # user or library Python, not the standard library
    region = _through_profiler(parent, own, nearest_marked(parent, own != _NONE), named_code)
    chain_top = nearest_marked(parent, is_op & ~np.concatenate(([False], is_op))[np.maximum(parent + 1, 0)])
    # Whether a chain's top op launched GPU work: asked of the tops only (gpt2_pathologies' main
    # thread: 2,316 of 22,984 frames).
    has_work = np.zeros(n, dtype=bool)
    tops = distinct(chain_top[chain_top >= 0])
    if work_starts.size and tops.size:
        has_work[tops] = np.searchsorted(work_starts, ends[tops], side="right") > np.searchsorted(
            work_starts, starts[tops]
        )
    top = np.maximum(chain_top, 0)
    launching = is_op & (chain_top >= 0) & has_work[top] & ~(region >= chain_top)
    cause = np.where(region >= 0, own[np.maximum(region, 0)], _NONE)
    cause = np.where(launching, Cause.LAUNCH, cause)
    unresolved = cause == _NONE
    if not lend_only:  # other threads lend only their calls, rules and launching ops
        cause = np.where(unresolved, np.where(step_frame, Cause.UNKNOWN, Cause.HOST), cause)
    # Who decided: the rule's frame, the innermost op of a launching chain, or (host time) the
    # innermost named Python frame, else the frame itself.
    # Host time is named by the innermost Python function outside the standard library (the code
    # that called inspect/logging/threading), else the innermost Python function.
    named = nearest_marked(parent, named_code)
    named = np.where(named >= 0, named, nearest_marked(parent, is_py & named_py))
    decider = np.where(
        launching, np.arange(n), np.where(region >= 0, region, np.where(named >= 0, named, np.arange(n)))
    )
    frame_key = name_ids[np.maximum(decider, 0)] * 2 if n else np.zeros(0, dtype=np.int64)
    frame_key = np.where(step_frame & unresolved, -1, frame_key)

    # Step function of the frames: at a frame's start it is innermost; at its end its parent is.
    times = np.concatenate((starts, ends))
    seg_frame = np.concatenate((np.arange(n), parent))
    is_end = np.concatenate((np.zeros(n, dtype=bool), np.ones(n, dtype=bool)))
    # Ties: ends before starts; inner ends (higher index) before outer; outer starts before inner.
    tie = np.concatenate((np.arange(n), -np.arange(n)))
    order = np.lexsort((tie, ~is_end, times))
    times, seg_frame = times[order], seg_frame[order]
    seg_cause = np.where(seg_frame >= 0, cause[np.maximum(seg_frame, 0)] if n else _NONE, _NONE)
    seg_key = np.where(seg_frame >= 0, frame_key[np.maximum(seg_frame, 0)] if n else -1, -1)

    # Runtime calls overlay the frames (innermost), except inside warm-up.
    call_cause = call_cause[on_thread]
    if lend_only:
        lendable = _LENDING_KIND[kinds]
        call_cause = np.where(lendable, call_cause, _NONE)
    cs, ce = calls.start_us[on_thread], calls.end_us[on_thread]
    frame_at_call, frame_key_at_call = _lookup(_ThreadLabels(times, seg_cause, seg_key), (cs + ce) / 2)
    absorbed = (frame_at_call == Cause.WARMUP) & (kinds != KINDS.index("context"))
    call_cause = np.where(absorbed & (call_cause != _NONE), Cause.WARMUP, call_cause)
    call_key = calls.name[on_thread].astype(np.int64) * 2 + 1
    # A call absorbed by warm-up is held by the warm-up frame (the first cuDNN convolution, ...).
    call_key = np.where(absorbed, frame_key_at_call, call_key)
    keep = call_cause != _NONE
    cs, ce, call_cause, call_key = cs[keep], ce[keep], call_cause[keep], call_key[keep]
    return _overlay(_ThreadLabels(times, seg_cause, seg_key), cs, ce, call_cause, call_key)


def _through_profiler(
    parent: np.ndarray, own: np.ndarray, region: np.ndarray, named_code: np.ndarray
) -> np.ndarray:
    """`region` (per frame, the frame whose rule holds there, or -1) with `profiler` frames holding
    only the profiler's own code: a frame of `named_code` (named Python outside the standard
    library: user or library code) inside a profiler frame, and all inside it, take the rule that
    holds outside the profiler's frames, as without them. A wrapper's call to the original keeps
    its cause; the stdlib, builtins and ops the profiler's code calls stay `profiler`."""
    in_profiler = (region >= 0) & (own[np.maximum(region, 0)] == Cause.PROFILER)
    through = in_profiler & (own == _NONE) & named_code
    if not through.any():
        return region
    outside = nearest_marked(parent, (own != _NONE) & (own != Cause.PROFILER))
    inner = nearest_marked(parent, (own != _NONE) | through)  # the nearest rule frame or way through
    at = np.maximum(inner, 0)
    return np.where(inner >= 0, np.where(through[at], outside[at], inner), -1)


def _call_causes(timeline: Timeline, thresholds: Thresholds) -> np.ndarray:
    """The cause of each runtime call (`CALL_CAUSES`, blocking copies, long launches, capture)."""
    trace = timeline.trace
    calls = timeline.calls
    kinds = timeline.call_kind
    by_kind = np.array([CALL_CAUSES[k] for k in KINDS], dtype=np.int64)
    cause = by_kind[kinds] if len(kinds) else np.zeros(0, dtype=np.int64)
    names = calls.name
    blocking_copy = blocking_copies(trace.names, timeline.name_kind)  # the kinds already known per name
    capture = trace.names_matching(lambda n: CAPTURE_CALLS.match(n) is not None)
    cause = np.where(blocking_copy[names], Cause.BLOCKING, cause)
    long_launch = (kinds == KINDS.index("launch")) & (calls.dur_us >= thresholds.long_launch_us)
    cause = np.where(long_launch | capture[names], Cause.WARMUP, cause)
    # The trace's first launch pays the profiler's start-up (CUPTI instrumenting the first kernel of
    # its window: 30-140 µs against a 5-9 µs median in every H200 trace here, 2026-11-25).
    launches = np.flatnonzero(kinds == KINDS.index("launch"))
    if len(launches) > 1:
        first = launches[0]
        typical = median(calls.dur_us[launches[:FIRST_LAUNCH_SAMPLE]].tolist())
        slow = calls.dur_us[first] >= thresholds.profiler_first_launch_ratio * typical
        if slow and not long_launch[first]:
            cause[first] = Cause.PROFILER
    return cause


def _overlay(
    labels: _ThreadLabels, cs: np.ndarray, ce: np.ndarray, call_cause: np.ndarray, call_key: np.ndarray
) -> _ThreadLabels:
    """The step function with runtime calls laid over it: inside a call, the call decides.

    In O(n) over the frames' times: a call's boundaries are inserted, not sorted in, and the call
    at each time is counted, not searched for (sorting and bisecting every time cost 1.8x the
    instructions, over the 16 threads of six fixtures).
    """
    if len(cs) == 0:
        return labels
    # The frames' step function at its distinct times: at a repeated time the last entry holds.
    last = np.ones(len(labels.times), dtype=bool)
    last[:-1] = labels.times[1:] != labels.times[:-1]
    times, cause, key = labels.times[last], labels.cause[last], labels.key[last]
    # The call boundaries it lacks, with the frames' values there.
    extra = distinct(np.concatenate((cs, ce)))
    at = np.searchsorted(times, extra)
    lacking = (at == len(times)) | (times[np.minimum(at, len(times) - 1)] != extra) if len(times) else at == 0
    extra, at = extra[lacking], at[lacking]
    extra_cause, extra_key = _lookup(labels, extra)
    times, cause = np.insert(times, at, extra), np.insert(cause, at, extra_cause)
    key = np.insert(key, at, extra_key)
    # The call covering each time: the latest started whose end is after it. With overlapping
    # calls (a driver call inside a runtime call) the latest started one decides. The calls are in
    # start order, so the latest started is the count of starts at or before the time, less one.
    k = np.cumsum(np.bincount(np.searchsorted(times, cs), minlength=len(times))) - 1
    kc = np.maximum(k, 0)
    inside = (k >= 0) & (ce[kc] > times)
    return _ThreadLabels(times, np.where(inside, call_cause[kc], cause), np.where(inside, call_key[kc], key))


def _context_names(timeline: Timeline) -> np.ndarray:
    """Per name: is it a runtime call of kind `context` (context creation, a one-off cost)?"""
    return timeline.name_kind == KINDS.index("context")


def _holders(
    timeline, threads, cause, key, slot, group_steps, lengths, mids, group, one_off
) -> tuple[list[IdleHolder], list[IdleHolder]]:
    """The largest (cause, event) holders of steady idle time, and the one-off ones with their steps."""
    trace = timeline.trace
    n_steps = max(len(timeline.steps), 1)
    if len(group) == 0:
        return [], []
    total = np.bincount(group, weights=lengths)
    first_of_group = _longest_piece(group, lengths, len(total))  # to describe where it happened
    holders: list[IdleHolder] = []
    one_offs: list[IdleHolder] = []
    for gi in np.argsort(-total)[:HOLDERS_SCANNED].tolist():
        piece = int(first_of_group[gi])
        c, k, s = int(cause[piece]), int(key[piece]), int(slot[piece])
        thread = threads[s] if s >= 0 else None
        steps = None
        if bool(one_off[piece]):
            # group_steps: the sorted distinct values of group * n_steps + step
            lo, hi = np.searchsorted(group_steps, [gi * n_steps, (gi + 1) * n_steps])
            steps = tuple(sorted(timeline.steps[x % n_steps].number for x in group_steps[lo:hi].tolist()))
        elif len(holders) >= HOLDERS_KEPT:
            continue
        holder = IdleHolder(
            cause=Cause(c),
            event=trace.names[k // 2] if k >= 0 else None,
            source=("runtime call" if k % 2 else "frame") if k >= 0 else None,
            op=_enclosing_op(trace, thread, float(mids[piece])) if thread is not None else None,
            idle_ms=round(float(total[gi]) / 1e3, 4),
            idle_ms_per_step=round(float(total[gi]) / 1e3 / n_steps, 4),
            steps=steps,
        )
        (one_offs if steps is not None else holders).append(holder)
    return holders, one_offs


def _longest_piece(group: np.ndarray, lengths: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group (0 .. n_groups - 1, each with a piece), its longest piece, the first of equally
    long ones: the group's maximum, then its first piece at that maximum. O(n): a lexsort by group
    and length cost 2-5 ms per trace."""
    longest = np.full(n_groups, -np.inf)
    np.maximum.at(longest, group, lengths)
    at_longest = np.flatnonzero(lengths == longest[group])
    first = np.full(n_groups, len(group), dtype=np.int64)
    np.minimum.at(first, group[at_longest], at_longest)
    return first


def _enclosing_op(trace, thread: int, t: float) -> str | None:
    """The outermost cpu_op enclosing time `t` on `thread`, else the innermost annotation."""
    frames = trace.frames(thread)
    inner = frames.innermost(t, t)
    op = int(frames.outermost_op(np.array([inner]))[0])
    if op >= 0:
        return trace.names[int(frames.name_ids[op])]
    notes = [
        trace.names[int(frames.name_ids[i])]
        for i in frames.chain(inner)
        if frames.categories[i] == "user_annotation"
        and not _STEP_ANNOTATION.match(trace.names[int(frames.name_ids[i])])
    ]
    return notes[-1] if notes else None


def _host_functions(
    trace, threads, keys, slots, mids, lengths, n_steps: int, facts: _NameFacts
) -> list[HostFunction]:
    """`host` idle time by the innermost named Python function (else op or annotation), largest first."""
    valid = keys >= 0
    if not valid.any():
        return []
    keys, slots, mids, lengths = keys[valid], slots[valid], mids[valid], lengths[valid]
    unique, inverse = unique_inverse(keys // 2)
    totals = np.bincount(inverse, weights=lengths)
    longest = _longest_piece(inverse, lengths, len(totals))
    out = []
    for u in np.argsort(-totals)[:HOST_FUNCTIONS_KEPT].tolist():
        name = trace.names[int(unique[u])]
        parsed = parse_py_frame(name)
        piece = int(longest[u])
        stack = (
            _python_stack(trace, threads[int(slots[piece])], float(mids[piece])) if slots[piece] >= 0 else []
        )
        caller = next(
            (f for f in stack if library_of(f.file, facts.layout) not in ("torch", "python") and f != parsed),
            None,
        )
        out.append(
            HostFunction(
                file=parsed.file if parsed else None,
                function=parsed.function if parsed else name,
                code=_code_kind(parsed, facts) if parsed else None,
                idle_ms_per_step=round(float(totals[u]) / 1e3 / max(n_steps, 1), 4),
                called_from=f"{caller.file} {caller.function}" if caller else None,
                stack=[f"{f.file} {f.function}" for f in stack[:HOST_FUNCTION_STACK_FRAMES]],
            )
        )
    return out


def _code_kind(frame: PyFrame, facts: _NameFacts) -> str:
    return "user" if is_user_file(frame.file, facts.layout) else "library"


def _python_stack(trace, thread: int, t: float) -> list:
    """The named Python frames enclosing time `t` on `thread`, innermost first."""
    frames = trace.frames(thread)
    chain = frames.chain(frames.innermost(t, t))
    parsed = [parse_py_frame(trace.names[int(frames.name_ids[i])]) for i in reversed(chain)]
    return [p for p in parsed if p is not None]


class LoopHolder(msgspec.Struct, frozen=True):
    """Host time on the loop's thread over whole steps (not only while the GPU idles), held by one
    (cause, deciding event): the frame or runtime call that decided (`event`, None where nothing was
    recorded), ms per step, the part of it in unbroken stretches of at least `LONG_STRETCH_MS`, and
    its longest stretch in ms."""

    cause: Cause
    event: str | None
    ms_per_step: float
    long_ms_per_step: float
    longest_ms: float


LONG_STRETCH_MS = 1.0
"""An unbroken stretch of host time in one holder this long is a stall of its own (a sleep, a batch
being fetched, a blocking call): the profiler's cost per op and the Python between ops come as
stretches of 10-500 µs (every fixture here, 2026-11-28)."""


def loop_thread_time(
    timeline: Timeline, host: HostLabels, outside: Coverage | None = None
) -> list[LoopHolder]:
    """What the loop's thread did over the steps, by (cause, deciding event), most time first: the
    causes of `causes` over the whole step, not only while the GPU idles. Where the loop's thread
    records nothing or only waits on other threads (`loss.backward()` while autograd's thread runs
    the backward), what another thread does then decides, as in the GPU-idle split; its named code
    stays its own. `outside`: time to leave out (a CPU-only trace's ops, which are its work).

    The GPU-idle split (`idle_breakdown`) says what the host did while the GPU waited; this says
    what it did at all, which is what ranks of one job can be compared on: a rank's GPU waits inside
    a collective for a later rank, and its host's time then shows as no GPU-idle time at all."""
    main = timeline.main_thread
    if main is None or main not in host.labels or not timeline.steps:
        return []
    trace = timeline.trace
    labels = host.labels[main]
    a = np.array([w.start_us for w in timeline.steps], dtype=np.float64)
    b = np.array([w.end_us for w in timeline.steps], dtype=np.float64)
    # The step function's segments cut at the steps' edges, each clipped to its step.
    edges = distinct(np.concatenate((labels.times, a, b)))
    starts, ends = edges[:-1], edges[1:]
    step = np.searchsorted(a, starts, side="right") - 1
    inside = (step >= 0) & (starts < b[np.maximum(step, 0)])
    starts, ends = starts[inside], ends[inside]
    mids = (starts + ends) / 2
    cause, key = _lookup(labels, mids)
    cause = np.where(cause == _NONE, Cause.UNKNOWN, cause)
    lendable = np.isin(cause, (Cause.UNKNOWN, _WAITING))
    piece, lent_cause, lent_key, _ = _lent_by_other_threads(host.labels, host.threads, main, mids, lendable)
    cause[piece], key[piece] = lent_cause, lent_key
    # The loop's thread blocks in `loss.backward()` while autograd's thread runs the backward; without
    # stacks nothing on it says so, and between the engine's ops no other thread lends a cause.
    in_backward = (cause == Cause.UNKNOWN) & (_backward_spans(timeline).covered(starts, ends) > 0)
    cause = np.where(in_backward | (cause == _WAITING), _WAITING_CAUSE, cause)
    lengths = ends - starts
    if outside is not None:
        lengths = lengths - outside.covered(starts, ends)
    keep = lengths > 0
    if not keep.any():
        return []
    cause, key, starts, ends, lengths = cause[keep], key[keep], starts[keep], ends[keep], lengths[keep]
    group = cause * (2 * len(trace.names) + 2) + key + 1
    unique, inverse = unique_inverse(group)
    totals = np.bincount(inverse, weights=lengths)
    # Stretches: touching segments of one group run together (a 80 ms sleep is one stretch; the
    # profiler's cost between ops is many short ones).
    apart = (inverse[1:] != inverse[:-1]) | (starts[1:] > ends[:-1] + NESTING_SLACK_US)
    run_start = np.concatenate(([True], apart))
    run_id = np.cumsum(run_start) - 1
    run_length = np.bincount(run_id, weights=lengths)
    longest = np.zeros(len(unique))
    np.maximum.at(longest, inverse[run_start], run_length)
    long_runs = run_length >= LONG_STRETCH_MS * 1e3
    in_long = np.bincount(inverse[run_start][long_runs], weights=run_length[long_runs], minlength=len(unique))
    first_of = np.unique(inverse, return_index=True)[1]
    n = len(timeline.steps)
    out = []
    for u in np.argsort(-totals)[:LOOP_HOLDERS_KEPT].tolist():
        first = int(first_of[u])
        k = int(key[first])
        out.append(
            LoopHolder(
                cause=Cause(int(cause[first])),
                event=trace.names[k // 2] if k >= 0 else None,
                ms_per_step=round(float(totals[u]) / 1e3 / n, 4),
                long_ms_per_step=round(float(in_long[u]) / 1e3 / n, 4),
                longest_ms=round(float(longest[u]) / 1e3, 4),
            )
        )
    return out


def _backward_spans(timeline: Timeline) -> Coverage:
    """Per step, from the first to the last op of each thread other than the loop's that runs
    autograd's engine (`autograd::engine::evaluate_function: ...`) inside it: the backward pass."""
    from trainprof.analysis.intervals import Coverage

    trace = timeline.trace
    ops = trace.events["cpu_op"]
    engine = trace.names_matching(lambda name: name.startswith("autograd::engine::evaluate_function"))
    rows = np.flatnonzero(engine[ops.name] & (ops.thread != (timeline.main_thread or -1)))
    if not rows.size:
        return Coverage(np.zeros(0), np.zeros(0))
    step = timeline.step_of(ops.start_us[rows])
    rows, step = rows[step >= 0], step[step >= 0]
    group = step * (int(ops.thread.max()) + 1) + ops.thread[rows]
    unique, inverse = unique_inverse(group)
    first = np.full(len(unique), np.inf)
    last = np.full(len(unique), -np.inf)
    np.minimum.at(first, inverse, ops.start_us[rows])
    np.maximum.at(last, inverse, ops.end_us[rows])
    return Coverage(first, last)
