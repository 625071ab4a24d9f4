"""Render an analysis to the terminal: headline, top findings, top kernels (rich if installed).

Findings are blocks, not table rows, so that a title or a fix wraps at word boundaries on any
terminal width (80 columns included) instead of being cut or broken mid-word. Trace-derived text
goes to rich as `Text` (never as markup), so a name like `gemm[/x]` or `[link=...]` shows as written.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis, Finding


def _console(file: IO[str], width: int | None) -> Any:
    from rich.console import Console

    if width is None and not (hasattr(file, "isatty") and file.isatty()):
        width = _format.PIPE_WIDTH
    return Console(file=file, highlight=False, markup=False, emoji=False, width=width)


def print_report(
    analysis: Analysis,
    file: IO[str] | None = None,
    limit: int = _format.CONSOLE_FINDINGS,
    width: int | None = None,
) -> None:
    """Print an analysis to `file` (default stdout).

    Width: the terminal's; `PIPE_WIDTH` columns when `file` is not a terminal (logs, pipes).
    """
    file = file or sys.stdout
    try:
        console = _console(file, width)
    except ImportError:
        file.write(render_text(analysis, limit, width or _format.PLAIN_TEXT_WIDTH))
        return
    _print_rich(analysis, console, limit)


def _finding_lines(finding: Finding, index: int, show_rank: bool) -> tuple[str, str, str]:
    """The three lines of a finding block: headline, evidence, fix."""
    severity, title, op, where, per_step, cost, fix = _format.finding_row(finding)
    rank = f"rank {_format.rank_of(finding)}  " if show_rank else ""
    head = f"{index:>2}. [{severity}] {rank}{title}"
    evidence = f"op {op}   at {where}   {per_step} per step   cost {cost} ms"
    return head, evidence, f"fix: {fix}"


def _print_rich(analysis: Analysis, console: Any, limit: int) -> None:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    console.print(Text.assemble(("trainprof", "bold"), f": {_format.trace_name(analysis)}"))
    head = Table(show_header=False, box=None)
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    for label, value in _format.headline(analysis):
        head.add_row(label, Text(value))
    console.print(head)

    findings = _format.top_findings(analysis, limit)
    if findings:
        console.print(Text("Top findings", style="italic"))
        show_rank = _format.has_ranks(findings)
        for index, finding in enumerate(findings, 1):
            first, evidence, fix = _finding_lines(finding, index, show_rank)
            console.print(Text(first, style="bold"))
            console.print(Padding(Text(evidence), (0, 0, 0, 4)))
            console.print(Padding(Text(fix), (0, 0, 0, 4)))
    else:
        console.print("No findings.")

    kernels = _format.top_kernels(analysis)
    if kernels:
        table = Table(title="Top kernels", title_justify="left")
        for column in _format.KERNEL_COLUMNS:
            if column == "kernel":
                table.add_column(column, overflow="ellipsis", no_wrap=True, ratio=1)
            else:
                table.add_column(column, justify="right", no_wrap=True)
        for row in kernels:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)

    classes = _format.kernel_classes(analysis)
    if classes:
        table = Table(title="GPU time by kernel class", title_justify="left")
        for column in _format.CLASS_COLUMNS:
            table.add_column(column, justify="left" if column == "kernel class" else "right", no_wrap=True)
        for row in classes:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)

    modules = _format.module_costs(analysis)
    if modules:
        table = Table(title="GPU time by module (forward + backward)", title_justify="left")
        for column in _format.MODULE_COLUMNS:
            numeric = column not in ("module", "phases", "top tiny op")
            table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
        for row in modules:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def render_text(
    analysis: Analysis, limit: int = _format.CONSOLE_FINDINGS, width: int = _format.PLAIN_TEXT_WIDTH
) -> str:
    """Plain-text form of the same report (used when rich is not installed), wrapped at `width`."""
    lines = [f"trainprof: {_format.trace_name(analysis)}"]
    lines += [f"  {label:<15} {value}" for label, value in _format.headline(analysis)]
    findings = _format.top_findings(analysis, limit)
    lines.append("Top findings:" if findings else "No findings.")
    show_rank = _format.has_ranks(findings)
    for index, finding in enumerate(findings, 1):
        first, evidence, fix = _finding_lines(finding, index, show_rank)
        lines += textwrap.wrap(first, width, subsequent_indent="    ", break_long_words=False)
        for line in (evidence, fix):
            lines += textwrap.wrap(line, width, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False)
    kernels = _format.top_kernels(analysis)
    if kernels:
        lines.append("Top kernels:")
        lines += [f"  {name}  calls={calls}  total={ms} ms  mean={mean} us  {pct}%"
                  for name, calls, ms, mean, pct in kernels]
    classes = _format.kernel_classes(analysis)
    if classes:
        lines.append("GPU time by kernel class:")
        lines += [f"  {name}  {ms} ms/step  {pct}% of step  {achieved}  {peak}% of peak"
                  for name, ms, pct, achieved, peak in classes]
    modules = _format.module_costs(analysis)
    if modules:
        lines.append("GPU time by module (forward + backward):")
        lines += [f"  {name} ({phases})  x{instances}  kernels/step={count}  GPU={ms} ms/step  "
                  f"tiny={tiny}%  op={op}" for name, phases, instances, count, ms, tiny, op in modules]
    return "\n".join(lines) + "\n"


def print_written(run_dir: str | Path, names: list[str], windows: int, file: IO[str] | None = None) -> None:
    """Say where a session's files went: the run folder, what is in it, how to look at it again."""
    file = file or sys.stdout
    run_dir = Path(run_dir)
    message = (
        f"trainprof: wrote {run_dir}/ ({windows} trace window(s); {', '.join(names)})\n"
        f"  browse: tensorboard --logdir {run_dir.parent}   re-analyse: trainprof analyze {run_dir}\n"
    )
    file.write(message)
