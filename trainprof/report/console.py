"""Render an analysis to the terminal: title, where the step went, headline, findings, tables.

The report is laid out as lines of text at the terminal's width (`trainprof.report.layout`: no line
wider than the terminal, names never cut into each other); rich, when installed and writing to a
terminal, only adds bold to the titles. Trace-derived text is never parsed as markup: a name like
`gemm[/x]` or `[link=...]` shows as written, and control characters never reach the terminal
(`trainprof.report.text`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainprof.report import _format
from trainprof.report.layout import block, items, table_lines
from trainprof.report.text import safe_text

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis, Finding

MIN_WIDTH = 40
"""Narrower terminals are laid out at this width (a line may then wrap in the terminal itself)."""


def terminal_width(file: IO[str], width: int | None = None) -> int:
    """The width to lay out at: `width` if given; the terminal's when `file` is one; else `$COLUMNS`
    when set (`COLUMNS=80 trainprof analyze ... | less`), else `PIPE_WIDTH` (logs and pipes: long
    paths and fixes stay on one line)."""
    if width is None:
        if hasattr(file, "isatty") and file.isatty():
            width = shutil.get_terminal_size((_format.PLAIN_TEXT_WIDTH, 24)).columns
        else:
            columns = os.environ.get("COLUMNS", "").strip()
            width = int(columns) if columns.isascii() and columns.isdigit() and len(columns) < 6 \
                else _format.PIPE_WIDTH
    return max(width, MIN_WIDTH)


def print_report(
    analysis: Analysis,
    file: IO[str] | None = None,
    limit: int = _format.CONSOLE_FINDINGS,
    width: int | None = None,
) -> None:
    """Print an analysis to `file` (default stdout), laid out at `width` (default `terminal_width`)."""
    file = file or sys.stdout
    width = terminal_width(file, width)
    write_lines(render_lines(analysis, limit, width), file)


def render_text(
    analysis: Analysis, limit: int = _format.CONSOLE_FINDINGS, width: int = _format.PLAIN_TEXT_WIDTH
) -> str:
    """The console report as plain text at `width` columns."""
    return "".join(f"{line}\n" for line, _ in render_lines(analysis, limit, width))


def render_lines(analysis: Analysis, limit: int, width: int) -> list[tuple[str, bool]]:
    """The report's lines, each with whether it is a title (bold on a terminal)."""
    out: list[tuple[str, bool]] = []

    def add(lines: list[str], title: bool = False) -> None:
        out.extend((line, title) for line in lines)

    add(block("trainprof: ", _format.trace_name(analysis), width), title=True)
    split = _format.step_split(analysis)
    if split is not None:
        add(block("", split, width))
    headline = _format.headline(analysis)
    # Values line up after the longest label (`exposed comm / step`), 15 columns at the least.
    label_chars = max([15, *(len(label) for label, _ in headline)])
    for label, value in headline:
        add(block(f"  {label:<{label_chars}} ", value, width))

    findings = _format.top_findings(analysis, limit)
    total = _format.finding_count(analysis)
    if findings:
        more = f" ({len(findings)} of {total})" if total > len(findings) else ""
        add([f"Top findings{more}"], title=True)
        for index, finding in enumerate(findings, 1):
            add(finding_lines(finding, index, findings, width, analysis))
    else:
        add(["No findings."])

    for table in _format.tables(analysis, per_kind=_format.CONSOLE_TABLES_PER_KIND):
        lines = table_lines(table, width)
        add(lines[:1], title=True)
        add(lines[1:])
    return out


def finding_lines(finding: Finding, index: int, findings: list[Finding], width: int,
                  analysis: Analysis | None = None) -> list[str]:
    """One finding as a block: `N. [severity] source title` (wrapped under the title's first word),
    its facts (its GPU time as a share of its step where `analysis` is given), and its fix. Every
    kind of finding renders this way."""
    severity, title, *_, fix = _format.finding_row(finding)
    source = _format.source_of(finding, findings) if _format.source_labels(findings) else "-"
    label = f"{index:>2}. [{severity}] " + (f"{source}: " if source != "-" else "")
    lines = block(label, title, width)
    lines += items(_format.finding_facts(finding, analysis), width, "    ")

    if fix != "-":
        lines += block("fix: ", fix, width, indent="    ")
    return lines


def write_lines(lines: list[tuple[str, bool]], file: IO[str]) -> None:
    """Write report lines to `file`: titles bold through rich on a terminal, else plain text."""
    if hasattr(file, "isatty") and file.isatty() and not os.environ.get("NO_COLOR"):
        try:
            from rich.console import Console
            from rich.text import Text
        except ImportError:
            pass
        else:
            console = Console(file=file, highlight=False, markup=False, emoji=False, soft_wrap=True)
            for line, title in lines:
                console.print(Text(line, style="bold" if title else ""))
            return
    file.write("".join(f"{line}\n" for line, _ in lines))


def print_written(run_dir: str | Path, names: list[str], windows: int, analysed: int | None = None,
                  file: IO[str] | None = None) -> None:
    """Say where a session's files went: the run folder, what is in it, how to look at it again.
    `analysed`: the windows the session analysed (its last ones), when fewer than it wrote: the
    command it prints analyses those."""
    file = file or sys.stdout
    run_dir = safe_text(str(run_dir), _format.TEXT_CHARS)
    parent = safe_text(str(Path(run_dir).parent), _format.TEXT_CHARS)
    listed = ", ".join(safe_text(name, _format.NAME_CHARS) for name in names)
    last = f" --windows {analysed}" if analysed is not None and analysed < windows else ""
    file.write(
        f"trainprof: wrote {run_dir}/ ({windows} trace window(s); {listed})\n"
        f"  browse: tensorboard --logdir {parent}   re-analyse: trainprof analyze {run_dir}{last}\n"
    )
