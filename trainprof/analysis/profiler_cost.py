"""How much longer are the recorded steps than the same loop's un-profiled ones, and what does that
leave of the GPU-idle time the trace shows?

torch.profiler costs the host time per op (more with `record_shapes`, `with_stack` and
`profile_memory`) and leaves the kernels' speed alone. A loop whose host kept just ahead of the GPU
falls behind it while recorded: the trace then shows GPU-idle time, and a launch- or host-bound
verdict, that the same loop does not have un-profiled. The session times the steps it does not
profile (`Trace.unprofiled_step_ms`); against their median:

- an un-profiled step leaves the GPU idle at most (its time - the recorded GPU busy time per step):
  the trace's `step_basis.StepBasis` judges on the un-profiled step, so the GPU-idle findings
  together claim no more, each finding's severity is its gain over the un-profiled step, and the
  findings on GPU-busy waste predict from it (each rule reads the basis when it makes its finding);
- the MFU is the model FLOPs over the un-profiled step (`unprofiled_mfu`);
- a cause verdict is judged again (`rejudged`): `gpu-bound` (`communication-bound` when collectives
  hold `comm_bound_share` of the busy time) when the recorded GPU busy time is `gpu_bound_busy_pct`
  of the un-profiled step, else the same verdict with the bound in its reason;
- a `profiler_slowdown` finding says how much the profiler added.

All of it only when the recorded step is at least `profiler_slowdown_min_share` longer than the
un-profiled one. Without un-profiled steps (another tool's trace, a loop that ended with its window)
nothing changes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.result import Step
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.verdict import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.busy import BusyBreakdown
    from trainprof.trace import Trace

_KEPT_VERDICTS = frozenset({"gpu-bound", "cpu-only"})
"""Verdicts not judged again: the GPU was busy even while recorded, or there is no GPU. A
`communication-bound` one is: a rank can be busy while recorded only in its wait for another rank
whose host the profiler slowed."""


class ProfilerCost(Record, frozen=True):
    """One trace's recorded steps against its process's un-profiled steps (module docstring)."""

    unprofiled_step_ms: float
    """The median time of the un-profiled steps."""
    unprofiled_steps: int
    timing: str | None
    """How the session timed them: `cuda_events` (as the GPU ran them), `host`, or None (not said)."""
    recorded_step_ms: float
    """The recorded steps' mean: the host's step window, or the step as the GPU ran it where the
    host ran ahead (`profiler_cost`)."""
    slowdown_pct: float
    """How much longer the recorded step is, in % of the un-profiled one (negative: shorter)."""
    gpu_busy_ms_per_step: float
    """The recorded steps' GPU busy time per step (the kernels run as fast un-profiled): inside the
    host's step windows but no more than the span of each step's own kernels, or the time of the
    kernels each step launched where the host ran ahead (`profiler_cost`)."""
    unprofiled_gpu_busy_pct: float
    """That busy time over the un-profiled step, at most 100."""
    unprofiled_idle_ms_per_step: float
    """The most GPU-idle time an un-profiled step can hold: its time less the busy time, at least 0."""
    slowed: bool
    """Whether `slowdown_pct` reaches `profiler_slowdown_min_share`: the verdict and findings are
    then judged on the un-profiled step."""

    @property
    def judged_step_ms(self) -> float:
        """The step that gains are judged against: the un-profiled one, or the GPU busy time where
        that is longer (a host that ran ahead of the GPU timed its steps short)."""
        return max(self.unprofiled_step_ms, self.gpu_busy_ms_per_step)


def profiler_cost(
    trace: Trace,
    verdict: Verdict,
    steps: list[Step],
    thresholds: Thresholds,
    gpu: BusyBreakdown | None = None,
) -> ProfilerCost | None:
    """The trace's `ProfilerCost`; None without un-profiled steps or without GPU work.

    The session timed the un-profiled steps as the GPU ran them. A host that runs ahead of the GPU
    has step windows (`verdict.step_ms`) shorter than its steps, and they hold only part of each
    step's GPU work: the recorded step is then the step as the GPU ran it (`gpu.step_ms`, the span
    of its kernels or their summed time) and its busy time that of the kernels it launched
    (`gpu.kernel_ms_per_step`). H200, 2026-11-25: a 128,256-token head's windows took 21.5 ms and
    held 20.2 ms of GPU work; its steps took 49.7 ms recorded and 49.5 un-profiled, 48.8 of it kernels.
    A step's busy time is at most the span of its own kernels: eager GPT-2's first recorded window
    held 152.8 ms of GPU work, 27 ms of it queued by the step before (its own kernels spanned 125.5
    ms; un-profiled steps took 123.5)."""
    unprofiled_step_ms = trace.unprofiled_step_ms
    if not unprofiled_step_ms or not steps or verdict.idle is None or verdict.step_ms <= 0:
        return None
    unprofiled = float(np.median(np.asarray(unprofiled_step_ms, dtype=np.float64)))
    recorded = verdict.step_ms
    # A step's window can also hold kernels that earlier steps queued (the first recorded step, after
    # a warm-up step whose host ran ahead): its busy time counts no more than its own kernels' span.
    spans = {row.number: row.kernel_span_ms for row in gpu.steps} if gpu is not None else {}
    busy = sum(min(s.times.gpu_busy_ms, spans.get(s.times.number, math.inf)) for s in steps) / len(steps)
    if gpu is not None and gpu.step_ms > recorded:
        recorded = gpu.step_ms
        busy = max(busy, gpu.kernel_ms_per_step)
    slowdown = recorded / unprofiled - 1.0
    return ProfilerCost(
        unprofiled_step_ms=round(unprofiled, 4),
        unprofiled_steps=len(unprofiled_step_ms),
        timing=trace.unprofiled_timing,
        recorded_step_ms=round(recorded, 4),
        slowdown_pct=round(100.0 * slowdown, 2),
        gpu_busy_ms_per_step=round(busy, 4),
        unprofiled_gpu_busy_pct=round(min(100.0, 100.0 * busy / unprofiled), 2),
        unprofiled_idle_ms_per_step=round(max(unprofiled - busy, 0.0), 4),
        slowed=slowdown >= thresholds.profiler_slowdown_min_share,
    )


def rejudged(verdict: Verdict, cost: ProfilerCost | None, thresholds: Thresholds) -> Verdict:
    """The verdict judged on the un-profiled step where the profiler slowed the recorded ones."""
    if cost is None or not cost.slowed or verdict.label in _KEPT_VERDICTS:
        return verdict
    measured = f"{cost.unprofiled_step_ms:.1f} ms, median of {cost.unprofiled_steps} un-profiled steps"
    # Kernels run as fast un-profiled: GPU busy time past the un-profiled step was spent in
    # collectives waiting for a rank the profiler slowed, which an un-profiled step does not pay.
    waited = min(max(cost.gpu_busy_ms_per_step - cost.unprofiled_step_ms, 0.0), verdict.comm_ms_per_step)
    comm_ms = verdict.comm_ms_per_step - waited
    busy_ms = max(cost.gpu_busy_ms_per_step - waited, 1e-9)
    if cost.unprofiled_gpu_busy_pct >= thresholds.gpu_bound_busy_pct:
        comm_bound = comm_ms >= thresholds.comm_bound_share * busy_ms
        why = (
            f"the GPU is busy {cost.unprofiled_gpu_busy_pct:.0f}% of an un-profiled step ({measured})"
            + (f", {100 * comm_ms / busy_ms:.0f}% of it in collectives" if comm_bound else "")
            + f"; recorded, the steps took {cost.slowdown_pct:.0f}% longer and the GPU waited on the "
            f"profiler's host cost"
            + (f" (here, {waited:.1f} ms/step inside collectives, for another rank)" if waited > 0 else "")
            + f" ({verdict.label} while recorded: {verdict.why})"
        )
        label = "communication-bound" if comm_bound else "gpu-bound"
        return msgspec.structs.replace(verdict, label=label, cause=None, fix=None, why=why)
    why = (
        f"{verdict.why}; un-profiled steps take {measured}, so at most "
        f"{cost.unprofiled_idle_ms_per_step:.1f} ms/step of the GPU-idle time is the loop's, the rest "
        "the profiler's"
    )
    return msgspec.structs.replace(verdict, why=why)


def unprofiled_mfu(busy: BusyBreakdown, cost: ProfilerCost | None) -> BusyBreakdown:
    """`busy` with its MFU over the un-profiled step where the profiler slowed the recorded ones:
    the same FLOPs in less time. Its `step_ms` and shares stay the recorded step's."""
    if cost is None or not cost.slowed or busy.step_ms <= cost.judged_step_ms:
        return busy
    scale = busy.step_ms / cost.judged_step_ms
    return msgspec.structs.replace(
        busy,
        mfu_pct=round(busy.mfu_pct * scale, 2) if busy.mfu_pct is not None else None,
        mfu_achievable_pct=round(busy.mfu_achievable_pct * scale, 2)
        if busy.mfu_achievable_pct is not None
        else None,
    )


