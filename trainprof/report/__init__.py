"""Renderers of an analysis (`Analysis.to_dict()`): console, json, markdown, tensorboard scalars.

A report never computes a metric; it renders what the analysis holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_reports(
    analysis: dict[str, Any],
    run_dir: str | Path,
    *,
    tensorboard_scalars: bool = True,
    console: bool = True,
) -> dict[str, Path]:
    """Write summary.json and report.md into `run_dir`, scalars if asked, and print the summary."""
    from trainprof.report.json import write_json
    from trainprof.report.markdown import write_markdown

    run_dir = Path(run_dir)
    written = {
        "summary": write_json(analysis, run_dir / "summary.json"),
        "report": write_markdown(analysis, run_dir / "report.md"),
    }
    if tensorboard_scalars:
        from trainprof.report.tensorboard import write_scalars

        write_scalars(analysis, run_dir)
    if console:
        from trainprof.report.console import print_report

        print_report(analysis)
    return written
