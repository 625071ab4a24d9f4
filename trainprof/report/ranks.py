"""Render the cross-rank report (`trainprof.analysis.distributed.CrossRank`): the ranks' table, the
step skew and the straggler, the collectives against their link, and the longest waits.

Two uses: the headline rows and tables of every report when an analysis spans several ranks
(`_format.headline`, `_format.TABLES`; report.html's ranks section), and the files rank 0 of a
distributed session writes from the gathered summaries (`summary.ranks.json`, `report.ranks.md`,
`trainprof.gather`). Renders only; every figure comes from the analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.result import Finding

Column = _format.Column
RANK_COLUMNS = (
    Column("rank"),
    Column("step ms", numeric=True),
    Column("comm ms", numeric=True, drop=3),
    Column("exposed comm ms", numeric=True, drop=1),
    Column("non-comm ms", numeric=True, drop=2),
    Column("waited ms", numeric=True),
    Column("exposed wait ms", numeric=True, drop=5),
    Column("arrived last %", numeric=True, drop=4),
    Column("compute ms", numeric=True, drop=7),
    Column("un-profiled late ms", numeric=True, drop=8),
    Column("verdict"),
    Column("each step ms", drop=6),
)
COLLECTIVE_COLUMNS = (
    Column("op"),
    Column("library", drop=5),
    Column("ranks", numeric=True, drop=6),
    Column("calls / step", numeric=True, drop=4),
    Column("median MiB", numeric=True, drop=3),
    Column("ms / step", numeric=True),
    Column("exposed ms / step", numeric=True, drop=1),
    Column("bus GB/s", numeric=True),
    Column("link", drop=2),
    Column("% of link", numeric=True),
)
WAIT_COLUMNS = (
    Column("step"),
    Column("#", numeric=True, drop=3),
    Column("op"),
    Column("MiB", numeric=True, drop=2),
    Column("transfer µs", numeric=True, drop=1),
    Column("arrived last", numeric=True),
    Column("longest wait µs", numeric=True),
)
WAIT_ROWS = 10
"""Rows of the longest-waits table in report.md (summary.ranks.json keeps them all)."""
STRAGGLER_MARK = " (straggler)"
"""After the straggler's rank in the ranks' table."""
FILES = {"summary": "summary.ranks.json", "report": "report.ranks.md"}


def _mib(value: Any) -> str:
    return _format.number(value / 2**20, 2) if value else "-"


def rank_rows(cross: CrossRank) -> list[tuple[str, ...]]:
    """The rows of the ranks' table; the straggler's rank says so."""
    return [
        (
            _format.clean(row.rank) + (STRAGGLER_MARK if row.rank == cross.straggler_rank else ""),
            _format.number(row.step_ms, 1),
            _format.number(row.comm_ms, 1),
            _format.number(row.comm_exposed_ms, 1),
            _format.number(row.non_comm_ms, 1),
            _format.number(row.waited_ms_per_step, 1),
            _format.number(row.exposed_wait_ms_per_step, 1),
            _format.number(row.last_arrival_pct, 0),
            _format.number(row.compute_ms, 1),
            _format.number(row.unprofiled_late_ms, 1),
            _format.clean(row.verdict),
            " ".join(_format.number(ms, 1) for ms in row.step_ms_by_step),
        )
        for row in cross.ranks
    ]


def collective_rows(cross: CrossRank) -> list[tuple[str, ...]]:
    """The rows of the collectives' table (bus bandwidth from the transfer times across ranks)."""
    return [
        (
            _format.clean(row.op),
            _format.clean(row.library),
            _format.number(row.group_size, 0),
            _format.number(row.calls_per_step, 1),
            _mib(row.median_bytes),
            _format.number(row.ms_per_step, 2),
            _format.number(row.exposed_ms_per_step, 2),
            _format.number(row.busbw_gbps, 1),
            f"{row.link.kind} {row.link.gbps:.0f} GB/s" if row.link is not None else "-",
            _format.number(row.link_pct, 0),
        )
        for row in cross.collectives
    ]


