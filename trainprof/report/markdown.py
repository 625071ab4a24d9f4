"""Render an analysis as report.md: the same headline, findings and kernels as the console.

Trace-derived text is escaped: HTML (`<script>`, `<img onerror=...>`) shows as text, and Markdown
syntax (links, emphasis, table pipes) is backslash-escaped, so a name cannot inject a link, a
`javascript:` URL or markup into a viewer that renders the report.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis

# Characters that start inline syntax (code, emphasis, links and images, strikethrough) or end a
# table cell, wherever they stand. Text never starts a line here (cells and bullets do), so the
# line-start syntax (`#`, `-`, `1.`) needs no escape; `<` and `>` are already HTML entities.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def escape(text: Any) -> str:
    """`text` as literal Markdown: control characters dropped, HTML and Markdown syntax escaped."""
    text = html.escape(_format.clean(text), quote=False)  # & < > first: escapes below add none
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _cell(text: str) -> str:
    return escape(text)


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def render_markdown(analysis: Analysis, limit: int = _format.MARKDOWN_FINDINGS) -> str:
    """An analysis as a Markdown document."""
    lines = [f"# trainprof report: {escape(_format.trace_name(analysis))}", ""]
    lines += [f"- **{label}**: {escape(value)}" for label, value in _format.headline(analysis)]
    lines += ["", "## Top findings", ""]
    findings = _format.top_findings(analysis, limit)
    if findings:
        if _format.has_ranks(findings):
            rows = [(_format.rank_of(f), *_format.finding_row(f)) for f in findings]
            lines += _table(("rank", *_format.FINDING_COLUMNS), rows)
        else:
            lines += _table(_format.FINDING_COLUMNS, [_format.finding_row(f) for f in findings])
    else:
        lines.append("No findings.")
    kernels = _format.top_kernels(analysis)
    if kernels:
        lines += ["", "## Top kernels", ""]
        lines += _table(_format.KERNEL_COLUMNS, kernels)
    classes = _format.kernel_classes(analysis)
    if classes:
        lines += ["", "## GPU time by kernel class", ""]
        lines += _table(_format.CLASS_COLUMNS, classes)
    modules = _format.module_costs(analysis)
    if modules:
        lines += ["", "## GPU time by module (forward + backward)", ""]
        lines += _table(_format.MODULE_COLUMNS, modules)
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
        lines += _table(("step", "duration ms", "GPU busy %", "kernels", "syncs"), rows)
    return "\n".join(lines) + "\n"


def write_markdown(analysis: Analysis, path: str | Path) -> Path:
    """Write report.md; returns its path."""
    from trainprof.report import write_text_atomically

    return write_text_atomically(path, render_markdown(analysis))
