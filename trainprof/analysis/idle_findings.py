"""Findings on GPU-idle time: each cause that matters, the host code that held the GPU idle, and
the one-off costs (from `trainprof.analysis.idle`'s breakdown and the trace's verdict).

Each cause costing at least `finding_min_idle_share` of the step time (or naming the verdict) gets
a finding with its fix; profiler overhead of at least `profiler_overhead_min_share` one; each one-off
cost of at least `one_off_min_ms` a one-off finding. Launch overhead and sync points have their own
modules' findings, and so has idle time that a more specific finding explains (`explained`: a
recompile's warm-up time). Severity follows the steady-state GPU idle per step each could win back
(`trainprof.analysis.severity`): profiler overhead and one-off costs win back none in an un-profiled
steady state.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trainprof.analysis.allocator import AllocatorCalls, allocator_title
from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.causes import CAUSES, Cause, fix_for
from trainprof.analysis.host_work import HostWork
from trainprof.analysis.idle import HostFunction, IdleBreakdown, IdleHolder
from trainprof.analysis.kinds import FindingKind
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.result import Step
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import (
    FINDING_HOLDERS,
    HOST_FUNCTIONS_IN_TITLE,
    ONE_OFF_FINDINGS_KEPT,
    Thresholds,
)
from trainprof.analysis.verdict import Verdict


class IdleCauseDetails(Record, frozen=True):
    """An idle-cause finding's evidence: the cause's ms per step and share of the step time, its
    largest holders, and the trace's verdict; for blocking calls, the allocator's calls and the
    Python call behind them (`allocator.AllocatorCalls`, None when the allocator made none)."""

    idle_ms_per_step: float
    idle_pct: float
    holders: list[IdleHolder]
    verdict: Verdict
    allocator: AllocatorCalls | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; the holders and the verdict in their own JSON form."""
        holders = [holder.to_dict() for holder in self.holders]
        return {**msgspec.to_builtins(self), "holders": holders, "verdict": self.verdict.to_dict()}


class HostBoundDetails(Record, frozen=True):
    """The host-bound finding's evidence: `host` and `unknown` ms per step (named and unnamed host
    code), their share of the step time, the Python functions that held it, and the verdict."""

    idle_host_ms_per_step: float
    idle_named_ms_per_step: float
    idle_unnamed_ms_per_step: float
    idle_host_pct: float
    functions: list[HostFunction]
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; the verdict in its own JSON form."""
        return {**msgspec.to_builtins(self), "verdict": self.verdict.to_dict()}


class OneOffDetails(Record, frozen=True):
    """A one-off finding's evidence: the steps it happened in, its event and op, its idle ms."""

    steps: list[int]
    event: str | None
    op: str | None
    idle_ms: float


# The causes with a finding of their own here: (cause, kind, what the title says the host is doing).
_CAUSE_FINDINGS: tuple[tuple[Cause, FindingKind, str], ...] = (
    (Cause.INPUT, "input_bound", "waiting for input (DataLoader / data preparation on the training thread)"),
    (
        Cause.BLOCKING,
        "blocking_runtime_call",
        "inside blocking runtime calls (allocation, free, stream creation, synchronous copies)",
    ),
    (Cause.WARMUP, "recurring_warmup", "in library warm-up that recurs in several steps"),
    (Cause.COMM, "communication_wait", "inside host-side collectives, waiting for other ranks"),
    (
        Cause.PROFILER,
        "profiler_overhead",
        "in the profiler's own code (trainprof's hooks, torch.profiler), which an un-profiled run "
        "does not pay",
    ),
)


