"""Shared wording of the reports: turns values the analysis computed into display strings.

Nothing here computes a metric; it reads fields of the typed `Analysis` and formats them. Every
trace-derived string passes through `clean()`. How much of the analysis a report shows is set here,
in one place (`summary.json` holds all of it).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from trainprof.analysis.kernels import TopKernelsDetails
from trainprof.analysis.modules import ModuleCostsDetails

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis, Finding

# What the reports show, at most.
CONSOLE_FINDINGS = 10
"""Findings on the console: a screenful, most severe and costly first."""
MARKDOWN_FINDINGS = 20
"""Findings in report.md, which is read at leisure."""
KERNEL_ROWS = 5
"""Rows of the top-kernels table."""
MODULE_ROWS = 10
"""Rows of the GPU-time-by-module table."""
KERNEL_NAME_CHARS = 60
"""A kernel's name without its template and argument lists, cut to this."""
DIFF_ROWS = 20
"""Rows of each table of `trainprof diff` (changed ops, changed kernels)."""
AB_DIFF_ROWS = 12
"""Rows of each diff table inside a `trainprof ab` report (one diff per variant)."""
OP_NAME_CHARS = 70
"""An op's name in a diff table."""
FINDING_TITLE_CHARS = 90
"""A finding's title in a diff table (the title, not the finding's whole text)."""
PIPE_WIDTH = 160
"""Columns of console output that goes to a log or a pipe: paths and fixes are not folded."""
PLAIN_TEXT_WIDTH = 80
"""Columns of the plain-text report (rich not installed)."""

# Each headline row: (label, `Summary` field, unit suffix, decimals).
HEADLINE_ROWS: tuple[tuple[str, str, str, int], ...] = (
    ("verdict", "verdict", "", 0),
    ("step time", "mean_step_ms", " ms", 1),
    ("GPU busy", "gpu_busy_pct", " %", 1),
    ("syncs / step", "syncs_per_step", "", 1),
    ("kernels / step", "kernels_per_step", "", 0),
)

# C0 and C1 control characters (ESC starts terminal sequences, CR rewrites a line) and the Unicode
# bidirectional overrides that reorder what a reader sees. Tabs and newlines become spaces.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text: Any) -> str:
    """`text` as one display line: control characters removed, whitespace runs kept as spaces."""
    text = str(text)
    return _CONTROL.sub(lambda m: " " if m.group() in "\t\n\r\v\f" else "", text)


def number(value: Any, decimals: int = 1, unit: str = "") -> str:
    """A number for display; '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{clean(value)}{unit}"
    return f"{value:,.{decimals}f}{unit}"


def headline(analysis: Analysis) -> list[tuple[str, str]]:
    """(label, value) rows of the headline; rows whose value the analysis lacks are left out."""
    summary = analysis.summary
    rows = [
        (label, number(getattr(summary, name), decimals, unit))
        for label, name, unit, decimals in HEADLINE_ROWS
        if getattr(summary, name) is not None
    ]
    if summary.gpu_step_ms is not None:
        rows.insert(2, ("GPU step time", number(summary.gpu_step_ms, 1, " ms")))
    if summary.mfu_pct is not None:
        dtype = clean(summary.mfu_dtype or "?")
        rows.append(("MFU", f"{number(summary.mfu_pct, 1, ' %')} of the {dtype} peak"))
    if summary.peaks_source is not None:
        rows.append(("device peaks", clean(summary.peaks_source)))
    if summary.peak_memory_bytes is not None:
        rows.append(("peak memory", size(summary.peak_memory_bytes)))
    return rows


def size(num_bytes: float) -> str:
    """Bytes in binary units: `1.82 GiB`."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError  # the loop returns at GiB


def where(finding: Finding) -> str:
    """`file:line function` of a finding (file shown by its base name)."""
    file, line, function = finding.where.file, finding.where.line, finding.where.function
    if not file and not function:
        return "-"
    text = os.path.basename(str(file)) if file else "?"
    if line is not None:
        text += f":{line}"
    if function:
        text += f" {function}"
    return clean(text)


FINDING_COLUMNS = ("severity", "finding", "op", "where", "per step", "cost ms", "fix")
TOP_KERNELS_KIND = "top_kernels"  # rendered as its own table, not as a findings row
MODULE_COSTS_KIND = "module_costs"  # likewise
_TABLE_KINDS = (TOP_KERNELS_KIND, MODULE_COSTS_KIND)


def has_ranks(findings: list[Finding]) -> bool:
    """Whether the findings come from more than one rank: the reports then show each one's rank."""
    return len({f.rank for f in findings}) > 1


