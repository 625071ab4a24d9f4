"""The op table (as torch's `key_averages()` gives it) and the kernel table, over the profiled steps.

Op table, per op name: its calls, its host time in total and by itself (less the ops it called),
and its GPU time in total and by itself. An op's own GPU time is that of the kernels, copies and
memsets whose launch call it encloses innermost; its total adds that of the ops it called. A backward
kernel counts for the backward op that launched it (`autograd::engine::evaluate_function: ...` and
the ops inside it), as in `key_averages()`. An op counts when it starts inside a step; a GPU event
when the call that launched it is inside one (as in `steps`).

Kernel table, per distinct kernel name (the full demangled name): calls, GPU time, mean, share of
all kernel time, and the category (`timeline_view.kernel_categories`) and op with the most of its
time (a name can run under several: an opaque GEMM in two dtypes).
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.arrays import distinct, unique_inverse
from trainprof.analysis.attribution import KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import KERNEL_TABLE_ROWS, OP_TABLE_ROWS
from trainprof.analysis.timeline import Timeline, _join_correlation
from trainprof.analysis.timeline_view import CATEGORIES, kernel_categories
from trainprof.trace.model import FRAME_CATEGORIES


class OpRow(Record, frozen=True):
    """One op name over the profiled steps (module docstring)."""

    op: str
    calls: int
    cpu_total_ms: float
    cpu_self_ms: float
    gpu_total_ms: float
    gpu_self_ms: float


class KernelRow(Record, frozen=True):
    """One kernel name over the profiled steps; `category` (a `timeline_view.CATEGORIES` key) and `op`
    are those with the most of its time (`op` None: none)."""

    name: str
    category: str
    calls: int
    total_ms: float
    mean_us: float
    pct: float
    op: str | None


def op_table(timeline: Timeline) -> list[OpRow]:
    """The ops by GPU time, then host time, most first (at most `OP_TABLE_ROWS`)."""
    trace, calls = timeline.trace, timeline.calls
    op_code = FRAME_CATEGORIES.index("cpu_op")
    names_n = len(trace.names)
    count = np.zeros(names_n)
    cpu_total, cpu_self = np.zeros(names_n), np.zeros(names_n)
    gpu_total, gpu_self = np.zeros(names_n), np.zeros(names_n)

    # Per GPU event launched inside a step: its launch call (thread, span) and its GPU time.
    launch_thread, launch_start, launch_end, gpu_us = [], [], [], []
    for category in ("kernel", "gpu_memcpy", "gpu_memset"):
        table = trace.events[category]
        call = timeline.kernel_call if category == "kernel" else _join_correlation(
            table.correlation, calls.correlation
        )
        if not len(table) or not len(calls):
            continue
        launched = call >= 0
        in_step = np.zeros(len(table), dtype=bool)
        in_step[launched] = timeline.step_of(calls.start_us[call[launched]]) >= 0
        rows = call[in_step]
        launch_thread.append(calls.thread[rows])
        launch_start.append(calls.start_us[rows])
        launch_end.append(calls.end_us[rows])
        gpu_us.append(table.dur_us[in_step])
    launch_thread_all = np.concatenate(launch_thread) if launch_thread else np.zeros(0, np.int32)
    launch_start_all = np.concatenate(launch_start) if launch_start else np.zeros(0)
    launch_end_all = np.concatenate(launch_end) if launch_end else np.zeros(0)
    gpu_us_all = np.concatenate(gpu_us) if gpu_us else np.zeros(0)

    cpu_ops = trace.events["cpu_op"]
    for thread in distinct(cpu_ops.thread).tolist():
        frames = trace.frames(int(thread))
        is_op = frames.category_codes == op_code
        dur = frames.ends - frames.starts
        counted = is_op & (timeline.step_of(frames.starts) >= 0)
        op_parent = frames.enclosing_op(frames.parents)  # per frame, the nearest op above it
        # Host: each op's duration, less that of the ops directly inside it.
        child = np.flatnonzero(is_op & (op_parent >= 0))
        children_us = np.bincount(op_parent[child], weights=dur[child], minlength=len(dur))
        own_us = np.maximum(dur - children_us, 0.0)
        # GPU: each event to the innermost op around its launch, then up through the enclosing ops.
        on = launch_thread_all == thread
        innermost = frames.enclosing_op(frames.innermost_of(launch_start_all[on], launch_end_all[on]))
        has_op = innermost >= 0
        gpu_own = np.bincount(innermost[has_op], weights=gpu_us_all[on][has_op], minlength=len(dur))
        gpu_in = gpu_own.copy()
        # Each op's total, walking every op's own time up its chain of enclosing ops (a few levels).
        carry, at = gpu_own[is_op], op_parent[is_op]
        while len(at):
            up = at >= 0
            carry, at = carry[up], at[up]
            np.add.at(gpu_in, at, carry)
            at = op_parent[at]
        rows = np.flatnonzero(counted)
        ids = frames.name_ids[rows]
        count += np.bincount(ids, minlength=names_n)
        cpu_total += np.bincount(ids, weights=dur[rows], minlength=names_n)
        cpu_self += np.bincount(ids, weights=own_us[rows], minlength=names_n)
        gpu_total += np.bincount(ids, weights=gpu_in[rows], minlength=names_n)
        gpu_self += np.bincount(ids, weights=gpu_own[rows], minlength=names_n)

    present = np.flatnonzero(count)
    order = present[np.lexsort((-cpu_total[present], -gpu_total[present]))][:OP_TABLE_ROWS]
    return [
        OpRow(
            op=trace.names[i],
            calls=int(count[i]),
            cpu_total_ms=round(float(cpu_total[i]) / 1e3, 4),
            cpu_self_ms=round(float(cpu_self[i]) / 1e3, 4),
            gpu_total_ms=round(float(gpu_total[i]) / 1e3, 4),
            gpu_self_ms=round(float(gpu_self[i]) / 1e3, 4),
        )
        for i in order.tolist()
    ]


def kernel_table(timeline: Timeline, owners: KernelOwners, work: KernelWork | None = None) -> list[KernelRow]:
    """The kernels launched in the steps by GPU time, most first (at most `KERNEL_TABLE_ROWS`);
    `work` as for `timeline_view`."""
    trace, kernels = timeline.trace, timeline.kernels
    rows = np.flatnonzero(timeline.kernel_step >= 0)
    total_us = float(kernels.dur_us[rows].sum())
    if not len(rows):
        return []
    names, by_name = unique_inverse(kernels.name[rows].astype(np.int64))
    dur_us = kernels.dur_us[rows]
    time_us = np.bincount(by_name, weights=dur_us)
    calls = np.bincount(by_name)
    top_op = _most_time(by_name, owners.op[rows] + 1, len(owners.ops) + 1, dur_us)  # 0: no op
    category = _most_time(by_name, kernel_categories(timeline, rows, work), len(CATEGORIES), dur_us)
    ranked = np.argsort(-time_us, kind="stable")[:KERNEL_TABLE_ROWS]
    return [
        KernelRow(
            name=trace.names[int(names[k])],
            category=CATEGORIES[int(category[k])],
            calls=int(calls[k]),
            total_ms=round(float(time_us[k]) / 1e3, 4),
            mean_us=round(float(time_us[k]) / float(calls[k]), 3),
            pct=round(100.0 * float(time_us[k]) / total_us, 2) if total_us > 0 else 0.0,
            op=owners.ops[int(top_op[k]) - 1] if top_op[k] > 0 else None,
        )
        for k in ranked.tolist()
    ]


def _most_time(group: np.ndarray, key: np.ndarray, keys: int, weight_us: np.ndarray) -> np.ndarray:
    """Per group (0, 1, ... of `group`), its key (0 to `keys` - 1) with the most `weight_us`; ties
    go to the smaller key. One pass over the (group, key) pairs, largest first per group."""
    pair, by_pair = unique_inverse(group.astype(np.int64) * keys + key)
    pair_us = np.bincount(by_pair, weights=weight_us)
    order = np.lexsort((-pair_us, pair // keys))
    first = order[np.concatenate(([True], np.diff(pair[order] // keys) != 0))]
    top = np.zeros(int(group.max(initial=-1)) + 1, dtype=np.int64)
    top[pair[first] // keys] = pair[first] % keys
    return top