def idle_findings(
    verdict: Verdict,
    breakdown: IdleBreakdown,
    steps: list[Step],
    rank: int | None,
    thresholds: Thresholds,
    explained: dict[Cause, float] | None = None,
    allocator: AllocatorCalls | None = None,
    inference: bool = False,
    session: bool = False,
    host_work: HostWork | None = None,
    *,
    basis: StepBasis,
) -> list[Finding]:
    """The findings for the GPU-idle causes that matter (module docstring). `explained`: per cause,
    the idle ms (over all steps) that a more specific finding already holds; a cause's own finding
    comes only for what is left. `allocator`: the steps' allocator calls, which name the Python call
    behind blocking allocations (`trainprof.analysis.allocator`). `inference`, `session`: what the
    trace is (`workload`), which picks each cause's fix (`causes.fix_for`); `host_work`: what the
    host code holding the GPU idle is, where it has a name of its own (`host_work.host_work`).
    `basis`: the trace's step (`step_basis`): each finding's gain is as much of its idle time as an
    un-profiled step keeps, judged against its judged step."""
    if verdict.label == "cpu-only" or not steps:
        return []
    n = len(steps)
    step_ms = sum(s.times.duration_ms for s in steps)
    findings = []

    def share(ms: float) -> float:
        return ms / max(step_ms, 1e-9)

    def total(cause: Cause) -> float:
        held_elsewhere = (explained or {}).get(cause, 0.0)
        return max(sum(s.idle.costs[cause] for s in steps if s.idle is not None) - held_elsewhere, 0.0)

    host_ms = sum(s.idle.costs[Cause.HOST] + s.idle.costs[Cause.UNKNOWN] for s in steps if s.idle is not None)
    if share(host_ms) >= thresholds.finding_min_idle_share or verdict.label == "host-bound":
        findings.append(_host_bound_finding(verdict, breakdown, steps, rank, thresholds, host_work, basis))
    for cause, kind, title in _CAUSE_FINDINGS:
        info = CAUSES[cause]
        overhead = info.verdict is None  # the profiler's cost, not the training's: told, never urgent
        min_share = thresholds.profiler_overhead_min_share if overhead else thresholds.finding_min_idle_share
        ms = total(cause)
        # The verdict's cause always gets its finding, unless a more specific one holds its time.
        names_verdict = verdict.cause == cause and not (explained or {}).get(cause)
        if ms <= 0 or (share(ms) < min_share and not names_verdict):
            continue
        held = [h for h in breakdown.holders if h.cause == cause]
        event, op = (held[0].event, held[0].op) if held else (None, None)
        # An un-profiled run does not pay the profiler.
        recorded_ms = 0.0 if overhead else ms / n
        gpu_ms_per_step = basis.idle_gain(recorded_ms)
        # Blocking time in the allocator's calls is named by the Python call behind them.
        named = allocator if cause == Cause.BLOCKING and allocator is not None else None
        named = named if named is not None and named.where.file else None
        what = (
            f": {allocator_title(named)}" if named is not None
            else (f": mostly {event}" if event else "") + (f" in {op}" if op and op != event else "")
        )
        findings.append(
            Finding(
                kind=kind,
                title=f"GPU idle {ms / n:.1f} ms/step ({100 * share(ms):.0f}% of the step) {title}{what}"
                + basis.idle_note(recorded_ms),
                severity=severity_for(gpu_ms_per_step, basis.judged_ms, thresholds),
                op=op or event,
                where=named.where if named is not None else Where(),
                count=n,
                per_step=1.0,
                cost_ms=round(ms, 4),
                fix=(named.fix if named is not None else None) or fix_for(cause, inference, session),
                rank=rank,
                cause=info.meaning,
                gpu_ms_per_step=round(gpu_ms_per_step, 4),
                details=IdleCauseDetails(
                    idle_ms_per_step=round(ms / n, 4),
                    idle_pct=numpy_round(100 * share(ms), 2),
                    holders=held[:FINDING_HOLDERS],
                    verdict=verdict,
                    allocator=allocator if cause == Cause.BLOCKING else None,
                ),
            )
        )
    findings.extend(_one_off_findings(breakdown, rank, thresholds))
    return findings