def rank_of(finding: Finding) -> str:
    """The finding's rank for display ('-' for findings over all ranks)."""
    return "-" if finding.rank is None else str(finding.rank)


def finding_row(finding: Finding) -> tuple[str, ...]:
    """The cells of one finding, in FINDING_COLUMNS order, whole (the console wraps, never cuts)."""
    return (
        clean(finding.severity or "-"),
        clean(finding.title or finding.kind or "-"),
        clean(finding.op or "-"),
        where(finding),
        number(finding.per_step, 1),
        number(finding.cost_ms, 2),
        clean(finding.fix or "-"),
    )


def top_findings(analysis: Analysis, limit: int) -> list[Finding]:
    """The findings in the analysis's order (it ranks them), at most `limit`."""
    return [f for f in analysis.findings if f.kind not in _TABLE_KINDS][:limit]


KERNEL_COLUMNS = ("kernel", "calls", "total ms", "mean us", "% GPU time")


def kernel_name(name: str, limit: int = KERNEL_NAME_CHARS) -> str:
    """A demangled kernel name without `void ` and its argument list, cut to `limit`."""
    name = clean(name).removeprefix("void ")
    for bracket in ("<", "("):
        if bracket in name and name.index(bracket) > 0:
            name = name[: name.index(bracket)]
            break
    return name if len(name) <= limit else name[: limit - 1] + "…"


def top_kernels(analysis: Analysis) -> list[tuple[str, ...]]:
    """Rows of the top-kernels table (over all profiled steps), from the first top-kernels finding."""
    details = next((f.details for f in analysis.findings if isinstance(f.details, TopKernelsDetails)), None)
    kernels = details.kernels if details is not None else []
    return [
        (
            kernel_name(kernel.name),
            number(kernel.count, 0),
            number(kernel.total_ms, 2),
            number(kernel.mean_us, 1),
            number(kernel.pct, 1),
        )
        for kernel in kernels[:KERNEL_ROWS]
    ]


MODULE_COLUMNS = ("module", "phases", "instances", "kernels / step", "GPU ms / step", "% tiny", "top tiny op")


def module_costs(analysis: Analysis) -> list[tuple[str, ...]]:
    """Rows of the per-module cost table (`nn.Module` class paths by GPU time, forward + backward),
    from the first module-costs finding; `% tiny`: kernels shorter than their launch."""
    details = next((f.details for f in analysis.findings if isinstance(f.details, ModuleCostsDetails)), None)
    modules = details.modules if details is not None else []
    return [
        (
            clean(row.module or "-"),
            clean(row.phases or "-"),
            number(row.instances, 0),
            number(row.kernels_per_step, 0),
            number(row.gpu_ms_per_step, 2),
            number(row.tiny_kernel_pct, 0),
            clean((row.top_ops[0].op if row.top_ops else None) or "-"),
        )
        for row in modules[:MODULE_ROWS]
    ]


CLASS_COLUMNS = ("kernel class", "GPU ms / step", "% of step", "achieved", "% of peak")
CLASS_ROWS = 12
"""Rows of the GPU-time-by-kernel-class table (there are 18 classes)."""


def kernel_classes(analysis: Analysis) -> list[tuple[str, ...]]:
    """Rows of the GPU-time-by-kernel-class table, from the first trace with GPU work: time per step,
    share of the GPU step, throughput (TFLOP/s for GEMMs and attention, TB/s for memory-bound classes)
    and its share of the device's peak."""
    busy = next((trace.busy for trace in analysis.traces if trace.busy is not None), None)
    rows = []
    for row in busy.classes[:CLASS_ROWS] if busy is not None else []:
        if row.achieved_tflops is not None:
            achieved = number(row.achieved_tflops, 1, " TFLOP/s")
        elif row.achieved_tb_s is not None:
            achieved = number(row.achieved_tb_s, 2, " TB/s")
        else:
            achieved = "-"
        rows.append(
            (
                clean(row.label),
                number(row.gpu_ms_per_step, 2),
                number(row.step_pct, 1),
                achieved,
                number(row.peak_pct, 0),
            )
        )
    return rows


def trace_name(analysis: Analysis) -> str:
    """What was analysed, for the report's title: the trace file(s) by base name."""
    files = analysis.files
    if not files:
        return "trace"
    names = [os.path.basename(str(f)) for f in files]
    text = names[0] if len(names) == 1 else f"{len(names)} traces in {os.path.dirname(str(files[0]))}"
    return clean(text)
