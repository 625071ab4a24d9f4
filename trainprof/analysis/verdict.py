"""What bounds a trace's steps, in one word: the verdict.

`gpu-bound` (or `communication-bound`) when the GPU is busy most of the step, not counting the time
its collectives wait for other ranks; else the verdict of the GPU-idle cause group with the most
steady-state idle time (`launch-bound`, `sync-bound`, `blocking-call-bound`, `warm-up-bound`,
`input-bound`, `host-bound`, `communication-bound`) or `rank-wait-bound` (the waiting inside
collectives for later ranks), if it has `dominant_cause_margin` times the runner-up's, else `mixed`;
`cpu-only` when the steps launched no GPU work. One-off costs and the profiler's own overhead are
reported beside it, never as it.
GPU busy % is time-weighted: the union of GPU busy time over the total step time. Numbers:
`thresholds.py`; causes: `causes.py`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.causes import CAUSES, Cause, CauseCosts
from trainprof.analysis.kinds import VerdictLabel
from trainprof.analysis.records import Record
from trainprof.analysis.steps import has_gpu_work
from trainprof.analysis.thresholds import Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.collectives import CommWait
    from trainprof.analysis.result import Step


class RankedVerdict(Record, frozen=True):
    """A verdict a cause group would name, with its steady-state GPU-idle ms per step."""

    verdict: VerdictLabel
    idle_ms_per_step: float


class VerdictIdle(msgspec.Struct, frozen=True):
    """The GPU-idle split behind a verdict, per step: steady-state ms by cause, the one-off ms
    beside them, and the verdicts the cause groups would name, largest first (those with time)."""

    gpu_idle_ms_per_step: float
    by_cause: CauseCosts
    one_off_ms_per_step: float
    host_ms_per_step: float
    """`host` and `unknown` together: the `host-bound` group."""
    ranked: tuple[RankedVerdict, ...]


class Verdict(msgspec.Struct, frozen=True):
    """What bounds one trace's steps (`label`), the cause that names it and why, with the figures.

    `cause` is the GPU-idle cause behind a cause verdict (None for `gpu-bound`, `mixed`, ...);
    `fix` its fix. `idle` is None for `cpu-only` (no GPU to be idle). JSON: `trainprof.analysis.result`.
    """

    label: VerdictLabel
    cause: Cause | None
    why: str
    fix: str | None
    gpu_busy_pct: float
    step_ms: float
    comm_ms_per_step: float
    kernels_per_step: float
    tiny_kernel_pct: float
    idle: VerdictIdle | None

    def to_dict(self) -> dict[str, Any]:
        """The trace's `verdict` object: `{"verdict", "cause", "why", ...}`; a `cpu-only` one is shorter."""
        tail = {
            "step_ms": self.step_ms,
            "comm_ms_per_step": self.comm_ms_per_step,
            "kernels_per_step": self.kernels_per_step,
            "tiny_kernel_pct": self.tiny_kernel_pct,
        }
        cause = self.cause.key if self.cause is not None else None
        if self.idle is None:
            return {"verdict": self.label, "gpu_busy_pct": self.gpu_busy_pct, "cause": cause, "why": self.why,
                    **tail}
        by_cause = self.idle.by_cause
        return {
            "verdict": self.label,
            "cause": cause,
            "why": self.why,
            "fix": self.fix,
            "gpu_busy_pct": self.gpu_busy_pct,
            "gpu_idle_ms_per_step": self.idle.gpu_idle_ms_per_step,
            "idle_ms_per_step": {c.key: ms for c, ms in by_cause.items()},
            "idle_one_off_ms_per_step": self.idle.one_off_ms_per_step,
            "idle_profiler_ms_per_step": by_cause[Cause.PROFILER],
            "idle_launch_ms_per_step": by_cause[Cause.LAUNCH],
            "idle_sync_ms_per_step": by_cause[Cause.SYNC],
            "idle_host_ms_per_step": self.idle.host_ms_per_step,
            "ranked": [entry.to_dict() for entry in self.idle.ranked],
            **tail,
        }


WAIT_VERDICT: VerdictLabel = "rank-wait-bound"
"""The verdict of a rank whose GPU waits inside collectives for later ranks more than anything else
holds it (`collectives.CommWait`): its cause is on another rank."""
WAIT_FIX = (
    "Find the rank this one waits for (analyse every rank's trace together: `trainprof analyze RUN`, "
    "or a session's cross-rank report) and balance what it does; no bucket size or overlap setting "
    "hides a wait for a late rank."
)


