"""Question 6: across ranks, who holds whom back: step times and their skew, the straggler and what
it was doing, the rank that arrived last at each collective, and each collective's transfer time.

Each rank's analysis is boiled down to a `RankSummary` (a few kB: per-step times, its verdict and
what held its GPU, its collectives' durations); `cross_rank` merges any number of them. The same
summaries come from a session's ranks, gathered by rank 0 over the job's process group
(`trainprof.gather`), and from `trainprof analyze DIR`, whose worker processes analyse one trace
each (`trainprof.analysis.folder`): no trace ever crosses a process.

Arrival, without comparing clocks (the ranks' clocks differ by more than a collective lasts): a
collective ends on every rank at about the same time, once the last rank has joined, so the rank
whose kernel was shortest arrived last, and every other rank waited the difference:

    rank 0   |==== wait ====|= transfer =|        duration 0 = wait 0 + transfer
    rank 1            |wait |= transfer =|
    rank 2                  |= transfer =|        shortest: rank 2 arrived last

The shortest duration is the collective's transfer time, which its bus bandwidth is computed
from. Collectives match across ranks by (step, group size, index among the step's collectives of
that group size); a rank without the collective, or with another op there, is left out of it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import msgspec

from trainprof.analysis.arrays import median, numpy_round
from trainprof.analysis.collectives import (
    Collective,
    CollectiveStats,
    bus_bandwidth_gbps,
    collective_stats,
    is_rocm_device,
)
from trainprof.analysis.comm_findings import slow_collective_findings
from trainprof.analysis.links import link_for
from trainprof.analysis.rank_work import RankWork, merged_work
from trainprof.analysis.records import Finding, Record
from trainprof.analysis.stragglers import (
    StragglerDetails,
    named_straggler,
    straggler_findings,
    unprofiled_late,
)
from trainprof.analysis.thresholds import CROSS_RANK_COLLECTIVES_KEPT, Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis, Step, TraceInfo


class RankSummary(msgspec.Struct, frozen=True):
    """What one rank's analysis contributes to the cross-rank report: per step its duration,
    communication and exposed communication (ms); its verdict and what held its GPU (`doing`);
    its device and collectives. Small (kilobytes) and JSON/msgpack-serialisable: it is what a rank
    sends to rank 0 (`to_bytes`, `from_bytes`)."""

    rank: int | str
    worker: str
    device: str | None
    visible_gpus: int
    step_numbers: list[int]
    step_ms_by_step: list[float]
    comm_ms_by_step: list[float]
    exposed_comm_ms_by_step: list[float]
    verdict: str
    doing: str
    collectives: list[Collective]
    work: RankWork | None = None
    """What its steps did on the measures ranks are compared on (`rank_work`); None: not known."""
    top_finding: str | None = None
    """Its own costliest finding at `low` or above, as `[severity] title`, where its analysis is at
    hand (a session's: `analysis_summary`); None: none, or not known."""

    def to_bytes(self) -> bytes:
        """The summary as msgpack bytes."""
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> RankSummary:
        """A summary from `to_bytes`' output (msgspec.ValidationError on anything else)."""
        return msgspec.msgpack.decode(data, type=cls)


def rank_summary(process: int | str, steps: list[Step], infos: list[TraceInfo]) -> RankSummary:
    """The `RankSummary` of one process from its windows' steps and trace infos (in order)."""
    calls = [call for info in infos if info.comm is not None for call in info.comm.calls]
    return RankSummary(
        rank=process,
        worker=infos[0].worker,
        device=infos[0].device,
        visible_gpus=max((info.comm.visible_gpus for info in infos if info.comm is not None), default=0),
        step_numbers=[s.times.number for s in steps],
        step_ms_by_step=[s.times.duration_ms for s in steps],
        comm_ms_by_step=[s.times.comm_ms for s in steps],
        exposed_comm_ms_by_step=[s.comm.comm_exposed_ms if s.comm is not None else 0.0 for s in steps],
        verdict=infos[0].verdict.label if len(infos) == 1 else _most_common([i.verdict.label for i in infos]),
        doing=what_it_did(infos),
        collectives=calls,
        work=merged_work([(info.work, len(info.step_numbers)) for info in infos if info.work is not None]),
    )


def analysis_summary(analysis: Analysis, rank: int | str) -> RankSummary:
    """The `RankSummary` of one process's own analysis (a session's), as rank `rank`, with its
    costliest finding (`top_finding`)."""
    summary = rank_summary(rank, analysis.steps, analysis.traces)
    top = next((f for f in analysis.findings if f.severity != "info"), None)
    return msgspec.structs.replace(summary, top_finding=f"[{top.severity}] {top.title}" if top else None)


def _most_common(labels: list[str]) -> str:
    return max(labels, key=labels.count)


def what_it_did(infos: list[TraceInfo]) -> str:
    """In words, what a rank's steps spent their time on: its verdict and why, and the largest holder
    of its GPU-idle time (the Python function, else the event)."""
    info = max(infos, key=lambda i: i.verdict.step_ms)
    text = f"{info.verdict.label} ({info.verdict.why})"
    if info.verdict.idle is None:  # cpu-only: no GPU to be idle
        return text
    functions, holders = info.idle.host_functions, info.idle.holders
    if functions and (not holders or functions[0].idle_ms_per_step >= holders[0].idle_ms_per_step):
        function = functions[0]
        place = f" ({os.path.basename(function.file)})" if function.file else ""
        text += f"; its GPU idle {function.idle_ms_per_step:.1f} ms/step in {function.function}{place}"
    elif holders:
        holder = holders[0]
        where = holder.event or "code the trace does not record"
        inside = f" under {holder.op}" if holder.op and holder.op != holder.event else ""
        text += f"; its GPU idle {holder.idle_ms_per_step:.1f} ms/step ({holder.cause.key}) in {where}"
        text += inside
    return text


class RankRow(Record, frozen=True):
    """One rank (or worker name, for traces without a rank): mean step, communication and
    non-communication ms per step, exposed communication ms per step, each step's duration, its
    verdict, how often it arrived last at a collective (% of the matched collectives it took part
    in) and how long it waited inside collectives for later ranks (ms per step: the union over
    its collectives of the time from each one's start until the last rank joined), and the part of
    that wait no compute hid (`exposed_wait_ms_per_step`, at least: per collective, its exposed
    time less the transfer's; per step, at most the step's exposed communication); its compute per
    step and how late it arrives un-profiled, where known."""

    rank: int | str
    step_ms: float
    comm_ms: float
    non_comm_ms: float
    step_ms_by_step: list[float]
    comm_exposed_ms: float
    verdict: str
    last_arrival_pct: float | None
    waited_ms_per_step: float
    exposed_wait_ms_per_step: float
    compute_ms: float | None = None
    """Its compute per step (`rank_work.RankWork.compute_ms_per_step`); None: not known."""
    unprofiled_late_ms: float | None = None
    """How much later than the other ranks it reaches its first forward in un-profiled steps
    (`stragglers.Lateness.unprofiled_late_ms_per_step`); None where a session did not time them."""
    top_finding: str | None = None
    """Its own costliest finding (`RankSummary.top_finding`); None: none, or not known."""


class CollectiveMatch(Record, frozen=True):
    """One collective matched across ranks: where, which op and message, on how many ranks; its
    transfer time (the shortest duration) and bus bandwidth, the rank that arrived last, and the
    longest wait a rank spent in it."""

    step: int
    index: int
    op: str
    bytes: int | None
    ranks: int
    transfer_us: float
    busbw_gbps: float | None
    last_rank: int | str
    max_wait_us: float


class CrossRank(msgspec.Struct):
    """The cross-rank report: the ranks' rows, the step skew (mean over steps of the slowest rank's
    step less the fastest's, ms and % of the median step), the straggler (rank and what it was
    doing), the collectives by op with their transfer-time bus bandwidth, and the matched
    collectives with the longest waits (at most `CROSS_RANK_COLLECTIVES_KEPT`)."""

    ranks: list[RankRow]
    step_skew_ms: float
    step_skew_pct: float
    straggler_rank: int | str | None
    straggler_doing: str | None
    collectives: list[CollectiveStats]
    matched: list[CollectiveMatch]
    exposed_wait_ms: dict[int | str, dict[int, float]] = msgspec.field(default_factory=dict)
    """Per rank and step number, its wait for later ranks that no compute hid (ms; each step at
    most its exposed communication): what its own verdict leaves out of its GPU's work (`core`).
    Not in the JSON form (the rows hold it per step)."""

    def to_dict(self) -> dict[str, Any]:
        """The `trace.cross_rank` object (`trainprof.analysis.result`)."""
        return {
            "ranks": [row.to_dict() for row in self.ranks],
            "step_skew_ms": self.step_skew_ms,
            "step_skew_pct": self.step_skew_pct,
            "straggler_rank": self.straggler_rank,
            "straggler_doing": self.straggler_doing,
            "collectives": [row.to_dict() for row in self.collectives],
            "matched": [row.to_dict() for row in self.matched],
        }


def _ordered(summaries: list[RankSummary]) -> list[RankSummary]:
    """Ranks first in order, then workers by name."""
    return sorted(summaries, key=lambda s: (isinstance(s.rank, str), s.rank))


def cross_rank(summaries: list[RankSummary], thresholds: Thresholds) -> tuple[CrossRank, list[Finding]]:
    """Merge the ranks' summaries (module docstring) into the cross-rank report and its findings:
    the straggler, and collectives far below their link (from transfer times)."""
    summaries = _ordered(summaries)
    works = {summary.rank: summary.work for summary in summaries}
    matched, waited_us, exposed_wait_us, last_count, present, transfer = _match(summaries)
    rows = []
    exposed_wait_by_step: dict[int | str, dict[int, float]] = {}
    for summary in summaries:
        n = max(len(summary.step_ms_by_step), 1)
        step_ms = sum(summary.step_ms_by_step) / n
        comm_ms = sum(summary.comm_ms_by_step) / n
        waits = exposed_wait_us[summary.rank]
        by_step = {
            number: round(min(waits.get(number, 0.0) / 1e3, exposed), 4)
            for number, exposed in zip(summary.step_numbers, summary.exposed_comm_ms_by_step, strict=True)
        }
        exposed_wait_by_step[summary.rank] = by_step
        exposed_wait_ms = sum(by_step.values())
        rows.append(
            RankRow(
                rank=summary.rank,
                step_ms=numpy_round(step_ms, 4),
                comm_ms=numpy_round(comm_ms, 4),
                non_comm_ms=numpy_round(step_ms - comm_ms, 4),
                step_ms_by_step=summary.step_ms_by_step,
                comm_exposed_ms=round(sum(summary.exposed_comm_ms_by_step) / n, 4),
                verdict=summary.verdict,
                last_arrival_pct=round(100 * last_count[summary.rank] / present[summary.rank], 1)
                if present[summary.rank]
                else None,
                waited_ms_per_step=round(max(waited_us[summary.rank], 0.0) / 1e3 / n, 4),
                exposed_wait_ms_per_step=round(exposed_wait_ms / n, 4),
                compute_ms=summary.work.compute_ms_per_step if summary.work is not None else None,
                unprofiled_late_ms=unprofiled_late(summary.rank, works),
                top_finding=summary.top_finding,
            )
        )
    skew_ms, skew_pct = _skew(summaries)
    findings = straggler_findings(rows, summaries, thresholds)
    straggler = named_straggler(findings)
    first = summaries[0]
    stats = collective_stats(
        transfer,
        len(first.step_ms_by_step),
        lambda group: link_for(first.device, first.visible_gpus, group),
        across_ranks=True,
    )
    median_step = median(row.step_ms for row in rows) if rows else 0.0
    median_exposed = median(row.comm_exposed_ms for row in rows) if rows else 0.0
    findings += slow_collective_findings(
        stats, median_step, median_exposed, True, None, is_rocm_device(first.device), thresholds
    )
    report = CrossRank(
        ranks=rows,
        step_skew_ms=skew_ms,
        step_skew_pct=skew_pct,
        straggler_rank=straggler.rank if straggler is not None else None,
        straggler_doing=(
            straggler.details.doing
            if straggler is not None and isinstance(straggler.details, StragglerDetails) else None
        ),
        collectives=stats,
        matched=sorted(matched, key=lambda m: -m.max_wait_us)[:CROSS_RANK_COLLECTIVES_KEPT],
        exposed_wait_ms=exposed_wait_by_step,
    )
    return report, findings


def _match(
    summaries: list[RankSummary],
) -> tuple[list[CollectiveMatch], dict, dict, dict, dict, list[Collective]]:
    """Match the ranks' collectives (module docstring). Returns the matches, per rank its wait (µs),
    its exposed wait per step number (µs, summed: `RankRow.exposed_wait_ms_per_step`) and how often
    it arrived last and took part, and per match the last arriver's record: its duration is the
    transfer time, its exposed time the transfer's."""
    by_key: dict[tuple, list[tuple[int | str, Collective]]] = defaultdict(list)
    for summary in summaries:
        for call in summary.collectives:
            by_key[(call.step, call.group_size, call.index)].append((summary.rank, call))
    matched, transfer = [], []
    waits: dict[int | str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    exposed_waits: dict[int | str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    last_count: dict[int | str, int] = defaultdict(int)
    present: dict[int | str, int] = defaultdict(int)
    for (step, _, index), members in by_key.items():
        op = members[0][1].op
        members = [(rank, call) for rank, call in members if call.op == op]
        if len(members) < 2:
            continue
        last_rank, last_call = min(members, key=lambda member: member[1].duration_us)
        shortest = last_call.duration_us
        for rank, call in members:
            present[rank] += 1
            # A rank waits from its kernel's start until the last rank joins, then transfers.
            start = call.start_offset_us
            waits[rank][step].append((start, start + call.duration_us - shortest))
            # Of its time, at most `shortest` is transfer: the rest of its exposed time is waiting.
            exposed_waits[rank][step] += max(call.exposed_us - shortest, 0.0)
        last_count[last_rank] += 1
        longest = max(call.duration_us for _, call in members)
        matched.append(
            CollectiveMatch(
                step=step,
                index=index,
                op=op,
                bytes=last_call.bytes,
                ranks=len(members),
                transfer_us=shortest,
                busbw_gbps=_rounded(bus_bandwidth_gbps(op, last_call.bytes, shortest, last_call.group_size)),
                last_rank=last_rank,
                max_wait_us=round(longest - shortest, 3),
            )
        )
        transfer.append(last_call)
    waited_us = {rank: sum(_union_us(spans) for spans in by_step.values()) for rank, by_step in waits.items()}
    return matched, defaultdict(float, waited_us), exposed_waits, last_count, present, transfer


def _union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of `spans` (collectives on several streams wait at the same time)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


def _skew(summaries: list[RankSummary]) -> tuple[float, float]:
    """Mean over the step numbers all ranks recorded of (slowest - fastest) step ms, and that as %
    of the median step."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for summary in summaries:
        for number, ms in zip(summary.step_numbers, summary.step_ms_by_step, strict=True):
            by_step[number].append(ms)
    spans = [max(times) - min(times) for times in by_step.values() if len(times) == len(summaries)]
    steps = [ms for times in by_step.values() for ms in times]
    if not spans or not steps:
        return 0.0, 0.0
    skew = sum(spans) / len(spans)
    return round(skew, 4), round(100 * skew / max(median(steps), 1e-9), 2)