def _host_bound_finding(
    verdict: Verdict,
    breakdown: IdleBreakdown,
    steps: list[Step],
    rank: int | None,
    thresholds: Thresholds,
    host_work: HostWork | None,
    basis: StepBasis,
) -> Finding:
    """GPU idle while the host runs other code: the functions that held it, ms per step; what that
    code is and its fix where it has a name of its own (`host_work`: an optimizer on the CPU)."""
    n = len(steps)
    named_ms = sum(s.idle.costs[Cause.HOST] for s in steps if s.idle is not None)
    unnamed_ms = sum(s.idle.costs[Cause.UNKNOWN] for s in steps if s.idle is not None)
    host_ms = named_ms + unnamed_ms
    share = host_ms / max(sum(s.times.duration_ms for s in steps), 1e-9)
    functions = breakdown.host_functions
    top = functions[0] if functions and named_ms >= unnamed_ms else None
    user = next((f for f in functions if f.code == "user"), None)
    listed = ", ".join(
        f"{f.function}"
        + (f" ({f.file})" if f.file else "")
        + (f" from {f.called_from}" if f.called_from and f.code != "user" else "")
        + f" {f.idle_ms_per_step:.2f} ms"
        for f in functions[:HOST_FUNCTIONS_IN_TITLE]
    )
    if top is not None and host_work is not None:
        what = f"{host_work.words}: {listed} per step"
    elif top is not None:
        what = f"the host runs Python: {listed} per step"
    else:
        what = "the host runs code the trace does not name (profile with with_stack=True to name it)"
    info = CAUSES[Cause.HOST if top is not None else Cause.UNKNOWN]
    gain = basis.idle_gain(host_ms / n)
    return Finding(
        kind="host_bound",
        title=f"GPU idle {host_ms / n:.1f} ms/step ({100 * share:.0f}% of the step) with no GPU work "
        f"queued while {what}" + basis.idle_note(host_ms / n),
        severity=severity_for(gain, basis.judged_ms, thresholds),
        op=None if top is not None and top.file else (top.function if top else None),
        where=Where(file=user.file if user else None, function=user.function if user else None),
        count=n,
        per_step=1.0,
        cost_ms=round(host_ms, 4),
        fix=host_work.fix if top is not None and host_work is not None else info.fix,
        rank=rank,
        cause=host_work.meaning if top is not None and host_work is not None else info.meaning,
        gpu_ms_per_step=round(gain, 4),
        details=HostBoundDetails(
            idle_host_ms_per_step=round(host_ms / n, 4),
            idle_named_ms_per_step=round(named_ms / n, 4),
            idle_unnamed_ms_per_step=round(unnamed_ms / n, 4),
            idle_host_pct=numpy_round(100 * share, 2),
            functions=functions,
            verdict=verdict,
        ),
    )


_ONE_OFF_WORDS = {
    "context": "CUDA context creation (the device's first use)",
    "warmup": "library warm-up",
}


def _one_off_findings(breakdown: IdleBreakdown, rank: int | None, thresholds: Thresholds) -> list[Finding]:
    """One finding per one-off cost (context creation, warm-up) of at least `one_off_min_ms`, the
    largest `ONE_OFF_FINDINGS_KEPT`; holders of one cost on several threads or events are merged."""
    merged: dict[tuple, tuple[IdleHolder, float, set[int]]] = {}
    for h in breakdown.one_off:
        what = "warmup" if h.cause == Cause.WARMUP else "context"
        key = (what, h.event if what == "context" else h.op or h.event)
        first, idle_ms, seen = merged.get(key, (h, 0.0, set()))
        merged[key] = (first, idle_ms + h.idle_ms, seen | set(h.steps or ()))
    findings = []
    for (what, _), (h, idle_ms, step_set) in sorted(merged.items(), key=lambda kv: -kv[1][1]):
        if idle_ms < thresholds.one_off_min_ms:
            continue
        steps = sorted(step_set)
        where = f"{h.event}" + (f" under {h.op}" if h.op and h.op != h.event else "")
        seconds = idle_ms / 1e3
        amount = f"{seconds:.1f} s" if seconds >= 1 else f"{idle_ms:.1f} ms"
        findings.append(
            Finding(
                kind="one_off",
                title=f"Step {steps[0] if steps else '?'} pays {amount} of one-off {_ONE_OFF_WORDS[what]} "
                f"({where}); not a steady-state cost",
                severity="low",
                op=h.op or h.event,
                where=Where(),
                count=1,
                per_step=0.0,
                cost_ms=round(idle_ms, 4),
                fix="Start profiling later, after the first steps: torch.profiler.schedule(wait=..., "
                "warmup=...) or skip_first=..., so the profiled steps show the steady state.",
                rank=rank,
                cause=_ONE_OFF_WORDS[what],
                gpu_ms_per_step=0.0,  # paid once: nothing per step in the steady state
                details=OneOffDetails(steps=steps, event=h.event, op=h.op, idle_ms=round(idle_ms, 4)),
            )
        )
    return findings[:ONE_OFF_FINDINGS_KEPT]
