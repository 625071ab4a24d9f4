"""The files rank 0 of a distributed session writes from the gathered summaries (`summary.ranks.json`,
`report.ranks.md`, `trainprof.gather`): the cross-rank report (`trainprof.analysis.distributed.CrossRank`).

Its tables (the ranks, the collectives against their link, the longest waits) and headline rows
(the step skew and the straggler) are `_format`'s `rank_tables` and `rank_headline`, which every
report with several ranks draws too; `tables` and `headline` here are those. Renders only; every
figure comes from the analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.result import Finding

# The tables and headline rows of the cross-rank report are `_format`'s (every report draws them).
tables = _format.rank_tables
headline = _format.rank_headline
FILES = {"summary": "summary.ranks.json", "report": "report.ranks.md"}


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
        lines += ["", "## Each rank's costliest finding of its own", ""]
        if cross.straggler_rank is not None:
            lines += [f"As each rank's own trace saw it: a rank's wait for rank "
                      f"{escape(cross.straggler_rank)} shows there as exposed communication, which the "
                      "straggler finding above explains.", ""]
        lines += table((_format.Column("rank"), _format.Column("finding")), own)
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
