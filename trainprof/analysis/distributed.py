"""Question 6: with several ranks, is one of them the straggler the others wait for in collectives?"""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.result import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.thresholds import Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Step


class RankRow(Record, frozen=True):
    """One rank (or worker name, for traces without a rank): mean step, communication (NCCL kernel)
    and non-communication ms per step, and each step's duration."""

    rank: int | str
    step_ms: float
    comm_ms: float
    non_comm_ms: float
    step_ms_by_step: list[float]


def rank_table(steps_by_rank: dict[int | str, list[Step]]) -> list[RankRow]:
    """Per rank, ranks first in order, then workers by name."""
    table = []
    for rank, steps in sorted(steps_by_rank.items(), key=lambda item: (isinstance(item[0], str), item[0])):
        n = max(len(steps), 1)
        step_ms = sum(s.times.duration_ms for s in steps) / n
        comm_ms = sum(s.times.comm_ms for s in steps) / n
        table.append(
            RankRow(
                rank=rank,
                step_ms=numpy_round(step_ms, 4),
                comm_ms=numpy_round(comm_ms, 4),
                non_comm_ms=numpy_round(step_ms - comm_ms, 4),
                step_ms_by_step=[s.times.duration_ms for s in steps],
            )
        )
    return table


class StragglerDetails(Record, frozen=True):
    """The straggler finding's evidence: the rank, its excess non-communication ms per step, the
    others' median communication wait, and the rank table."""

    straggler_rank: int | str
    excess_ms_per_step: float
    others_comm_wait_ms_per_step: float
    ranks: list[RankRow]


def straggler_finding(table: list[RankRow], thresholds: Thresholds) -> Finding | None:
    """The rank whose non-communication time is much longer than the others' (they wait for it in
    NCCL): by `straggler_min_excess_ms` and `straggler_min_excess_fraction` of the median step."""
    if len(table) < 2:
        return None
    slowest = max(table, key=lambda r: r.non_comm_ms)
    others = [r for r in table if r is not slowest]
    others_non_comm = median(r.non_comm_ms for r in others)
    excess = slowest.non_comm_ms - others_non_comm
    min_excess = max(
        thresholds.straggler_min_excess_ms,
        thresholds.straggler_min_excess_fraction * median(r.step_ms for r in table),
    )
    if excess < min_excess:
        return None
    others_comm = median(r.comm_ms for r in others)
    # The others' GPUs wait for the straggler each step: that is what balancing the work wins back.
    return Finding(
        kind="straggler",
        title=(
            f"Rank {slowest.rank} is the straggler: {excess:.1f} ms/step more non-communication work than "
            f"the other ranks, which wait {others_comm:.1f} ms/step in NCCL"
        ),
        severity=severity_for(excess, median(r.step_ms for r in table), thresholds),
        op=None,
        where=Where(),
        count=1,
        per_step=1.0,
        cost_ms=numpy_round(excess, 4),
        gpu_ms_per_step=numpy_round(excess, 4),
        fix=(
            f"Find what rank {slowest.rank} does that the others do not (its host_bound / sync findings: "
            "input pipeline, logging, checkpointing on one rank, uneven batches) and balance or overlap it."
        ),
        rank=slowest.rank,
        details=StragglerDetails(
            straggler_rank=slowest.rank,
            excess_ms_per_step=numpy_round(excess, 4),
            others_comm_wait_ms_per_step=numpy_round(others_comm, 4),
            ranks=table,
        ),
    )
