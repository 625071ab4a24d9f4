"""Across ranks, which rank the others wait for, and why: a straggler is a rank with more work or a
cause of its own, never a rank whose host only fell behind under the profiler.

Every rank whose time outside collectives (`RankRow.non_comm_ms`) exceeds the other ranks' median
by the straggler bar (`straggler_min_excess_ms`, `straggler_min_excess_fraction` of the median step)
held the others back: they waited for it inside collectives. What it did with that time is judged
on what the profiler does not distort (`trainprof.analysis.rank_work`):

    rank 0  |fwd|bwd|===== wait in all_reduce =====|opt|      the others wait for rank 1
    rank 1  |...... late ......|fwd|bwd|all_reduce|opt|
                 ^ more work?  (GPU compute, FLOPs, kernels: the profiler leaves them alone)
                 ^ a cause of its own?  (input, named host code, unrecorded code, blocking calls:
                   time on its loop's thread the other ranks do not have)
                 ^ neither: launch and host overhead, which the profiler adds per op

- **more work**: its GPU compute exceeds the others' by the bar (uneven batches or sequence lengths
  name their op shapes; the same kernels and FLOPs taking longer name a slower GPU); on a CPU-only
  trace, its ops take longer *and* their recorded FLOPs are `straggler_min_work_share` more (op
  times alone also move with contention for the host's cores);
- **a cause of its own**: a (cause, frame) of its loop's thread with the bar's excess over the
  others' median time in it, and at least `straggler_own_cause_ratio` times it (the profiler's cost
  makes every rank's frames a little longer, not one rank's many times longer);
- **neither**: `profiler_skew`, one `info` line: the ranks do the same work and the lateness is
  launch and host overhead, which the profiler adds; never a straggler verdict.

In a session each rank also timed its un-profiled steps: the time from a step's start to its first
forward (input, sleeps, logging between steps), as the GPU saw it. With the compute above, that
says when each rank arrives at the step's collectives without the profiler. A rank late there by
the bar is a straggler even when its recorded trace names no cause (its host is slower at the same
work); a cause straggler the un-profiled steps do not show late keeps its finding at `low`, saying
so, and takes no verdict (its cause may lie inside its forward or backward, which that timing does
not reach, or be the profiler's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainprof.analysis.arrays import median, numpy_round
from trainprof.analysis.frames import parse_py_frame
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import RankRow, RankSummary
    from trainprof.analysis.rank_work import HostTime, RankWork
    from trainprof.analysis.thresholds import Thresholds

VERDICT_SEVERITIES = ("high", "medium")
"""A straggler finding names the headline verdict (`straggler: rank R`) at these severities only."""


def named_straggler(findings: list[Finding]) -> Finding | None:
    """The straggler finding that names the verdict (`VERDICT_SEVERITIES`), if any."""
    return next((f for f in findings if f.kind == "straggler" and f.severity in VERDICT_SEVERITIES), None)

CAUSE_WORDS = {
    "input": "waiting for or preparing its input",
    "host": "in host code",
    "unknown": "in code the trace does not record (a sleep, Python without stacks, a C extension)",
    "blocking": "in blocking runtime calls",
}


class Lateness(Record, frozen=True):
    """What one late rank's excess time outside collectives is made of (ms per step, against the
    other ranks' median): its GPU (or CPU-only op) compute, and its largest cause of its own."""

    excess_ms_per_step: float
    compute_excess_ms_per_step: float
    gflop_ratio: float | None
    """Its recorded FLOPs per step over the others' median (None: shapes not recorded)."""
    kernel_delta_per_step: float
    uneven_ops: list[str]
    """Op shapes of its that the others lack (e.g. `aten::mm [8, 4096, 2048] [2048, 2048]`)."""
    own_cause: str | None
    own_event: str | None
    own_excess_ms_per_step: float
    unprofiled_late_ms_per_step: float | None
    """How much later than the others' median it reaches its first forward in un-profiled steps;
    None where not every rank timed it."""


class StragglerDetails(Record, frozen=True):
    """The straggler finding's evidence: the rank, its excess non-communication ms per step, the
    others' median communication wait, how often it arrived last at a collective, what made it late
    (`why`, in words, and `lateness`), and the rank table."""

    straggler_rank: int | str
    excess_ms_per_step: float
    others_comm_wait_ms_per_step: float
    last_arrival_pct: float | None
    doing: str
    lateness: Lateness
    ranks: list[RankRow]


