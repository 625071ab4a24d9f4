"""Question 5 for a trace with no GPU work: which host ops take the step's time.

A loop that ran on the CPU (no CUDA device, or a model left on the CPU) has no kernels to rank and
no launch overhead; its step is all host time, spent in the top-level ops of each thread.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.attribution import BACKWARD, FORWARD, OPTIMIZER, AttributionIndex, attribute_sites
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


def _top_level_ops(timeline: Timeline) -> list[tuple[int, float, float, int]]:
    """The top-level `cpu_op`s (no enclosing op) that start inside the steps, per thread in thread
    order: (thread, start µs, end µs, name id). An op nested in another is counted there."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if not len(ops) or not timeline.steps:
        return []
    step_start = timeline.steps[0].start_us
    step_end = timeline.steps[-1].end_us
    is_op = FRAME_CATEGORIES.index("cpu_op")
    found = []
    for thread in sorted(set(ops.thread.tolist())):
        frames = trace.frames(int(thread))
        top_level = (frames.category_codes == is_op) & (frames.enclosing_op(frames.parents) < 0)
        in_steps = (frames.starts >= step_start) & (frames.starts < step_end)
        for i in np.flatnonzero(top_level & in_steps).tolist():
            found.append((int(thread), float(frames.starts[i]), float(frames.ends[i]),
                          int(frames.name_ids[i])))
    return found


def top_host_ops(timeline: Timeline, step_ms: float) -> list[HostOpTime]:
    """Top-level `cpu_op`s (no enclosing op) inside the steps, by total time, largest first;
    `step_ms` is the mean step they are a share of."""
    trace = timeline.trace
    n_steps = len(timeline.steps)
    total_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for _, start, end, name_id in _top_level_ops(timeline):
        name = trace.names[name_id].replace(_AUTOGRAD_NODE, "backward of ")
        total_us[name] += end - start
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


class HostStepPhases(Record, frozen=True):
    """One step of a trace without GPU work as its loop ran it: host ms in the top-level ops of each
    phase (`attribution.PHASES`: forward, backward, optimizer), and the rest of the step (ops of no
    phase, and Python between ops)."""

    number: int
    duration_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    other_ms: float


class HostModuleTime(Record, frozen=True):
    """Host time of the top-level ops an `nn.Module` ran (forward) or whose backward it owns, over
    the profiled steps: its class path, instances, ms per step, and % of the mean step."""

    module: str
    instances: int
    ms_per_step: float
    pct_of_step: float


class HostBreakdown(msgspec.Struct, frozen=True):
    """What the host did in a trace without GPU work: the loop's structure per step, and host time by
    module (`host_breakdown`)."""

    steps: list[HostStepPhases]
    modules: list[HostModuleTime]


def host_breakdown(timeline: Timeline, index: AttributionIndex) -> HostBreakdown:
    """Per step, host ms by phase; per module (innermost, as a kernel's), host ms per step, largest
    first (`TOP_ROWS`). Each top-level op inside the steps is attributed as a kernel launched from it
    would be (`attribution.attribute_sites`): a backward op to its forward op's module."""
    ops = _top_level_ops(timeline)
    steps = timeline.steps
    if not steps:
        return HostBreakdown(steps=[], modules=[])
    thread = np.array([op[0] for op in ops], dtype=np.int64)
    start = np.array([op[1] for op in ops], dtype=np.float64)
    end = np.array([op[2] for op in ops], dtype=np.float64)
    owners = attribute_sites(index, thread, start, end)
    dur_ms = (end - start) / 1e3
    step_of = np.searchsorted([step.start_us for step in steps], start, side="right") - 1
    rows = []
    for number, step in enumerate(steps):
        mine = step_of == number
        by_phase = [float(dur_ms[mine & (owners.phase == code)].sum())
                    for code in (FORWARD, BACKWARD, OPTIMIZER)]
        duration = (step.end_us - step.start_us) / 1e3
        rows.append(HostStepPhases(
            number=step.number, duration_ms=numpy_round(duration, 4),
            forward_ms=numpy_round(by_phase[0], 4), backward_ms=numpy_round(by_phase[1], 4),
            optimizer_ms=numpy_round(by_phase[2], 4),
            other_ms=numpy_round(max(duration - sum(by_phase), 0.0), 4),
        ))
    step_ms = sum(row.duration_ms for row in rows) / len(rows)
    total: dict[str, float] = defaultdict(float)
    instances: dict[str, set[str]] = defaultdict(set)
    for module, ms in zip(owners.module.tolist(), dur_ms.tolist(), strict=True):
        if module >= 0:
            ref = owners.modules[module]
            total[ref.class_path] += ms
            instances[ref.class_path].add(ref.path)
    modules = [
        HostModuleTime(module=path, instances=len(instances[path]),
                       ms_per_step=numpy_round(ms / len(rows), 4),
                       pct_of_step=numpy_round(100 * ms / len(rows) / max(step_ms, 1e-9), 2))
        for path, ms in sorted(total.items(), key=lambda kv: -kv[1])[:TOP_ROWS]
    ]
    return HostBreakdown(steps=rows, modules=modules)
