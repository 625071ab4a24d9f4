"""Shared wording of the reports: turns values the analysis computed into display strings.

Nothing here computes a metric; it only picks fields out of `Analysis.to_dict()` and formats them.
"""

from __future__ import annotations

import os
from typing import Any

# Each headline row: (label, candidate keys in the summary, unit suffix, decimals).
HEADLINE_ROWS: tuple[tuple[str, tuple[str, ...], str, int], ...] = (
    ("verdict", ("verdict",), "", 0),
    ("step time", ("mean_step_ms", "step_ms_mean", "step_time_ms", "mean_step_time_ms"), " ms", 1),
    ("GPU busy", ("gpu_busy_pct", "mean_gpu_busy_pct"), " %", 1),
    ("syncs / step", ("syncs_per_step", "sync_per_step", "sync_points_per_step"), "", 1),
    ("kernels / step", ("kernels_per_step", "kernel_launches_per_step"), "", 0),
)


def summary_of(analysis: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of an `Analysis.to_dict()`."""
    summary = analysis.get("summary")
    if summary is None:
        summary = analysis.get("trace", {}).get("summary", {})
    return summary or {}


def number(value: Any, decimals: int = 1, unit: str = "") -> str:
    """A number for display; '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value}{unit}"
    return f"{value:,.{decimals}f}{unit}"


def headline(analysis: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the headline; rows whose value the analysis lacks are left out."""
    summary = summary_of(analysis)
    rows = []
    for label, keys, unit, decimals in HEADLINE_ROWS:
        key = next((k for k in keys if summary.get(k) is not None), None)
        if key is None:
            continue
        rows.append((label, number(summary[key], decimals, unit)))
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


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def where(finding: dict[str, Any]) -> str:
    """`file:line function` of a finding (file shown by its base name)."""
    place = finding.get("where") or {}
    file, line, function = place.get("file"), place.get("line"), place.get("function")
    if not file and not function:
        return "-"
    text = os.path.basename(file) if file else "?"
    if line is not None:
        text += f":{line}"
    if function:
        text += f" {function}"
    return text


FINDING_COLUMNS = ("severity", "finding", "op", "where", "per step", "cost ms", "fix")
TOP_KERNELS_KIND = "top_kernels"  # rendered as its own table, not as a findings row


def finding_row(finding: dict[str, Any], text_limit: int | None = None) -> tuple[str, ...]:
    """The cells of one finding, in FINDING_COLUMNS order; long texts cut to `text_limit`."""
    cut = (lambda text: shorten(text, text_limit)) if text_limit else (lambda text: text)
    return (
        str(finding.get("severity") or "-"),
        cut(str(finding.get("title") or finding.get("kind") or "-")),
        cut(str(finding.get("op") or "-")),
        where(finding),
        number(finding.get("per_step"), 1),
        number(finding.get("cost_ms"), 2),
        cut(str(finding.get("fix") or "-")),
    )


def top_findings(analysis: dict[str, Any], limit: int = 10) -> list[dict[str, Any]]:
    """The findings in the analysis's order (it ranks them), at most `limit`."""
    findings = [f for f in analysis.get("findings") or [] if f.get("kind") != TOP_KERNELS_KIND]
    return findings[:limit]


KERNEL_COLUMNS = ("kernel", "calls", "total ms", "mean us", "% GPU time")


def kernel_name(name: str, limit: int = 60) -> str:
    """A demangled kernel name without `void ` and its argument list, cut to `limit`."""
    name = name.removeprefix("void ")
    for bracket in ("<", "("):
        if bracket in name and name.index(bracket) > 0:
            name = name[: name.index(bracket)]
            break
    return shorten(name, limit)


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


def trace_name(analysis: dict[str, Any]) -> str:
    """What was analysed, for the report's title: the trace file(s) by base name."""
    trace = analysis.get("trace") or {}
    files = trace.get("files") or ([trace["path"]] if trace.get("path") else [])
    if not files:
        return "trace"
    names = [os.path.basename(str(f)) for f in files]
    return names[0] if len(names) == 1 else f"{len(names)} traces in {os.path.dirname(str(files[0]))}"
