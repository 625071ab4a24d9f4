"""What one rank's steps did, on the measures the profiler does not distort: the facts ranks of one
job are compared on (`trainprof.analysis.distributed` judges them; nothing here makes a finding).

torch.profiler costs the host time per op and leaves the kernels' speed alone (H200, 2026-11-28:
recorded DDP and FSDP2 steps 1.6-2.2x their un-profiled length, the same kernels). Across ranks that
do the same work, whichever host the profiler slows most falls behind, and the others wait for it
inside collectives: a skew that no rank's code causes. What does not move with the profiler:

- **work**: the GPU's compute time (kernels other than communication), the kernels launched, and
  the FLOPs of the matrix products and attention ops their recorded shapes give (uneven batches or
  sequence lengths change them; a CPU-only trace's work is its ops);
- **one-rank host causes**: what the loop's thread did over the whole step, by cause and by the
  frame that held it (`idle.loop_thread_time`): input, named host code, code the trace does not
  record (a `time.sleep` without stacks), blocking runtime calls. A cause of one rank shows there
  as time the other ranks do not have; the profiler's cost shows as the same frames a little
  longer on every rank. Waiting (syncs, collectives) and launching are left out: a rank that waits
  for another blocks there, and the profiler's cost per op lands in launching.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.causes import Cause
from trainprof.analysis.idle import HostLabels, loop_thread_time
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.kernel_classes import ATTENTION_OPS
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import RANK_OPS_KEPT
from trainprof.analysis.work import op_work
from trainprof.trace.model import FRAME_CATEGORIES, NESTING_SLACK_US

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.timeline import Timeline

HOST_CAUSES = (Cause.INPUT, Cause.HOST, Cause.UNKNOWN, Cause.BLOCKING)
"""The loop thread's causes that can be one rank's own (module docstring); the others are waiting
(sync, comm), launching, warm-up or the profiler's own code."""

# Matrix products and attention ops counted once each: the ops that hold the FLOPs themselves, not
# the wrappers around them (`aten::linear` calls `aten::addmm`, `aten::matmul` calls `aten::mm`).
_FLOP_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_int_mm",
     "aten::_scaled_mm", "aten::_addmm_activation"}
) | frozenset(ATTENTION_OPS)


_CPU_OP = FRAME_CATEGORIES.index("cpu_op")


class OpFlops(Record, frozen=True):
    """One matrix-product or attention op with one input shape: its calls and GFLOP per step."""

    op: str
    shapes: str
    """The recorded input dims, e.g. `[8, 2048, 2048] [2048, 2048]`."""
    calls_per_step: float
    gflop_per_step: float


class HostTime(Record, frozen=True):
    """Time the loop's thread spent held by one (cause, frame) per step, the part of it in stretches
    of a millisecond or more (`idle.LONG_STRETCH_MS`), and its longest stretch."""

    cause: str
    event: str | None
    """The frame or runtime call that held it; None: code the trace does not record."""
    ms_per_step: float
    long_ms_per_step: float
    longest_ms: float


class RankWork(Record, frozen=True):
    """One trace's steps on the measures ranks are compared on (module docstring), per step:
    compute ms (GPU kernels other than communication; a CPU-only trace's ops), kernels (a CPU-only
    trace's top-level ops), GFLOP of the ops whose shapes were recorded (None: no shapes), those
    ops by shape, and the loop thread's time by one-rank cause. `unprofiled_pre_forward_ms`: where
    a session timed it, the median time from an un-profiled step's start to its first forward (as
    the GPU saw it where there is one), and of its un-profiled steps."""

    compute_ms_per_step: float
    kernels_per_step: float
    gflop_per_step: float | None
    ops: list[OpFlops]
    host: list[HostTime]
    on_gpu: bool
    unprofiled_pre_forward_ms: float | None = None
    unprofiled_step_ms: float | None = None


def rank_work(timeline: Timeline, compute: Coverage, gpu_work: bool, host_labels: HostLabels) -> RankWork:
    """The `RankWork` of one trace's steps; `compute` covers its compute spans
    (`collectives.compute_spans`), `host_labels` is its `idle.host_labels`."""
    steps = timeline.steps
    n = max(len(steps), 1)
    a = np.array([w.start_us for w in steps], dtype=np.float64)
    b = np.array([w.end_us for w in steps], dtype=np.float64)
    compute_ms = float(compute.covered(a, b).sum()) / 1e3 / n if len(a) else 0.0
    if gpu_work:
        is_compute = ~timeline.kernel_is_comm
        kernels = float(np.count_nonzero(is_compute & (timeline.kernel_step >= 0))) / n
    else:
        kernels = _top_level_ops(timeline) / n
    gflop, ops = _flops(timeline, n)
    # A CPU-only trace's ops are its work: the host's own time is what lies outside them.
    outside = None if gpu_work else compute
    host = [
        HostTime(holder.cause.key, holder.event, holder.ms_per_step, holder.long_ms_per_step,
                 holder.longest_ms)
        for holder in loop_thread_time(timeline, host_labels, outside)
        if holder.cause in HOST_CAUSES
    ]
    trace = timeline.trace
    pre_forward, step_ms = trace.unprofiled_pre_forward_ms, trace.unprofiled_step_ms
    return RankWork(
        compute_ms_per_step=round(compute_ms, 4),
        kernels_per_step=round(kernels, 2),
        gflop_per_step=gflop,
        ops=ops,
        host=host,
        on_gpu=gpu_work,
        unprofiled_pre_forward_ms=round(float(np.median(pre_forward)), 4) if pre_forward else None,
        unprofiled_step_ms=round(float(np.median(step_ms)), 4) if step_ms else None,
    )