def wait_rows(cross: CrossRank, limit: int = WAIT_ROWS) -> list[tuple[str, ...]]:
    """The rows of the longest-waits table: collectives where some rank waited longest."""
    return [
        (
            str(match.step),
            str(match.index),
            _format.clean(match.op),
            _mib(match.bytes),
            _format.number(match.transfer_us, 1),
            _format.clean(match.last_rank),
            _format.number(match.max_wait_us, 1),
        )
        for match in cross.matched[:limit]
    ]


def tables(cross: CrossRank) -> list[_format.Table]:
    """The ranks' table, then (when known) the collectives across ranks and the longest waits."""
    found = [_format.Table("Ranks", RANK_COLUMNS, rank_rows(cross))]
    if cross.collectives:
        title = "Collectives across ranks (bus bandwidth from the last arriver's time)"
        found.append(_format.Table(title, COLLECTIVE_COLUMNS, collective_rows(cross)))
    if cross.matched:
        found.append(_format.Table("Longest waits inside collectives", WAIT_COLUMNS, wait_rows(cross)))
    return found


def headline(cross: CrossRank) -> list[tuple[str, str]]:
    """(label, value) rows: the skew and the straggler."""
    rows = [("step skew", f"{cross.step_skew_ms:.1f} ms ({cross.step_skew_pct:.1f}% of the median step)")]
    if cross.straggler_rank is not None:
        doing = _format.clean(cross.straggler_doing)
        rows.append(("straggler", f"rank {_format.clean(cross.straggler_rank)}: {doing}"))
    else:
        rows.append(("straggler", "none"))
    return rows


def render_cross_rank(
    cross: CrossRank, findings: list[Finding], reported: int, world_size: int | None, missing: list[int]
) -> str:
    """report.ranks.md: what rank 0 gathered, the skew and the straggler, the cross-rank findings,
    then the `tables`."""
    from trainprof.report.markdown import escape, table

    of = f" of {world_size}" if world_size is not None else ""
    lines = [f"# trainprof cross-rank report: {reported}{of} ranks", ""]
    if missing:
        lines += [f"- **ranks without a summary**: {escape(', '.join(map(str, missing)))} (their loop "
                  "raised, their analysis failed, or they did not report before the timeout)"]
    lines += [f"- **{label}**: {escape(value)}" for label, value in headline(cross)]
    lines += ["", "## Findings across ranks", ""]
    rows = [_format.finding_row(f) for f in findings]
    lines += table(_format.FINDING_COLUMNS, rows) if rows else ["No finding across ranks."]
    own = [(_format.clean(row.rank), _format.clean(row.top_finding))
           for row in cross.ranks if row.top_finding]
    if own:  # each rank's own report holds the rest
        lines += ["", "## Each rank's costliest finding of its own", "",
                  *table((_format.Column("rank"), _format.Column("finding")), own)]
    for found in tables(cross):
        lines += ["", f"## {escape(found.title)}", "", *table(found.columns, found.rows)]
    return "\n".join(lines) + "\n"


def write_cross_rank(
    cross: CrossRank,
    findings: list[Finding],
    run_dir: str | Path,
    world_size: int | None,
    missing: list[int],
) -> dict[str, Path]:
    """Write `summary.ranks.json` and `report.ranks.md` into `run_dir`; returns their paths."""
    from trainprof.analysis.result import SCHEMA_VERSION
    from trainprof.files import write_text_atomically
    from trainprof.report.json import dumps

    run_dir = Path(run_dir)
    document = {
        "schema_version": SCHEMA_VERSION,
        "ranks_reported": len(cross.ranks),
        "world_size": world_size,
        "missing_ranks": missing,
        "cross_rank": cross.to_dict(),
        "findings": [finding.to_dict() for finding in findings],
    }
    report = render_cross_rank(cross, findings, len(cross.ranks), world_size, missing)
    return {
        "summary": write_text_atomically(run_dir / FILES["summary"], dumps(document, indent=True) + "\n"),
        "report": write_text_atomically(run_dir / FILES["report"], report),
    }


def print_cross_rank(cross: CrossRank, path: Path, file: IO[str] | None = None) -> None:
    """Two lines on the console: the cross-rank headline and where the report went."""
    file = file or sys.stdout
    text = "; ".join(f"{label} {value}" for label, value in headline(cross))
    file.write(_format.clean(f"trainprof: {len(cross.ranks)} ranks: {text}") + "\n")
    file.write(f"  cross-rank report: {path}\n")