class ProfilerSkewDetails(Record, frozen=True):
    """The profiler-skew finding's evidence: the rank that ran late while recorded, by how much,
    what its work and causes against the others' came to, and the rank table."""

    late_rank: int | str
    lateness: Lateness
    ranks: list[RankRow]


def lateness(rank: int | str, works: dict, rows: dict, thresholds: Thresholds) -> Lateness:
    """The `Lateness` of `rank` against the median of the other ranks (module docstring)."""
    mine: RankWork | None = works.get(rank)
    others = [w for r, w in works.items() if r != rank and w is not None]
    excess = rows[rank].non_comm_ms - median(row.non_comm_ms for r, row in rows.items() if r != rank)
    if mine is None or not others:
        return Lateness(numpy_round(excess, 4), 0.0, None, 0.0, [], None, None, 0.0, None)
    compute = mine.compute_ms_per_step - median(w.compute_ms_per_step for w in others)
    gflops = [w.gflop_per_step for w in others if w.gflop_per_step is not None]
    ratio = None
    if mine.gflop_per_step is not None and gflops and median(gflops) > 0:
        ratio = round(mine.gflop_per_step / median(gflops), 4)
    theirs = {(op.op, op.shapes) for w in others for op in w.ops}
    uneven = [f"{op.op} {op.shapes}" for op in mine.ops if (op.op, op.shapes) not in theirs]
    cause, event, own = _own_cause(mine, others, thresholds)
    return Lateness(
        excess_ms_per_step=numpy_round(excess, 4),
        compute_excess_ms_per_step=numpy_round(compute, 4),
        gflop_ratio=ratio,
        kernel_delta_per_step=round(mine.kernels_per_step - median(w.kernels_per_step for w in others), 2),
        uneven_ops=uneven[:3],
        own_cause=cause,
        own_event=event,
        own_excess_ms_per_step=numpy_round(own, 4),
        unprofiled_late_ms_per_step=unprofiled_late(rank, works),
    )


def _own_cause(
    mine: RankWork, others: list[RankWork], thresholds: Thresholds
) -> tuple[str | None, str | None, float]:
    """The (cause, frame) of `mine`'s loop thread with the largest excess over the others' median
    that is also `straggler_own_cause_ratio` times it; (None, None, 0) when none is.

    A named Python function counts with all its time. An op, an annotation or code the trace does
    not record counts only with its stretches of a millisecond or more (`HostTime.long_ms_per_step`):
    the profiler's cost per op, and the Python between ops of a trace without stacks, lands there
    in stretches of microseconds, on every rank and most on the rank it slows most."""
    theirs = [{(h.cause, h.event): _weighed(h) for h in w.host} for w in others]
    best: tuple[str | None, str | None, float] = (None, None, 0.0)
    for held in mine.host:
        typical = median(table.get((held.cause, held.event), 0.0) for table in theirs)
        ms = _weighed(held)
        excess = ms - typical
        if ms >= thresholds.straggler_own_cause_ratio * typical and excess > best[2]:
            best = (held.cause, held.event, excess)
    return best


def _weighed(held: HostTime) -> float:
    """The ms per step of a holder that `_own_cause` compares."""
    named = held.event is not None and parse_py_frame(held.event) is not None
    return held.ms_per_step if named else held.long_ms_per_step


def unprofiled_late(rank: int | str, works: dict) -> float | None:
    """How much later than the other ranks' median `rank` reaches its first forward in un-profiled
    steps (ms per step); None unless every rank timed it."""
    reached = {
        r: w.unprofiled_pre_forward_ms for r, w in works.items()
        if w is not None and w.unprofiled_pre_forward_ms is not None
    }
    if rank not in reached or len(reached) != len(works) or len(reached) < 2:
        return None
    return numpy_round(reached[rank] - median(t for r, t in reached.items() if r != rank), 4)


def judged(late: Lateness, on_gpu: bool, bar_ms: float, thresholds: Thresholds) -> str | None:
    """What made a late rank late: `work`, `cause`, `unprofiled` (late un-profiled too, no cause
    named), or None (the profiler's skew)."""
    more_work = late.compute_excess_ms_per_step >= bar_ms
    if not on_gpu:  # op times also move with contention for the host's cores: the FLOPs must say so
        more_work = more_work and (late.gflop_ratio or 0.0) >= 1.0 + thresholds.straggler_min_work_share
    own = late.own_excess_ms_per_step >= bar_ms
    if more_work and late.compute_excess_ms_per_step >= late.own_excess_ms_per_step:
        return "work"
    if own:
        return "cause"
    if more_work:
        return "work"
    if late.unprofiled_late_ms_per_step is not None and late.unprofiled_late_ms_per_step >= bar_ms:
        return "unprofiled"
    return None


