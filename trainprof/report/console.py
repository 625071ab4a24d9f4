"""Render an analysis to the terminal: headline, top findings, top kernels (rich if installed)."""

from __future__ import annotations

import sys
from typing import IO, Any

from trainprof.report import _format

_CELL_LIMIT = 90  # the console shows the start of long titles and fixes; report.md has them whole


def print_report(
    analysis: dict[str, Any], file: IO[str] | None = None, limit: int = 10, width: int | None = None
) -> None:
    """Print `Analysis.to_dict()` to `file` (default stdout) as tables.

    Width: the terminal's; 160 columns when `file` is not a terminal (logs, pipes), so that file
    paths and fixes are not folded.
    """
    file = file or sys.stdout
    try:
        from rich.console import Console
    except ImportError:
        file.write(render_text(analysis, limit))
        return
    if width is None and not (hasattr(file, "isatty") and file.isatty()):
        width = 160
    _print_rich(analysis, Console(file=file, highlight=False, soft_wrap=False, width=width), limit)


def _print_rich(analysis: dict[str, Any], console: Any, limit: int) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(Text.assemble(("trainprof", "bold"), f": {_format.trace_name(analysis)}"))
    head = Table(show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    for label, value in _format.headline(analysis):
        head.add_row(label, value)
    console.print(head)

    findings = _format.top_findings(analysis, limit)
    if findings:
        table = Table(title="Top findings", title_justify="left", show_lines=False)
        for column in _format.FINDING_COLUMNS:
            numeric = column in ("per step", "cost ms")
            table.add_column(column, justify="right" if numeric else "left", overflow="fold")
        for finding in findings:
            table.add_row(*_format.finding_row(finding, text_limit=_CELL_LIMIT))
        console.print(table)
    else:
        console.print("No findings.")

    kernels = _format.top_kernels(analysis)
    if kernels:
        table = Table(title="Top kernels", title_justify="left")
        for column in _format.KERNEL_COLUMNS:
            table.add_column(column, justify="left" if column == "kernel" else "right", overflow="fold")
        for row in kernels:
            table.add_row(*row)
        console.print(table)


def render_text(analysis: dict[str, Any], limit: int = 10) -> str:
    """Plain-text form of the same report (used when rich is not installed)."""
    lines = [f"trainprof: {_format.trace_name(analysis)}"]
    lines += [f"  {label:<15} {value}" for label, value in _format.headline(analysis)]
    findings = _format.top_findings(analysis, limit)
    lines.append("Top findings:" if findings else "No findings.")
    for finding in findings:
        severity, title, op, where, per_step, cost, fix = _format.finding_row(finding, _CELL_LIMIT)
        lines.append(f"  [{severity}] {title}  op={op}  at {where}  per step={per_step}  cost={cost} ms")
        lines.append(f"      fix: {fix}")
    kernels = _format.top_kernels(analysis)
    if kernels:
        lines.append("Top kernels:")
        lines += [f"  {name}  calls={calls}  total={ms} ms  mean={mean} us  {pct}%"
                  for name, calls, ms, mean, pct in kernels]
    return "\n".join(lines) + "\n"
