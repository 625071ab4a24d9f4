"""`trainprof ncu`'s table: the run's top kernels with Nsight Compute's figures and rule hints
beside them (``trainprof.ncu`` computes; this only formats)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.ncu import NcuRow  # only its type: trainprof.ncu renders with this module

HINT_CHARS = 160
"""A rule's description in the hints under the table."""
HINTS_PER_KERNEL = 3
"""Rules listed per kernel, largest estimated speedup first."""


def render(rows: Sequence[NcuRow]) -> str:
    """A Markdown table (also read on a console), then each profiled kernel's hints."""
    lines = [
        "| kernel | % GPU time | calls | launches profiled | duration µs | memory % | compute % "
        "| achieved occupancy % | top rule (est. speedup %) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ncu = row.ncu
        top = ncu.hints[0] if ncu is not None and ncu.hints else None
        rule = f"{top.rule} ({_format.number(top.estimated_speedup_pct)})" if top is not None else "-"
        figures = (
            [ncu.launches, ncu.duration_us, ncu.memory_pct, ncu.compute_pct, ncu.achieved_occupancy_pct]
            if ncu is not None
            else ["not profiled", None, None, None, None]
        )
        cells = [_format.kernel_name(row.kernel), _format.number(row.pct), str(row.count)]
        cells += [str(figures[0])] + [_format.number(value) for value in figures[1:]] + [rule]
        lines.append("| " + " | ".join(_format.clean(cell) for cell in cells) + " |")
    for row in rows:
        if row.ncu is None or not row.ncu.hints:
            continue
        lines += ["", f"{_format.kernel_name(row.kernel)} ({row.ncu.name}):"]
        for hint in row.ncu.hints[:HINTS_PER_KERNEL]:
            speedup = f" [est. {hint.estimated_speedup_pct:.1f}%]" if hint.estimated_speedup_pct else ""
            text = _format.clean(hint.description)[:HINT_CHARS]
            lines.append(f"- {hint.type} {hint.rule}{speedup}: {text}")
    return "\n".join(lines) + "\n"
