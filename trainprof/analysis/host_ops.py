"""Question 5 for a trace with no GPU work: which host ops take the step's time.

A loop that ran on the CPU (no CUDA device, or a model left on the CPU) has no kernels to rank and
no launch overhead; its step is all host time, spent in the top-level ops of each thread.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.steps import StepTimes, has_gpu_work
from trainprof.analysis.thresholds import TOP_ROWS
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import FRAME_CATEGORIES

# How torch.profiler names a backward node's op; the finding says "backward of PowBackward0".
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


class HostOpTime(Record, frozen=True):
    """A top-level host op (no op encloses it) inside the steps: calls, total ms, % of the mean step."""

    op: str
    count: int
    total_ms: float
    pct_of_step: float


class CpuOnlyDetails(Record, frozen=True):
    """The cpu-only finding's evidence: the top-level host ops by time, and the mean step."""

    top_host_ops: list[HostOpTime]
    step_ms: float


def top_host_ops(timeline: Timeline, step_ms: float) -> list[HostOpTime]:
    """Top-level `cpu_op`s (no enclosing op) inside the steps, by total time, largest first;
    `step_ms` is the mean step they are a share of."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if not len(ops) or not timeline.steps:
        return []
    step_start = timeline.steps[0].start_us
    step_end = timeline.steps[-1].end_us
    n_steps = len(timeline.steps)
    total_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    is_op = FRAME_CATEGORIES.index("cpu_op")
    for thread in sorted(set(ops.thread.tolist())):
        frames = trace.frames(int(thread))
        # An op nested inside another op: its time is already counted there.
        top_level = (frames.category_codes == is_op) & (frames.enclosing_op(frames.parents) < 0)
        in_steps = (frames.starts >= step_start) & (frames.starts < step_end)
        for i in np.flatnonzero(top_level & in_steps).tolist():
            name = trace.names[int(frames.name_ids[i])].replace(_AUTOGRAD_NODE, "backward of ")
            total_us[name] += float(frames.ends[i] - frames.starts[i])
            count[name] += 1
    ranked = sorted(total_us.items(), key=lambda kv: -kv[1])[:TOP_ROWS]
    rows = []
    for name, us in ranked:
        total_ms = round(us / 1e3, 4)
        pct = numpy_round(100 * total_ms / n_steps / max(step_ms, 1e-9), 2)
        rows.append(HostOpTime(op=name, count=count[name], total_ms=total_ms, pct_of_step=pct))
    return rows


def cpu_only_finding(timeline: Timeline, steps: list[StepTimes], rank: int | None) -> Finding | None:
    """An info finding for a trace whose steps launched no GPU work: the host ops that fill the step."""
    if not steps or has_gpu_work(steps):
        return None
    step_ms = sum(s.duration_ms for s in steps) / len(steps)
    ops = top_host_ops(timeline, step_ms)
    head = ops[0] if ops else None
    return Finding(
        kind="cpu_only",
        title=(
            f"No GPU work in the profiled steps: the {step_ms:.1f} ms step is all host time"
            + (f"; {head.op} takes {head.pct_of_step:.0f}% of it" if head is not None and head.op else "")
        ),
        severity="info",
        op=head.op if head is not None else None,
        where=Where(),
        count=len(steps),
        per_step=1.0,
        cost_ms=numpy_round(step_ms * len(steps), 4),
        fix=(
            "If a GPU was meant to run this, move the model and each batch to it (model.to('cuda'), "
            "batch.to('cuda', non_blocking=True)). On the CPU: torch.compile the model, use larger "
            "batches, and check torch.get_num_threads() matches the cores you have."
        ),
        rank=rank,
        details=CpuOnlyDetails(top_host_ops=ops, step_ms=numpy_round(step_ms, 4)),
    )
