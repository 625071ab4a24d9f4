"""Shared wording of the reports: turns values the analysis computed into display strings.

Nothing here computes a metric; it only picks fields out of `Analysis.to_dict()` (the summary lives
in `trace["summary"]`) and formats them. Every trace-derived string passes through `clean()`.
"""

from __future__ import annotations

import os
import re
from typing import Any

# Each headline row: (label, summary key, unit suffix, decimals): the keys analysis/core.py writes.
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


def summary_of(analysis: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of an `Analysis.to_dict()` (its `trace["summary"]`)."""
    return (analysis.get("trace") or {}).get("summary") or {}


def number(value: Any, decimals: int = 1, unit: str = "") -> str:
    """A number for display; '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{clean(value)}{unit}"
    return f"{value:,.{decimals}f}{unit}"


def headline(analysis: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the headline; rows whose value the analysis lacks are left out."""
    summary = summary_of(analysis)
    rows = [
        (label, number(summary[key], decimals, unit))
        for label, key, unit, decimals in HEADLINE_ROWS
        if summary.get(key) is not None
    ]
    if summary.get("peak_memory_bytes") is not None:
        rows.append(("peak memory", size(summary["peak_memory_bytes"])))
    return rows


def size(num_bytes: float) -> str:
    """Bytes in binary units: `1.82 GiB`."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError  # the loop returns at GiB


def where(finding: dict[str, Any]) -> str:
    """`file:line function` of a finding (file shown by its base name)."""
    place = finding.get("where") or {}
    file, line, function = place.get("file"), place.get("line"), place.get("function")
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


def has_ranks(findings: list[dict[str, Any]]) -> bool:
    """Whether the findings come from more than one rank: the reports then show each one's rank."""
    return len({f.get("rank") for f in findings}) > 1


def rank_of(finding: dict[str, Any]) -> str:
    """The finding's rank for display ('-' for findings over all ranks)."""
    rank = finding.get("rank")
    return "-" if rank is None else str(rank)


def finding_row(finding: dict[str, Any]) -> tuple[str, ...]:
    """The cells of one finding, in FINDING_COLUMNS order, whole (the console wraps, never cuts)."""
    return (
        clean(finding.get("severity") or "-"),
        clean(finding.get("title") or finding.get("kind") or "-"),
        clean(finding.get("op") or "-"),
        where(finding),
        number(finding.get("per_step"), 1),
        number(finding.get("cost_ms"), 2),
        clean(finding.get("fix") or "-"),
    )


def top_findings(analysis: dict[str, Any], limit: int = 10) -> list[dict[str, Any]]:
    """The findings in the analysis's order (it ranks them), at most `limit`."""
    findings = [f for f in analysis.get("findings") or [] if f.get("kind") not in _TABLE_KINDS]
    return findings[:limit]


KERNEL_COLUMNS = ("kernel", "calls", "total ms", "mean us", "% GPU time")


def kernel_name(name: str, limit: int = 60) -> str:
    """A demangled kernel name without `void ` and its argument list, cut to `limit`."""
    name = clean(name).removeprefix("void ")
    for bracket in ("<", "("):
        if bracket in name and name.index(bracket) > 0:
            name = name[: name.index(bracket)]
            break
    return name if len(name) <= limit else name[: limit - 1] + "…"


def top_kernels(analysis: dict[str, Any], limit: int = 5) -> list[tuple[str, ...]]:
    """Rows of the top-kernels table (over all profiled steps), from the top-kernels finding."""
    finding = next((f for f in analysis.get("findings") or [] if f.get("kind") == TOP_KERNELS_KIND), None)
    kernels = ((finding or {}).get("details") or {}).get("kernels") or []
    return [
        (
            kernel_name(str(kernel.get("name", "-"))),
            number(kernel.get("count"), 0),
            number(kernel.get("total_ms"), 2),
            number(kernel.get("mean_us"), 1),
            number(kernel.get("pct"), 1),
        )
        for kernel in kernels[:limit]
    ]


MODULE_COLUMNS = ("module", "phases", "instances", "kernels / step", "GPU ms / step", "% tiny", "top tiny op")


def module_costs(analysis: dict[str, Any], limit: int = 10) -> list[tuple[str, ...]]:
    """Rows of the per-module cost table (`nn.Module` class paths by GPU time, forward + backward),
    from the first module-costs finding; `% tiny`: kernels shorter than their launch."""
    finding = next((f for f in analysis.get("findings") or [] if f.get("kind") == MODULE_COSTS_KIND), None)
    modules = ((finding or {}).get("details") or {}).get("modules") or []
    return [
        (
            clean(row.get("module") or "-"),
            clean(row.get("phases") or "-"),
            number(row.get("instances"), 0),
            number(row.get("kernels_per_step"), 0),
            number(row.get("gpu_ms_per_step"), 2),
            number(row.get("tiny_kernel_pct"), 0),
            clean((row.get("top_ops") or [{}])[0].get("op") or "-"),
        )
        for row in modules[:limit]
    ]


def trace_name(analysis: dict[str, Any]) -> str:
    """What was analysed, for the report's title: the trace file(s) by base name."""
    files = (analysis.get("trace") or {}).get("files") or []
    if not files:
        return "trace"
    names = [os.path.basename(str(f)) for f in files]
    text = names[0] if len(names) == 1 else f"{len(names)} traces in {os.path.dirname(str(files[0]))}"
    return clean(text)
