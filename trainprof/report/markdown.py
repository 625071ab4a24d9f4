"""Render an analysis as report.md: the same headline, findings and kernels as the console."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainprof.report import _format


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def render_markdown(analysis: dict[str, Any], limit: int = 20) -> str:
    """`Analysis.to_dict()` as a Markdown document."""
    lines = [f"# trainprof report: {_format.trace_name(analysis)}", ""]
    lines += [f"- **{label}**: {value}" for label, value in _format.headline(analysis)]
    lines += ["", "## Top findings", ""]
    findings = _format.top_findings(analysis, limit)
    if findings:
        lines += _table(_format.FINDING_COLUMNS, [_format.finding_row(f) for f in findings])
    else:
        lines.append("No findings.")
    kernels = _format.top_kernels(analysis)
    if kernels:
        lines += ["", "## Top kernels", ""]
        lines += _table(_format.KERNEL_COLUMNS, kernels)
    steps = analysis.get("steps") or []
    if steps:
        lines += ["", "## Steps", ""]
        rows = [
            (
                str(step.get("step")),
                _format.number(step.get("duration_ms"), 1),
                _format.number(step.get("gpu_busy_pct"), 1),
                _format.number(step.get("kernel_count"), 0),
                _format.number(step.get("sync_count"), 0),
            )
            for step in steps
        ]
        lines += _table(("step", "duration ms", "GPU busy %", "kernels", "syncs"), rows)
    return "\n".join(lines) + "\n"


def write_markdown(analysis: dict[str, Any], path: str | Path) -> Path:
    """Write report.md; returns its path."""
    path = Path(path)
    path.write_text(render_markdown(analysis), encoding="utf-8")
    return path