def verdict(
    steps: list[Step], tiny_kernel_pct: float, thresholds: Thresholds, wait: CommWait | None = None
) -> Verdict:
    """The verdict of one trace's steps (module docstring). `wait`: how much of its collectives'
    time its own trace shows as waiting for other ranks: that time is neither its GPU's work nor
    its communication's, and names `rank-wait-bound` when it holds the step more than any cause."""
    n = max(len(steps), 1)

    def per_step(values: Iterable[float | None]) -> float:
        return sum(value or 0.0 for value in values) / n

    total_ms = sum(s.times.duration_ms for s in steps)
    busy_ms = sum(s.times.gpu_busy_ms for s in steps)
    comm_ms = per_step(s.times.comm_ms for s in steps)
    figures = {
        "step_ms": numpy_round(total_ms / n, 4),
        "comm_ms_per_step": numpy_round(comm_ms, 4),
        "kernels_per_step": round(per_step(s.times.kernel_count for s in steps), 1),
        "tiny_kernel_pct": round(tiny_kernel_pct, 2),
    }
    if not has_gpu_work([s.times for s in steps]):
        # No GPU work to be bound by: the step is all host time, and there is no GPU-idle split.
        return Verdict("cpu-only", None, "no GPU work in the steps", None, 0.0, **figures, idle=None)
    busy_pct = 100.0 * busy_ms / total_ms if total_ms > 0 else 0.0
    wait_ms = per_step(wait.exposed_wait_ms_by_step.get(s.times.number) for s in steps) if wait else 0.0
    working_pct = 100.0 * (busy_ms - wait_ms * n) / total_ms if total_ms > 0 else 0.0
    by_cause = {c: per_step(s.idle.costs[c] if s.idle is not None else None for s in steps) for c in Cause}
    one_off = per_step(s.idle.one_off_ms if s.idle is not None else None for s in steps)
    # The per-cause figures leave one-off costs out; profiler overhead names no verdict.
    by_verdict: dict[VerdictLabel, float] = defaultdict(float)
    for each, info in CAUSES.items():
        if info.verdict is not None:
            by_verdict[info.verdict] += by_cause[each]
    by_verdict[WAIT_VERDICT] = wait_ms
    ranked = sorted(by_verdict.items(), key=lambda kv: -kv[1])
    (top, top_ms), (second, second_ms) = ranked[0], ranked[1]
    cause: Cause | None = None
    fix: str | None = None
    label: VerdictLabel
    if working_pct >= thresholds.gpu_bound_busy_pct:
        gpu_busy = max(per_step(s.times.gpu_busy_ms for s in steps) - wait_ms, 1e-9)
        transfer_ms = comm_ms - wait_ms
        comm_bound = transfer_ms >= thresholds.comm_bound_share * gpu_busy
        label = "communication-bound" if comm_bound else "gpu-bound"
        why = f"the GPU is busy {working_pct:.0f}% of the step" + (
            f", {100 * transfer_ms / gpu_busy:.0f}% of it in collectives" if comm_bound else ""
        )
        if wait_ms > 0:
            why += f" (and {wait_ms:.1f} ms/step waiting inside collectives for other ranks)"
    elif top_ms <= 0:
        label = "unknown"
        left_out = [
            what
            for what, ms in (("one-off cost", one_off), ("profiler overhead", by_cause[Cause.PROFILER]))
            if ms > 0
        ]
        why = f"GPU idle time is all {' and '.join(left_out)}" if left_out else "no GPU-idle time to explain"
    elif top == WAIT_VERDICT and top_ms >= thresholds.dominant_cause_margin * second_ms:
        label, fix = top, WAIT_FIX
        why = (
            f"GPU busy {busy_pct:.0f}%, {top_ms:.1f} ms/step of it waiting inside collectives for other "
            "ranks to arrive"
            + (f", {top_ms / second_ms:.1f}x the next cause ({second})" if second_ms > 0 else "")
        )
    elif top_ms >= thresholds.dominant_cause_margin * second_ms:
        label = top
        cause = max((c for c, info in CAUSES.items() if info.verdict == top), key=lambda c: by_cause[c])
        steady_ms = sum(ms for c, ms in by_cause.items() if CAUSES[c].verdict is not None)
        why = (
            f"GPU busy {busy_pct:.0f}%; of {steady_ms:.1f} ms/step steady-state GPU idle, "
            f"{top_ms:.1f} ms is {top.replace('-bound', '')} ({CAUSES[cause].meaning})"
            + (f", {top_ms / second_ms:.1f}x the next cause ({second})" if second_ms > 0 else "")
        )
    else:
        label = "mixed"
        why = (
            f"GPU busy {busy_pct:.0f}%; no cause leads by {thresholds.dominant_cause_margin:g}x: "
            f"{top} {top_ms:.1f} ms/step, {second} {second_ms:.1f} ms/step"
        )
    idle = VerdictIdle(
        gpu_idle_ms_per_step=numpy_round(per_step(s.times.gpu_idle_ms for s in steps), 4),
        by_cause=CauseCosts(tuple(round(by_cause[c], 4) for c in Cause)),
        one_off_ms_per_step=round(one_off, 4),
        host_ms_per_step=round(by_cause[Cause.HOST] + by_cause[Cause.UNKNOWN], 4),
        ranked=tuple(RankedVerdict(v, round(ms, 4)) for v, ms in ranked if ms > 0),
    )
    if wait is not None and wait.undecided and label in ("communication-bound", "mixed"):
        best = f" (at best {wait.best_link_pct:.0f}% of the link)" if wait.best_link_pct is not None else ""
        why += (
            f"; on this rank alone, {'/'.join(wait.undecided)}{best} may be waiting for later ranks "
            "rather than transferring: every rank's trace together tells"
        )
    fix = fix if fix is not None else CAUSES[cause].fix if cause is not None else None
    return Verdict(label, cause, why, fix, numpy_round(busy_pct, 2), **figures, idle=idle)