def why_late(rank: int | str, late: Lateness, reason: str, on_gpu: bool) -> str:
    """In words, what made `rank` late (`judged`'s `reason`)."""
    if reason == "work":
        where = "GPU compute" if on_gpu else "compute (its ops)"
        text = f"{late.compute_excess_ms_per_step:.1f} ms/step more {where} than the other ranks"
        if late.gflop_ratio is not None and abs(late.gflop_ratio - 1.0) >= 0.01:
            text += f", {100 * (late.gflop_ratio - 1):+.0f}% FLOPs"
        if late.uneven_ops:
            text += f" (op shapes the others lack: {'; '.join(late.uneven_ops)})"
        elif late.gflop_ratio is not None and abs(late.gflop_ratio - 1.0) < 0.01:
            text += " for the same FLOPs and kernels: a slower or throttled GPU, or another process on it"
        return text
    if reason == "cause":
        words = CAUSE_WORDS.get(late.own_cause or "", late.own_cause or "")
        event = f" `{late.own_event}`" if late.own_event else ""
        return f"{late.own_excess_ms_per_step:.1f} ms/step more than the other ranks {words}{event}"
    return (
        f"it reaches its first forward {late.unprofiled_late_ms_per_step:.1f} ms/step after the others in "
        "un-profiled steps too, with the same work and no cause of its own in the trace"
    )


def straggler_findings(
    table: list[RankRow], summaries: list[RankSummary], thresholds: Thresholds
) -> list[Finding]:
    """The straggler finding (the latest rank with a reason of its own: `judged`) or, where ranks ran
    late with none, one `profiler_skew` finding (module docstring)."""
    if len(table) < 2:
        return []
    rows = {row.rank: row for row in table}
    works = {s.rank: s.work for s in summaries}
    median_step = median(row.step_ms for row in table)
    bar = max(thresholds.straggler_min_excess_ms, thresholds.straggler_min_excess_fraction * median_step)
    late_rows = sorted(
        (row for row in table if row.non_comm_ms - _others_median(rows, row.rank) >= bar),
        key=lambda row: -row.non_comm_ms,
    )
    skewed = None
    for row in late_rows:
        late = lateness(row.rank, works, rows, thresholds)
        work = works.get(row.rank)
        on_gpu = work is not None and work.on_gpu
        reason = judged(late, on_gpu, bar, thresholds) if work is not None else "legacy"
        if reason is None:
            skewed = skewed or (row, late)
            continue
        return [_straggler(row, late, reason, on_gpu, table, summaries, bar, median_step, thresholds)]
    if skewed is not None:
        row, late = skewed
        work = works.get(row.rank)
        return [_skew_finding(row, late, work is not None and work.on_gpu, table)]
    return []


def _others_median(rows: dict, rank: int | str) -> float:
    return median(row.non_comm_ms for r, row in rows.items() if r != rank)