def slowdown_finding(cost: ProfilerCost | None, steps: int, rank: int | None) -> Finding | None:
    """What the profiler added to each recorded step, when it slowed them (module docstring)."""
    if cost is None or not cost.slowed:
        return None
    added_ms = cost.recorded_step_ms - cost.unprofiled_step_ms
    return Finding(
        kind="profiler_slowdown",
        title=(
            f"The profiler made the recorded steps {cost.slowdown_pct:.0f}% longer: "
            f"{cost.recorded_step_ms:.1f} ms against {cost.unprofiled_step_ms:.1f} ms un-profiled "
            f"(median of {cost.unprofiled_steps} steps); un-profiled, the GPU is busy "
            f"{cost.unprofiled_gpu_busy_pct:.0f}% of the step and idle at most "
            f"{cost.unprofiled_idle_ms_per_step:.1f} ms/step"
        ),
        severity="low",
        op=None,
        where=Where(),
        count=steps,
        per_step=1.0,
        cost_ms=round(added_ms * steps, 4),
        fix=(
            "Nothing in the loop: read the step by its un-profiled time, as this report's verdict, "
            "severities and predicted gains do. The GPU-idle time the trace shows beyond it is the "
            "profiler's host cost per recorded op, which a run without the profiler does not pay; "
            "with_stack=False, record_shapes=False and profile_memory=False lower that cost only in "
            "part, and take the source lines, shapes and memory from the findings."
        ),
        rank=rank,
        cause="torch.profiler's host cost per op slows the host, not the kernels",
        gpu_ms_per_step=0.0,
        details=cost,
    )
