"""Render an analysis as report.md: the same headline, findings and tables as the console.

Trace-derived text is escaped: HTML (`<script>`, `<img onerror=...>`) shows as text, and Markdown
syntax (links, emphasis, table pipes) is backslash-escaped, so a name cannot inject a link, a
`javascript:` URL or markup into a viewer that renders the report. `table()` is the one table writer
of every Markdown output (report.md, `trainprof diff --markdown`, `trainprof ab --markdown`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis

# Characters that start inline syntax (code, emphasis, links and images, strikethrough) or end a
# table cell, wherever they stand. Text never starts a line here (cells and bullets do), so the
# line-start syntax (`#`, `-`, `1.`) needs no escape; `<` and `>` are already HTML entities.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def escape(text: Any, max_chars: int = _format.TEXT_CHARS) -> str:
    """`text` as literal Markdown: unsafe characters dropped and cut to `max_chars`
    (`text.safe_text`), HTML and Markdown syntax escaped."""
    text = html.escape(_format.clean(text, max_chars), quote=False)  # & < > first: escapes below add none
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def table(columns: tuple[str | _format.Column, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A Markdown table; every header and cell escaped."""
    names = [column.name if isinstance(column, _format.Column) else column for column in columns]
    lines = ["| " + " | ".join(escape(name) for name in names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(escape(cell) for cell in row) + " |" for row in rows]
    return lines


def render_markdown(analysis: Analysis, limit: int = _format.MARKDOWN_FINDINGS) -> str:
    """An analysis as a Markdown document."""
    lines = [f"# trainprof report: {escape(_format.trace_name(analysis))}", ""]
    split = _format.step_split(analysis)
    if split is not None:
        lines += [escape(split), ""]
    lines += [f"- **{label}**: {escape(value)}" for label, value in _format.headline(analysis)]
    lines += ["", "## Top findings", ""]
    findings = _format.top_findings(analysis, limit)
    if findings:
        if _format.source_labels(findings):
            rows = [(_format.source_of(f, findings), *_format.finding_row(f, analysis)) for f in findings]
            lines += table((_format.source_column(findings), *_format.FINDING_COLUMNS), rows)
        else:
            lines += table(_format.FINDING_COLUMNS, [_format.finding_row(f, analysis) for f in findings])

    else:
        lines.append("No findings.")
    for report_table in _format.tables(analysis):
        lines += ["", f"## {escape(report_table.title)}", ""]
        lines += table(report_table.columns, report_table.rows)
    if analysis.steps:
        lines += ["", "## Steps", ""]
        rows = [
            (
                str(step.times.number),
                _format.number(step.times.duration_ms, 1),
                _format.number(step.times.gpu_busy_pct, 1),
                _format.number(step.times.kernel_count, 0),
                _format.number(step.syncs.count, 0),
            )
            for step in analysis.steps
        ]
        lines += table(("step", "duration ms", "GPU busy %", "kernels", "syncs"), rows)
    return "\n".join(lines) + "\n"


def write_markdown(analysis: Analysis, path: str | Path) -> Path:
    """Write report.md; returns its path."""
    from trainprof.files import write_text_atomically

    return write_text_atomically(path, render_markdown(analysis))