def _straggler(
    row: RankRow,
    late: Lateness,
    reason: str,
    on_gpu: bool,
    table: list[RankRow],
    summaries: list[RankSummary],
    bar: float,
    median_step: float,
    thresholds: Thresholds,
) -> Finding:
    others = [r for r in table if r is not row]
    others_comm = median(r.comm_ms for r in others)
    excess = late.excess_ms_per_step
    # What balancing it wins back: the GPU time the others wait for it with no compute to hide
    # the wait (their exposed communication holds the rest), at most its excess; its excess
    # where no collective shows the wait.
    others_wait = median(r.exposed_wait_ms_per_step for r in others)
    won_ms = min(excess, others_wait) if others_comm > 0 else excess
    if reason == "cause" and late.unprofiled_late_ms_per_step is not None:
        # Un-profiled it is this much late, not what the profiler made of it: 2 H200s, a 150 ms sleep,
        # the others waited 246 ms/step recorded and the fix took 82-137 ms off un-profiled steps.
        won_ms = min(won_ms, max(late.unprofiled_late_ms_per_step, 0.0))
    summary = next(s for s in summaries if s.rank == row.rank)
    why = summary.doing if reason == "legacy" else why_late(row.rank, late, reason, on_gpu)
    severity = severity_for(won_ms, median_step, thresholds)
    checked = ""
    unprofiled = late.unprofiled_late_ms_per_step
    if reason == "cause" and unprofiled is not None and unprofiled < bar:
        severity = "low"
        checked = (
            f"; un-profiled, it reaches its first forward only {unprofiled:.1f} ms/step after the others, "
            "so this holds while recorded only, or the cause lies inside its forward or backward"
        )
    elif unprofiled is not None and reason == "cause":
        checked = f"; un-profiled too, it reaches its first forward {unprofiled:.1f} ms/step after the others"
    arrived = (
        f"; it arrived last at {row.last_arrival_pct:.0f}% of the collectives"
        if row.last_arrival_pct is not None
        else ""
    )
    return Finding(
        kind="straggler",
        title=(
            f"Rank {row.rank} is the straggler: {why}; the other ranks wait {others_comm:.1f} ms/step in "
            f"collectives{arrived}{checked}"
        ),
        severity=severity,
        op=None,
        where=Where(),
        count=1,
        per_step=1.0,
        cost_ms=numpy_round(excess, 4),
        fix=_FIXES.get(reason, _FIXES["cause"]).format(rank=row.rank),
        rank=row.rank,
        cause=why,
        gpu_ms_per_step=round(won_ms, 4),
        details=StragglerDetails(
            straggler_rank=row.rank,
            excess_ms_per_step=numpy_round(excess, 4),
            others_comm_wait_ms_per_step=numpy_round(others_comm, 4),
            last_arrival_pct=row.last_arrival_pct,
            doing=why,
            lateness=late,
            ranks=table,
        ),
    )


_FIXES = {
    "work": (
        "Balance the work: give every rank the same tokens per step (pack or bucket sequences by "
        "length, a sampler that balances token counts across ranks, equal micro-batch sizes); where "
        "the same work runs slower on rank {rank}, check its GPU (nvidia-smi: clocks, temperature, "
        "other processes)."
    ),
    "cause": (
        "Take rank {rank}'s own cost off the step or off that rank: an input pipeline with workers "
        "and prefetching, logging and checkpointing every N steps or on another thread, evaluation "
        "outside the training loop; or give every rank the same share of it."
    ),
    "unprofiled": (
        "Find what rank {rank} does between its optimizer step and its next forward that the others "
        "do not (the trace recorded it too briefly to name: profile that rank with with_stack=True), "
        "or give its host the same resources as the others: pin each rank's process to the cores of "
        "its GPU's NUMA node (torchrun --numa-binding, or numactl) and keep other processes off them."
    ),
}


def _skew_finding(row: RankRow, late: Lateness, on_gpu: bool, table: list[RankRow]) -> Finding:
    unprofiled = late.unprofiled_late_ms_per_step
    compute = abs(late.compute_excess_ms_per_step)
    same_work = (
        f"the same work as the others (GPU compute within {compute:.1f} ms/step)" if on_gpu
        else f"the same ops and FLOPs as the others (its ops' time within {compute:.1f} ms/step: ranks "
        "contend for the host's cores)"
    )
    checked = (
        f"; un-profiled, it reaches its first forward {unprofiled:+.1f} ms/step from the others"
        if unprofiled is not None
        else "; to confirm without the profiler, run under trainprof.session, which times un-profiled steps"
    )
    return Finding(
        kind="profiler_skew",
        title=(
            f"No straggler: rank {row.rank} ran {late.excess_ms_per_step:.1f} ms/step longer outside "
            f"collectives while recorded, with {same_work} and no cause of its own: its host fell "
            f"behind in launch and host overhead, which the profiler adds per op{checked}"
        ),
        severity="info",
        op=None,
        where=Where(),
        count=1,
        per_step=1.0,
        cost_ms=0.0,
        fix=(
            "Nothing to balance between ranks. Read each rank's verdict by its un-profiled step (a "
            "session's `profiler_slowdown`); a trace recorded with fewer options (with_stack=False, "
            "record_shapes=False) skews less."
        ),
        rank=row.rank,
        cause="the profiler's cost per op slowed one rank's host more than the others'",
        gpu_ms_per_step=0.0,
        details=ProfilerSkewDetails(late_rank=row.rank, lateness=late, ranks=table),
    )
