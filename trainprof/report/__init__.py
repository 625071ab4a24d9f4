"""Renderers of the typed `Analysis`: console, json, markdown, html, tensorboard (scalars, text, tab).

A report never computes a metric; it renders what the analysis holds. Every string that comes from
a trace (kernel, op, function and file names) passes through one sanitiser,
`trainprof.report.text.safe_text` (control and format characters out, cut to a length), and is
escaped for the format it lands in (Markdown/HTML in report.md; `\\uXXXX` in JSON).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis

logger = logging.getLogger("trainprof")


def output_names(rank: int | None) -> dict[str, str]:
    """File names of the summary and the reports: per rank when the process has one.

    Ranks share a run folder (the same `run_name`), so each writes its own files instead of the last
    writer's winning: `summary.rank1.json`, `report.rank1.md`, `report.rank1.html`; `summary.json`,
    `report.md`, `report.html` otherwise.
    """
    if rank is None:
        return {"summary": "summary.json", "report": "report.md", "html": "report.html"}
    return {"summary": f"summary.rank{rank}.json", "report": f"report.rank{rank}.md",
            "html": f"report.rank{rank}.html"}


def write_reports(
    analysis: Analysis,
    run_dir: str | Path,
    *,
    tensorboard_scalars: bool = True,
    console: bool = True,
    rank: int | None = None,
) -> dict[str, Path]:
    """Write the summary (JSON) and the reports (Markdown, HTML) into `run_dir`, TensorBoard scalars
    and text if asked, and print the summary; returns `{"summary": path, "report": path, "html":
    path}` (names from `output_names(rank)`; no `html` when writing it failed, which is logged).

    report.html draws the analysis's views when it has them (`analyze(..., views=True)`).
    """
    from trainprof.report.html import write_html
    from trainprof.report.json import write_json
    from trainprof.report.markdown import write_markdown

    run_dir = Path(run_dir)
    names = output_names(rank)
    written = {
        "summary": write_json(analysis, run_dir / names["summary"]),
        "report": write_markdown(analysis, run_dir / names["report"]),
    }
    try:
        written["html"] = write_html(analysis, run_dir / names["html"])
    except Exception:  # the page is a view of what is written above: its failure loses nothing else
        logger.warning("trainprof: writing %s failed", names["html"], exc_info=True)
    if tensorboard_scalars:
        from trainprof.report.tensorboard import write_scalars

        write_scalars(analysis, run_dir)
    if console:
        from trainprof.report.console import print_report

        print_report(analysis)
    return written