def _top_level_ops(timeline: Timeline) -> int:
    """Top-level cpu_ops (no op around them) inside the steps, on every thread."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if not len(ops) or not timeline.steps:
        return 0
    start, end = timeline.steps[0].start_us, timeline.steps[-1].end_us
    count = 0
    for thread in np.unique(ops.thread).tolist():
        frames = trace.frames(int(thread))
        top = (frames.category_codes == _CPU_OP) & (frames.enclosing_op(frames.parents) < 0)
        count += int(np.count_nonzero(top & (frames.starts >= start) & (frames.starts < end)))
    return count


def _flops(timeline: Timeline, n: int) -> tuple[float | None, list[OpFlops]]:
    """GFLOP per step of the steps' matrix-product and attention ops, from their recorded shapes
    (None when the trace recorded none), and those ops by (name, shapes), most GFLOP first."""
    trace = timeline.trace
    ops, inputs = trace.events["cpu_op"], trace.op_inputs
    if inputs is None or ops.inputs is None or not len(ops) or not timeline.steps:
        return None, []
    counted = trace.names_matching(lambda name: name in _FLOP_OPS)[ops.name]
    in_steps = timeline.step_of(ops.start_us) >= 0
    rows = _outermost(ops, np.flatnonzero(counted & in_steps))
    rows = rows[ops.inputs[rows] >= 0]
    if not rows.size:
        return (0.0 if (ops.inputs >= 0).any() else None), []
    slots = ops.inputs[rows].tolist()
    names = ops.name[rows].tolist()
    groups: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for position, key in enumerate(zip(names, inputs.keys(slots), strict=True)):
        groups[key].append(position)
    firsts = [members[0] for members in groups.values()]
    dims, types = inputs.decode(np.asarray([slots[i] for i in firsts], dtype=np.int64))
    per_shape = []
    total = 0.0
    for (name, _), members, d, t in zip(groups, groups.values(), dims, types, strict=True):
        flops = op_work(trace.names[name], d, t).flops if d is not None else math.nan
        if math.isnan(flops):
            continue
        total += flops * len(members)
        shapes = " ".join(str(shape) for shape in d if isinstance(shape, list) and shape)
        per_shape.append((trace.names[name], shapes, len(members), flops * len(members)))
    per_shape.sort(key=lambda row: -row[3])
    kept = [
        OpFlops(op=name, shapes=shapes, calls_per_step=round(calls / n, 2),
                gflop_per_step=round(flops / n / 1e9, 4))
        for name, shapes, calls, flops in per_shape[:RANK_OPS_KEPT]
    ]
    return round(total / n / 1e9, 4), kept


def merged_work(works: list[tuple[RankWork, int]]) -> RankWork | None:
    """One process's `RankWork` from its windows' (work, steps): per-step figures weighted by steps,
    the ops and host times summed over them per (op, shapes) and (cause, frame)."""
    works = [(work, steps) for work, steps in works if steps > 0]
    if not works:
        return None
    if len(works) == 1:
        return works[0][0]
    total = sum(steps for _, steps in works)

    def mean(values: list[tuple[float, int]]) -> float:
        return sum(value * steps for value, steps in values) / total

    gflops = [(w.gflop_per_step, s) for w, s in works if w.gflop_per_step is not None]
    ops: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    host: dict[tuple[str, str | None], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for work, steps in works:
        for op in work.ops:
            row = ops[(op.op, op.shapes)]
            row[0] += op.calls_per_step * steps / total
            row[1] += op.gflop_per_step * steps / total
        for held in work.host:
            row = host[(held.cause, held.event)]
            row[0] += held.ms_per_step * steps / total
            row[1] += held.long_ms_per_step * steps / total
            row[2] = max(row[2], held.longest_ms)
    # A process's un-profiled steps are its session's, the same beside every window.
    pre_forward = [w.unprofiled_pre_forward_ms for w, _ in works if w.unprofiled_pre_forward_ms is not None]
    unprofiled = [w.unprofiled_step_ms for w, _ in works if w.unprofiled_step_ms is not None]
    return RankWork(
        compute_ms_per_step=round(mean([(w.compute_ms_per_step, s) for w, s in works]), 4),
        kernels_per_step=round(mean([(w.kernels_per_step, s) for w, s in works]), 2),
        gflop_per_step=round(sum(g * s for g, s in gflops) / sum(s for _, s in gflops), 4)
        if gflops
        else None,
        ops=[
            OpFlops(op, shapes, round(calls, 2), round(gflop, 4))
            for (op, shapes), (calls, gflop) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:RANK_OPS_KEPT]
        ],
        host=[
            HostTime(cause, event, round(ms, 4), round(long_ms, 4), round(longest, 4))
            for (cause, event), (ms, long_ms, longest) in sorted(host.items(), key=lambda kv: -kv[1][0])
        ],
        on_gpu=any(w.on_gpu for w, _ in works),
        unprofiled_pre_forward_ms=pre_forward[0] if pre_forward else None,
        unprofiled_step_ms=unprofiled[0] if unprofiled else None,
    )


def _outermost(ops, rows: np.ndarray) -> np.ndarray:
    """The `rows` of `ops` not inside another of them on their thread: an op dispatched again
    (a Python dispatch mode, a backend's fallback) records itself inside itself, its FLOPs once."""
    if not rows.size:
        return rows
    order = rows[np.lexsort((-ops.dur_us[rows], ops.start_us[rows], ops.thread[rows]))]
    keep = np.ones(len(order), dtype=bool)
    for thread in np.unique(ops.thread[order]).tolist():
        at = np.flatnonzero(ops.thread[order] == thread)
        ends = ops.end_us[order[at]]
        reach = np.maximum.accumulate(ends)
        keep[at[1:]] = ends[1:] > reach[:-1] + NESTING_SLACK_US
    return np.sort(order[keep])
