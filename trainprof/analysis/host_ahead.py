"""A host that ran ahead of its GPU: the verdict and the GPU-idle findings judged on the step as the
GPU ran it, not on the host's step windows.

Where the span of a step's own kernels (`StepBusy.kernel_span_ms`, the mean over the steps) is over
`result.HOST_AHEAD` times the host's step window, the windows are not the steps: they hold the GPU
work that earlier steps queued, or none at all, and the "idle" time in them is the GPU running work
the windows do not own. H200, 2026-11-29 (`tests/fixtures/busy_round_two/float_upcast/bf16`): a bf16
MLP with no sync point; its two recorded windows took 9.9 and 14.8 ms and held none of their own
kernels (the GPU was still running the warm-up steps' work), its steps took 43.4 ms as the GPU ran
them and 43.2 ms un-profiled, 43 ms of it kernels. Judged on the windows it was "launch-bound" with
a high launch-overhead finding; judged on the GPU's step it is busy 99% of it.

Only a trace without collectives: there kernels of two streams overlap and a rank can wait inside a
collective for another, and the session's un-profiled steps (`profiler_cost`) or the cross-rank
comparison judge it (two H200s, DDP, plain traces: the kernel spans were 1.06x the windows while the
profiler slowed the host).

The GPU-idle findings (`severity.IDLE_KINDS`) measured in the windows are bounded, together, by the
idle time of the GPU's own steps, their span less their kernels' time (`StepBasis.gpu_step_idle_ms`),
and every finding's severity is judged against the GPU's step (`step_basis`). Where the session's
un-profiled steps show that the profiler slowed the recorded ones, those judge instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from trainprof.analysis.result import HOST_AHEAD
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.verdict import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.busy import BusyBreakdown

_KEPT_VERDICTS = frozenset({"gpu-bound", "cpu-only"})
"""Verdicts kept: the GPU was busy even in the host's windows, or there is no GPU."""


def gpu_step(busy: BusyBreakdown) -> tuple[float, float]:
    """The step as the GPU ran it, per step: (the span of its own kernels, their time in it)."""
    n = max(len(busy.steps), 1)
    span = sum(row.kernel_span_ms for row in busy.steps) / n
    return span, sum(min(row.kernel_ms, row.kernel_span_ms) for row in busy.steps) / n


def ran_ahead(verdict: Verdict, busy: BusyBreakdown | None) -> bool:
    """Whether, in a trace without collectives, the span of a step's kernels is over `HOST_AHEAD`
    times the host's step window."""
    if busy is None or not busy.steps or verdict.step_ms <= 0 or verdict.comm_ms_per_step > 0:
        return False
    return gpu_step(busy)[0] > HOST_AHEAD * verdict.step_ms


def ahead_rejudged(verdict: Verdict, busy: BusyBreakdown | None, thresholds: Thresholds) -> Verdict:
    """`gpu-bound` where the host ran ahead and the GPU is busy for at
    least `gpu_bound_busy_pct` of its own step; any other verdict unchanged."""
    if busy is None or verdict.label in _KEPT_VERDICTS or not ran_ahead(verdict, busy):
        return verdict
    span, work = gpu_step(busy)
    busy_pct = min(100.0, 100.0 * work / span)
    if busy_pct < thresholds.gpu_bound_busy_pct:
        return verdict
    why = (
        f"the GPU is busy {busy_pct:.0f}% of its step ({span:.1f} ms as the GPU ran it)"
        f"; the host ran ahead of the GPU, so its step windows ({verdict.step_ms:.1f} ms) hold earlier "
        f"steps' GPU work or none ({verdict.label} in the windows: {verdict.why})"
    )
    return msgspec.structs.replace(verdict, label="gpu-bound", cause=None, fix=None, why=why,
                                   gpu_busy_pct=round(busy_pct, 2))
