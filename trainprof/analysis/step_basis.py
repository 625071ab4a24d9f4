"""The step of one trace: every length it has, which one judges it, and why (`StepBasis`).

A recorded trace has up to three step lengths:

    host   |--window--|--window--|--window--|        the host's step windows (`window_ms`)
    GPU    |-----step as the GPU ran it-----|...     kernels queued by each window (`gpu_ms`)
    later  |--un-profiled--|                         the session's steps without the profiler

- `window`: from one optimizer step (or `ProfilerStep`) to the next on the host, the recorded
  steps' mean (`Verdict.step_ms`);
- `gpu`: the step as the GPU ran it, per step the longest of the host window, the span of the
  step's kernels and their summed time (`BusyBreakdown.step_ms`): longer than the window where the
  host ran ahead of the GPU (H200, 2026-11-25: a 128,256-token head's 21.5 ms windows, 49.7 ms
  steps);
- `unprofiled`: the median of the steps the session timed without the profiler (`ProfilerCost`).

One of them judges the trace (`judged_ms`, `judged_by`): every finding's severity is the GPU time
per step it could win back over it (`severity.severity_for`), and the headline's step time is it:

- `unprofiled` where the profiler slowed the recorded steps (`ProfilerCost.slowed`): a run without
  the profiler pays none of that; `gpu_busy` instead where the recorded GPU busy time per step is
  longer than that step (a host clock timed a host that ran ahead short:
  `ProfilerCost.judged_step_ms`);
- else `gpu` where the trace has GPU work (it is never shorter than the window);
- else `window` (no GPU work: the host's step is the step).

Where the profiler slowed the steps, an un-profiled step leaves the GPU idle at most
`unprofiled_idle_ms`; the recorded steps' steady-state GPU-idle time is longer, and which part of
it the profiler added the trace cannot tell: every GPU-idle finding's gain keeps the same share of
its recorded time (`idle_kept`, `idle_gain`), so together they claim no more than an un-profiled
step has. A rule reads all of this from the basis; nothing edits a finding after it was made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainprof.analysis.host_ahead import gpu_step, ran_ahead
from trainprof.analysis.result import HOST_AHEAD, Record

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.busy import BusyBreakdown
    from trainprof.analysis.profiler_cost import ProfilerCost
    from trainprof.analysis.verdict import Verdict

STEP_BASES: dict[str, str] = {
    "window": "the host's step window: from one optimizer step (or `ProfilerStep`) to the next",
    "gpu": "the step as the GPU ran it: per step the longest of the host window, the span of the "
           "step's kernels and their summed time",
    "unprofiled": "the session's un-profiled step, timed beside the recorded ones (`profiler_cost`)",
    "gpu_busy": "the recorded GPU busy time per step, where the un-profiled steps were timed shorter "
                "than it (a host clock times a host that ran ahead short)",
}
"""What each step length is (`StepBasis.judged_by`, `Summary.judged_step_basis`)."""

STEP_WORDS: dict[str, str] = {
    "window": "in the host's step windows",
    "gpu": "as the GPU ran it",
    "unprofiled": "un-profiled",
    "gpu_busy": "of GPU busy time",
}
"""Each step length in a few words, after its time (`41.2 ms as the GPU ran it`)."""


class StepBasis(Record, frozen=True):
    """One trace's step lengths and the one that judges it (module docstring)."""

    window_ms: float
    """The host's step window, the recorded steps' mean (`Verdict.step_ms`)."""
    gpu_ms: float | None
    """The step as the GPU ran it (`BusyBreakdown.step_ms`); None without GPU work."""
    unprofiled_ms: float | None
    """The median un-profiled step (`ProfilerCost.unprofiled_step_ms`); None without them."""
    judged_ms: float
    """The step that judges: every severity is a finding's GPU time per step over it."""
    judged_by: str
    """Which length `judged_ms` is: a key of `STEP_BASES`."""
    why: str
    """Why that one judges, in words."""
    unprofiled_idle_ms: float | None = None
    """Where the profiler slowed the steps: the most GPU-idle time an un-profiled step holds
    (`ProfilerCost.unprofiled_idle_ms_per_step`); else None."""
    idle_kept: float = 1.0
    """The share of each GPU-idle finding's recorded gain an un-profiled step keeps:
    `unprofiled_idle_ms` over the recorded steady-state GPU-idle ms per step, at most 1 (where the
    host ran ahead: `gpu_step_idle_ms` over it)."""
    gpu_step_idle_ms: float | None = None
    """Where the host ran ahead of the GPU and the profiler did not slow the steps
    (`host_ahead.ran_ahead`): the most GPU-idle time the GPU's own steps hold, their kernels' span
    less their time; its windows' idle time is the GPU running earlier steps' work. Else None."""

    @property
    def host_ran_ahead(self) -> bool:
        """Whether the GPU's step is `HOST_AHEAD` longer than the host's window."""
        return self.gpu_ms is not None and self.gpu_ms > HOST_AHEAD * self.window_ms

    def idle_gain(self, gpu_idle_ms_per_step: float) -> float:
        """The part of a GPU-idle finding's recorded gain an un-profiled step keeps (`idle_kept`)."""
        if self.idle_kept >= 1.0:
            return gpu_idle_ms_per_step
        return round(gpu_idle_ms_per_step * self.idle_kept, 4)

    def idle_note(self, gpu_idle_ms_per_step: float) -> str:
        """What a GPU-idle finding's title adds, given its recorded gain, where that gain is cut to
        an un-profiled step's (`idle_gain`); empty elsewhere."""
        if self.idle_kept >= 1.0 or gpu_idle_ms_per_step <= 0:
            return ""
        if self.unprofiled_idle_ms is not None:
            return (f" (un-profiled steps leave the GPU idle at most {self.unprofiled_idle_ms:.1f} ms/step "
                    "in all: the rest is the profiler's)")
        if self.gpu_step_idle_ms is not None:
            return (f" (the GPU's own steps leave it idle at most {self.gpu_step_idle_ms:.1f} ms/step in "
                    "all: the host ran ahead, and its step windows hold earlier steps' GPU work)")
        return ""


