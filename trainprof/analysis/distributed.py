"""Question 6: with several ranks, is one of them the straggler the others wait for in collectives?"""

from __future__ import annotations

from statistics import median

from trainprof.analysis.result import Finding

# A rank is a straggler when its non-communication time per step exceeds the other ranks' median by
# this much (ms and fraction of the median step): smaller differences are noise between ranks.
_MIN_EXCESS_MS = 5.0
_MIN_EXCESS_FRACTION = 0.15


def rank_table(steps_by_rank: dict[int | str, list[dict]]) -> list[dict]:
    """Per rank (or worker name, for traces without a rank): mean step, communication (NCCL kernel)
    and non-communication ms per step."""
    table = []
    for rank, steps in sorted(steps_by_rank.items(), key=lambda item: (isinstance(item[0], str), item[0])):
        n = max(len(steps), 1)
        step_ms = sum(s["duration_ms"] for s in steps) / n
        comm_ms = sum(s["comm_ms"] for s in steps) / n
        table.append(
            {
                "rank": rank,
                "step_ms": round(step_ms, 4),
                "comm_ms": round(comm_ms, 4),
                "non_comm_ms": round(step_ms - comm_ms, 4),
                "step_ms_by_step": [s["duration_ms"] for s in steps],
            }
        )
    return table


def straggler_finding(table: list[dict]) -> Finding | None:
    """The rank whose non-communication time is much longer than the others' (they wait for it in NCCL)."""
    if len(table) < 2:
        return None
    slowest = max(table, key=lambda r: r["non_comm_ms"])
    others = [r for r in table if r is not slowest]
    others_non_comm = median(r["non_comm_ms"] for r in others)
    excess = slowest["non_comm_ms"] - others_non_comm
    if excess < max(_MIN_EXCESS_MS, _MIN_EXCESS_FRACTION * median(r["step_ms"] for r in table)):
        return None
    others_comm = median(r["comm_ms"] for r in others)
    return Finding(
        kind="straggler",
        title=(
            f"Rank {slowest['rank']} is the straggler: {excess:.1f} ms/step more non-communication work than "
            f"the other ranks, which wait {others_comm:.1f} ms/step in NCCL"
        ),
        severity="high",
        op=None,
        where={"file": None, "line": None, "function": None},
        count=1,
        per_step=1.0,
        cost_ms=round(excess, 4),
        fix=(
            "Find what rank {r} does that the others do not (its host_bound / sync findings: input pipeline, "
            "logging, checkpointing on one rank, uneven batches) and balance or overlap it."
        ).format(r=slowest["rank"]),
        rank=slowest["rank"],
        details={
            "straggler_rank": slowest["rank"],
            "excess_ms_per_step": round(excess, 4),
            "others_comm_wait_ms_per_step": round(others_comm, 4),
            "ranks": table,
        },
    )