def step_basis(verdict: Verdict, busy: BusyBreakdown | None, cost: ProfilerCost | None) -> StepBasis:
    """The trace's `StepBasis` from its verdict (the host's windows and the recorded GPU-idle time),
    its GPU's busy breakdown (None without GPU work) and its profiler cost (None without
    un-profiled steps)."""
    window = verdict.step_ms
    gpu = busy.step_ms if busy is not None and busy.step_ms > 0 else None
    unprofiled = cost.unprofiled_step_ms if cost is not None else None
    if cost is not None and cost.slowed:
        recorded_idle = sum(verdict.idle.by_cause.ms) if verdict.idle is not None else 0.0
        bound = cost.unprofiled_idle_ms_per_step
        kept = min(1.0, bound / recorded_idle) if recorded_idle > 0 else 1.0
        by_busy = cost.gpu_busy_ms_per_step > cost.unprofiled_step_ms
        why = (f"the profiler made the recorded steps {cost.slowdown_pct:.0f}% longer than the "
               f"{cost.unprofiled_steps} un-profiled steps" + (
                   ", which were timed shorter than the GPU's work in a step" if by_busy else ""))
        return StepBasis(
            window_ms=window, gpu_ms=gpu, unprofiled_ms=unprofiled, judged_ms=cost.judged_step_ms,
            judged_by="gpu_busy" if by_busy else "unprofiled", why=why, unprofiled_idle_ms=bound,
            idle_kept=round(kept, 6),

        )
    if gpu is not None:
        ahead = gpu > HOST_AHEAD * window
        why = ("the host ran ahead of the GPU: its step windows are not the steps" if ahead
               else "the step as the GPU ran it (the host's window, or the GPU's work where that is longer)")

        if cost is not None:
            why += f"; the profiler did not slow the steps ({cost.slowdown_pct:+.0f}% against un-profiled)"
        # Where the host ran ahead, the windows' GPU-idle time counts no more than the GPU's steps hold.
        held: float | None = None
        kept = 1.0
        if busy is not None and ran_ahead(verdict, busy):
            span, work = gpu_step(busy)
            held = round(max(span - work, 0.0), 4)
            recorded_idle = sum(verdict.idle.by_cause.ms) if verdict.idle is not None else 0.0
            kept = round(min(1.0, held / recorded_idle), 6) if recorded_idle > 0 else 1.0
        return StepBasis(window_ms=window, gpu_ms=gpu, unprofiled_ms=unprofiled, judged_ms=gpu,
                         judged_by="gpu", why=why, gpu_step_idle_ms=held, idle_kept=kept)
    return StepBasis(window_ms=window, gpu_ms=None, unprofiled_ms=unprofiled, judged_ms=window,
                     judged_by="window", why="no GPU work: the host's step is the step")
