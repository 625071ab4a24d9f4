"""Render an analysis as report.html: one self-contained file that works offline.

What it shows, in order: the headline; per step, one bar of where the step went (GPU busy, then GPU
idle by cause); the findings with their fixes; the GPU timeline (canvas: streams as lanes, idle
runs by cause, sync points; hover, wheel to zoom, drag to pan); the op, kernel and module tables;
memory over time by category with the largest allocations alive at the peak (the memory analysis'
`TraceInfo.memory`); a flame graph of the host stacks; across ranks, the cross-rank report as the
console shows it (`report.ranks`). The drawn views come from `analyze(..., views=True)`
(`trainprof.analysis.views`); without them (an analysis made without views) the page shows the rest.

Nothing is fetched: the style and the script (`assets/report.css`, `assets/report.js`, written for
this report, no library) are inlined, and so is the data the script draws, as one JSON block. Every
trace-derived string is cleaned of control characters and HTML-escaped where it lands in markup;
in the JSON block `<`, `>` and `&` are written as `\\u` escapes, so no name can close the block,
and the script puts names on the page as text only (`textContent`, canvas text).
"""

from __future__ import annotations

import html
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainprof.analysis.attribution import PHASES
from trainprof.analysis.causes import CAUSES, Cause
from trainprof.analysis.host_ops import CpuOnlyDetails
from trainprof.analysis.memory import CATEGORIES as MEMORY_CATEGORIES
from trainprof.analysis.modules import ModuleCostsDetails
from trainprof.analysis.timeline_view import CATEGORIES, CATEGORY_LABELS
from trainprof.report import _format, ranks
from trainprof.report.json import _ENCODER

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.memory import HistoryView
    from trainprof.analysis.result import Analysis, Finding, Step, TraceInfo
    from trainprof.analysis.stacks import FlameGraph
    from trainprof.analysis.timeline_view import TimelineView

HTML_FINDINGS = 30
"""Findings on the page, most severe and costly first (summary.json holds them all)."""
TIME_DECIMALS = 2
"""Timeline times in the JSON block: µs to 10 ns, below what a pixel shows at any useful zoom."""
TABLE_NAME_CHARS = 90
"""Characters of a name shown in a table cell, at most (the whole name on hover)."""
MEMORY_TICKS = 4
"""Gridlines of the memory chart's y-axis, about (at round sizes)."""
DATA_ELEMENT = "trainprof-data"
"""The id of the JSON block the script reads."""
# JSON inside <script>: these characters as escapes, so the text cannot end the element or open a
# comment; U+2028/9 are line ends to older JavaScript parsers.
_SCRIPT_SAFE = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"),
                ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


def esc(text: Any) -> str:
    """Trace-derived text as HTML: one line, control characters dropped, markup escaped."""
    return html.escape(_format.clean(text), quote=True)


_CODE_SPAN = re.compile(r"`([^`]+)`")


def prose(text: Any) -> str:
    """A finding's or verdict's words (title, why, fix) as HTML: `esc`, with each Markdown code span
    (`` `profile_memory=True` ``) as <code> (the console and report.md keep the backticks)."""
    return _CODE_SPAN.sub(r"<code>\1</code>", esc(text))


def _name_cell(text: Any) -> str:
    """A name in a table cell, cut at `TABLE_NAME_CHARS` with the whole name on hover (a templated
    kernel's name runs to a thousand characters and wrapped over 15 lines)."""
    whole = _format.clean(text)
    if len(whole) <= TABLE_NAME_CHARS:
        return f'<td class="name">{esc(whole)}</td>'
    return f'<td class="name" title="{esc(whole)}">{esc(whole[:TABLE_NAME_CHARS - 1])}…</td>'


@cache
def asset(name: str) -> str:
    """The text of one of the report's own files (`trainprof/report/assets/`)."""
    return resources.files("trainprof.report").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(analysis: Analysis) -> str:
    """An analysis as one HTML document (module docstring)."""
    drawn = [trace for trace in analysis.traces if trace.views is not None]
    has_gpu = any(trace.views.timeline.lanes for trace in drawn)
    on_host = [trace for trace in drawn if trace.views.host is not None]
    if drawn and not has_gpu and on_host:  # a CPU run: the loop's own structure, step by step
        steps = ("steps", "Where each step went (host)", _per_trace(on_host, _host_loop))
    else:
        steps = ("steps", "Where each step went", _step_bars(analysis))
    sections = [
        ("summary", "Summary", _summary(analysis)),
        steps,
        ("findings", "Findings", _findings(analysis)),
    ]
    out_of_memory = _format.out_of_memory_tables(analysis)
    if out_of_memory:
        sections.append(("oom", "Out of memory", "".join(
            f"<h3>{esc(table.title)}</h3>{_shared_table(table)}" for table in out_of_memory)))
    if drawn and not has_gpu:  # a CPU run: what the host did, by op and by module
        sections.append(("host-ops", "Host time by op", _host_op_table(analysis)))
        sections.append(("host-modules", "Host time by module (forward + backward)",
                         _per_trace(on_host, _host_module_table) if on_host else ""))
        sections.append(("ops", "Ops", _per_trace(drawn, _op_table)))
    elif drawn:
        sections.append(("timeline", "GPU timeline", _timeline_section(drawn)))
        sections.append(("ops", "Ops", _per_trace(drawn, _op_table)))
        sections.append(("kernels", "Kernels", _per_trace(drawn, _kernel_table)))
    classes = _format.kernel_class_tables(analysis)
    if classes:
        sections.append(("classes", "GPU time by kernel class", "".join(
            (f"<h3>{esc(table.title)}</h3>" if len(classes) > 1 else "") + _shared_table(table)
            for table in classes)))
    if not drawn or has_gpu:
        sections.append(("modules", "GPU time by module (forward + backward)", _module_table(analysis)))
    if drawn:
        sections.append(("memory", "Memory", _per_trace(drawn, _memory)))
        sections.append(("flame", "Host stacks", _flame_section(drawn)))
    if analysis.cross_rank is not None:
        sections.append(("ranks", "Ranks", _cross_rank(analysis.cross_rank)))
    title = f"trainprof report: {esc(_format.trace_name(analysis))}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{title}</title>",
        f"<style>{asset('report.css')}</style>",
        "</head><body><main>",
        f"<h1>{title}</h1>",
        f'<p class="sub">{_subtitle(analysis)}</p>',
        "<nav>" + "".join(f'<a href="#{key}">{label}</a>' for key, label, _ in sections) + "</nav>",
    ]
    for key, label, body in sections:
        parts.append(f'<section id="{key}"><h2>{label}</h2>{body}</section>')
    parts.append("</main>")
    if drawn:
        parts.append(f'<script type="application/json" id="{DATA_ELEMENT}">{_data(drawn)}</script>')
        parts.append(f"<script>{asset('report.js')}</script>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(analysis: Analysis, path: str | Path, *, named_by_user: bool = False) -> Path:
    """Write report.html (`trainprof.files.write_atomically`; `named_by_user`: a path the user typed,
    written through when it is a device or a link); returns its path."""
    from trainprof.files import write_text_atomically

    return write_text_atomically(path, render_html(analysis), named_by_user=named_by_user)


def _subtitle(analysis: Analysis) -> str:
    devices = sorted({trace.device for trace in analysis.traces if trace.device})
    steps = analysis.step_count
    text = f"{steps} profiled step{'s' if steps != 1 else ''}"
    if len(analysis.traces) > 1:
        text += f" in {len(analysis.traces)} traces"
    if devices:
        text += " on " + ", ".join(devices)
    return esc(text)


def _summary(analysis: Analysis) -> str:
    details = _format.headline_notes(analysis)
    cards = "".join(
        f'<div class="card{" verdict" if label == "verdict" else ""}"'
        + (f' title="{esc(details[label])}"' if label in details else "")
        + f'><div class="label">{esc(label)}</div><div class="value">{esc(value)}</div></div>'
        for label, value in _format.headline(analysis)
    )
    verdicts = {trace.verdict.why: trace.verdict for trace in analysis.traces}
    notes = "".join(
        f'<p class="why">{prose(v.why)}</p>'
        + (f'<p class="why"><b>Fix:</b> {prose(v.fix)}</p>' if v.fix else "")
        for v in list(verdicts.values())[:1]
    )
    return f'<div class="cards">{cards}</div>{notes}'


def _legend() -> str:
    items = ['<span><i class="busy"></i>GPU busy</span>']
    items += [
        f'<span title="{esc(CAUSES[cause].meaning)}"><i class="cause-{cause.key}"></i>'
        f"idle: {cause.key}</span>"
        for cause in Cause
    ]
    items.append('<span title="warm-up and context creation seen in one step only"><i class="one-off"></i>'
                 "idle: one-off</span>")
    return f'<div class="legend">{"".join(items)}</div>'


def _step_bars(analysis: Analysis) -> str:
    if not analysis.steps:
        return '<p class="empty">No profiled steps.</p>'
    rows = []
    show_rank = len(analysis.traces) > 1
    for step in analysis.steps:
        label = f"step {step.times.number}"
        if show_rank and step.times.rank is not None:
            label = f"rank {step.times.rank} · " + label
        rows.append(f"<span>{esc(label)}</span>{_bar(step)}"
                    f'<span class="num">{_format.number(step.times.duration_ms, 1)} ms</span>')
    return _legend() + f'<div class="bars">{"".join(rows)}</div>'


def _bar(step: Step) -> str:
    """One step as a bar: busy, then idle by cause, then one-off, each as its share of the step."""
    duration = step.times.duration_ms or 0.0
    parts: list[tuple[str, str, float]] = [("busy", "GPU busy", step.times.gpu_busy_ms or 0.0)]
    if step.idle is not None:
        parts += [(f"cause-{cause.key}", f"idle: {cause.key}", ms) for cause, ms in step.idle.costs.items()]
        parts.append(("one-off", "idle: one-off", step.idle.one_off_ms))
    if step.idle is None and not step.times.gpu_busy_ms:
        return '<div class="bar"><span class="none">no GPU work</span></div>'
    spans = "".join(
        f'<span class="{css}" style="width:{100 * ms / duration:.3f}%" '
        f'title="{esc(label)}: {ms:,.2f} ms ({100 * ms / duration:.1f}%)"></span>'
        for css, label, ms in parts
        if ms > 0 and duration > 0
    )
    return f'<div class="bar">{spans}</div>'


def _findings(analysis: Analysis) -> str:
    findings = _format.top_findings(analysis, HTML_FINDINGS)
    if not findings:
        return '<p class="empty">No findings.</p>'
    labelled = _format.source_labels(findings)
    return "".join(_finding(f, findings if labelled else None, analysis) for f in findings)


def _finding(finding: Finding, among: list[Finding] | None, analysis: Analysis) -> str:
    """One finding's block; `among`, when given, are the findings it must be told apart from (its
    rank or window is shown). Its figures in the console's and Markdown's words (`_format.finding_row`)."""
    severity = finding.severity if finding.severity in ("high", "medium", "low", "info") else "info"
    facts: list[tuple[str, str]] = []
    if among is not None:
        facts.append(("from", _format.source_of(finding, among)))
    _, _, _, _, per_step, at_stake, spent, _ = _format.finding_row(finding, analysis)
    if at_stake != "-":
        facts.append(("GPU time at stake", at_stake))
    if finding.cause:
        facts.append(("cause", finding.cause))
    if finding.op:
        facts.append(("op", finding.op))
    where = _format.where(finding)
    if where != "-":
        facts.append(("where", where))
    if finding.via is not None and (finding.via.file or finding.via.function):
        via = " ".join(str(x) for x in (finding.via.library, finding.via.file, finding.via.line,
                                         finding.via.function) if x is not None)
        facts.append(("via", via))
    if per_step != "-":
        facts.append(("per step", per_step))
    if spent != "-":
        facts.append(("cost", spent))

    if finding.fix:
        facts.append(("fix", finding.fix))
    rows = "".join(f"<dt>{esc(label)}</dt><dd>{prose(value) if label in _PROSE_FACTS else esc(value)}</dd>"
                   for label, value in facts)
    return (
        f'<div class="finding {severity}"><div class="title">'
        f'<span class="sev {severity}">{esc(severity)}</span>{prose(finding.title)}</div>'
        f"<dl>{rows}</dl></div>"
    )


_PROSE_FACTS = frozenset({"fix", "cause"})
"""A finding's facts written in words (code spans as <code>); the others are names from the trace."""


NUM, NAME, TEXT = "num", "name", "text"
"""Kinds of table column: a number (right-aligned, sorted by value), a trace-derived name (monospace,
wrapped anywhere: kernel names run to a thousand characters), a short text."""


def _table(columns: tuple[tuple[str, str], ...], rows: list[tuple[Any, ...]], scroll: bool = True) -> str:
    """A sortable table; `columns`: (title, kind); a `NUM` cell is (text, value)."""
    head = "".join(f'<th class="{kind}">{esc(title)}</th>' for title, kind in columns)
    body = []
    for row in rows:
        cells = []
        for (_, kind), cell in zip(columns, row, strict=True):
            if kind == NUM:  # text from `_format.number` (digits, separators, units): no markup
                text, value = cell
                cells.append(f'<td class="num" data-v="{value}">{text}</td>')
            elif kind == NAME:
                cells.append(_name_cell(cell))
            else:
                cells.append(f'<td class="{kind}">{esc(cell)}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    table = f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return f'<div class="scroll">{table}</div>' if scroll else table


def _num(value: float | int | None, decimals: int) -> tuple[str, float]:
    return _format.number(value, decimals), (value if value is not None else 0)


def _per_trace(traces: list[TraceInfo], render) -> str:
    if len(traces) == 1:
        return render(traces[0])
    return "".join(
        f"<details{' open' if i == 0 else ''}><summary>{esc(_trace_label(trace))}</summary>"
        f"{render(trace)}</details>"
        for i, trace in enumerate(traces)
    )


def _trace_label(trace: TraceInfo) -> str:
    return f"rank {trace.rank}" if trace.rank is not None else trace.worker


_OP_COLUMNS = (("op", NAME), ("calls", NUM), ("CPU total ms", NUM), ("CPU self ms", NUM),
               ("GPU total ms", NUM), ("GPU self ms", NUM))


def _op_table(trace: TraceInfo) -> str:
    views = trace.views
    if not views.ops:
        return '<p class="empty">No ops in the profiled steps.</p>'
    rows = [
        (row.op, _num(row.calls, 0), _num(row.cpu_total_ms, 3), _num(row.cpu_self_ms, 3),
         _num(row.gpu_total_ms, 3), _num(row.gpu_self_ms, 3))
        for row in views.ops
    ]
    if not views.timeline.lanes:  # no GPU work: its columns would be zeros that were never measured
        return ('<p class="hint">Over all profiled steps, as <code>key_averages()</code>: self excludes '
                "the ops an op called.</p>"
                + _table(_OP_COLUMNS[:4], [row[:4] for row in rows]))
    return ('<p class="hint">Over all profiled steps, as <code>key_averages()</code>: self excludes the ops '
            "an op called; GPU time is that of the kernels and copies launched inside the op.</p>"
            + _table(_OP_COLUMNS, rows))


_PHASE_PARTS = (("forward", "forward_ms"), ("backward", "backward_ms"), ("optimizer", "optimizer_ms"),
                ("other", "other_ms"))
"""A host step's parts (`host_ops.HostStepPhases`), in the loop's order: their bar's colours and words."""


def _host_loop(trace: TraceInfo) -> str:
    """A CPU run's steps as the loop ran them: host ms in forward, backward, the optimizer, and the
    rest (Python between ops, ops of no phase), each as its share of the step."""
    host = trace.views.host
    if not host.steps:
        return '<p class="empty">No profiled steps.</p>'
    legend = "".join(f'<span><i class="phase-{key}"></i>{key}</span>' for key, _ in _PHASE_PARTS)
    rows = []
    for step in host.steps:
        spans = "".join(
            f'<span class="phase-{key}" style="width:{100 * ms / step.duration_ms:.3f}%" '
            f'title="{key}: {ms:,.2f} ms ({100 * ms / step.duration_ms:.1f}%)"></span>'
            for key, ms in ((key, getattr(step, field)) for key, field in _PHASE_PARTS)
            if ms > 0 and step.duration_ms > 0
        )
        rows.append(f'<span>step {esc(step.number)}</span><div class="bar">{spans}</div>'
                    f'<span class="num">{_format.number(step.duration_ms, 1)} ms</span>')
    return (f'<div class="legend">{legend}</div><div class="bars">{"".join(rows)}</div>'
            '<p class="hint">No GPU work was recorded: each step is host time, split by what the loop was '
            "doing (the top-level ops of its forward, backward and optimizer step; other: ops of no phase "
            "and Python between ops). Hover a part for its time.</p>")


def _host_op_table(analysis: Analysis) -> str:
    """The cpu-only finding's evidence: the top-level host ops by time (`host_ops.top_host_ops`)."""
    found = [f for f in analysis.findings if isinstance(f.details, CpuOnlyDetails)]
    if not found:
        return '<p class="empty">No ops in the profiled steps.</p>'
    parts = []
    for finding in found:
        detail = finding.details
        assert isinstance(detail, CpuOnlyDetails)  # narrowed above
        rows = [(row.op, _num(row.count, 0), _num(row.total_ms, 2), _num(row.pct_of_step, 1))
                for row in detail.top_host_ops]
        heading = f"<h3>rank {esc(finding.rank)}</h3>" if len(found) > 1 and finding.rank is not None else ""
        parts.append(heading + _table((("op", NAME), ("calls", NUM), ("total ms", NUM), ("% of step", NUM)),
                                      rows))
    return ('<p class="hint">Top-level ops (none encloses them) over all profiled steps; a backward op is '
            "the autograd node that ran.</p>" + "".join(parts))


def _host_module_table(trace: TraceInfo) -> str:
    """Host time by `nn.Module` (`host_ops.HostModuleTime`): the top-level ops it ran or whose
    backward it owns."""
    modules = trace.views.host.modules
    if not modules:
        if trace.views.recorded_with.get("with_stack") is False:
            return ('<p class="empty">No <code>nn.Module</code> in the trace (run with '
                    "<code>with_stack=True</code>).</p>")
        return '<p class="empty">No top-level op ran inside an <code>nn.Module</code>.</p>'
    rows = [(row.module, _num(row.instances, 0), _num(row.ms_per_step, 2), _num(row.pct_of_step, 1))
            for row in modules]
    return _table((("module", NAME), ("instances", NUM), ("host ms / step", NUM), ("% of step", NUM)), rows)


_KERNEL_COLUMNS = (("kernel", NAME), ("category", TEXT), ("calls", NUM), ("total ms", NUM),
                   ("mean µs", NUM), ("% GPU time", NUM), ("op", TEXT))


def _kernel_table(trace: TraceInfo) -> str:
    views = trace.views
    if not views.kernels:
        return '<p class="empty">No kernels in the profiled steps.</p>'
    rows = [
        (row.name, CATEGORY_LABELS.get(row.category, row.category), _num(row.calls, 0),
         _num(row.total_ms, 3), _num(row.mean_us, 1), _num(row.pct, 1), row.op or "-")
        for row in views.kernels
    ]
    return _table(_KERNEL_COLUMNS, rows)


_MODULE_COLUMNS = (("module", NAME), ("phases", TEXT), ("instances", NUM), ("kernels / step", NUM),
                   ("GPU ms / step", NUM), ("% tiny", NUM), ("top tiny op", TEXT))


def _module_table(analysis: Analysis) -> str:
    findings = [f for f in analysis.findings if isinstance(f.details, ModuleCostsDetails)]
    if not findings:
        drawn = [trace.views for trace in analysis.traces if trace.views is not None]
        if drawn and all(views.recorded_with.get("with_stack") for views in drawn):
            return '<p class="empty">No kernels owned by an <code>nn.Module</code>.</p>'
        return ('<p class="empty">No kernels owned by an <code>nn.Module</code> '
                "(run with <code>with_stack=True</code>).</p>")
    parts = []
    for finding in findings:
        detail = finding.details
        assert isinstance(detail, ModuleCostsDetails)  # narrowed above
        rows = [
            (row.module or "-", row.phases or "-", _num(row.instances, 0), _num(row.kernels_per_step, 0),
             _num(row.gpu_ms_per_step, 2), _num(row.tiny_kernel_pct, 0),
             (row.top_ops[0].op if row.top_ops else None) or "-")
            for row in detail.modules
        ]
        several = len(findings) > 1 and finding.rank is not None
        heading = f"<h3>rank {esc(finding.rank)}</h3>" if several else ""
        parts.append(heading + _table(_MODULE_COLUMNS, rows))
    return "".join(parts)


def _memory(trace: TraceInfo) -> str:
    """The memory analysis' series (`MemoryProfile.series`) as stacked areas by category under the
    allocated total, the reserved total dashed above it, the peak marked, then its largest
    allocations alive at the peak; then the allocator's recorded history (`HistoryView`), if any."""
    history = _history(trace.memory_history) if trace.memory_history is not None else ""
    memory = trace.memory
    if memory is None or not memory.series.t_ms:
        if not trace.views.timeline.lanes:
            return '<p class="empty">No GPU memory: the run did no GPU work.</p>' + history
        if trace.views.recorded_with.get("profile_memory"):
            return '<p class="empty">No GPU memory recorded in the profiled steps.</p>' + history
        return ('<p class="empty">No GPU memory recorded (run with <code>profile_memory=True</code>).</p>'
                + history)
    series = memory.series
    t_ms = np.asarray(series.t_ms, dtype=np.float64)
    total = np.asarray(series.allocated_bytes, dtype=np.float64)
    reserved = np.asarray(series.reserved_bytes or [], dtype=np.float64)
    if len(reserved) != len(t_ms):
        reserved = np.empty(0)
    start, span = float(t_ms[0]), max(float(t_ms[-1] - t_ms[0]), 1e-9)
    top = max(float(total.max()), float(reserved.max()) if len(reserved) else 0.0, 1.0)
    width, height = 1000.0, 200.0
    x_text = [f"{x:.1f}" for x in ((t_ms - start) / span * width).tolist()]

    def points(values: np.ndarray) -> list[str]:
        """The curve `values` as the chart's 'x,y' points (each x formatted once, for every curve)."""
        ys = (height - values / top * (height - 10)).tolist()
        return [f"{x},{y:.1f}" for x, y in zip(x_text, ys, strict=True)]

    # One band per category, stacked in `memory.CATEGORIES` order (the drawing adds them up): a
    # band's lower edge is the band below's upper edge, its points made once.
    layers, shown, below = [], [], None
    for name in MEMORY_CATEGORIES:
        values = np.asarray(series.by_category.get(name, []), dtype=np.float64)
        if len(values) != len(t_ms) or not values.any():
            continue
        if below is None:
            floor = np.zeros(len(t_ms))
            below = (floor, points(floor))
        above = below[0] + values
        above_points = points(above)
        band = " ".join(above_points) + " " + " ".join(reversed(below[1]))
        layers.append(f'<polygon class="band mem-{name}" points="{band}"/>')
        shown.append(name)
        below = (above, above_points)
    peak_x = (memory.peak_at_ms - start) / span * width
    peak = esc(_format.size(memory.peak_bytes))
    grid, labels = _size_axis(top, height)
    chart = (
        f'<div class="plot">{labels}'
        f'<svg class="memory" viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="none" role="img" '
        f'aria-label="allocated GPU memory over the recorded window, by category">'
        f"<title>allocated GPU memory; peak {peak}</title>{grid}"
        + "".join(layers)
        + f'<polyline class="curve" points="{" ".join(points(total))}"/>'
        + (f'<polyline class="reserved" points="{" ".join(points(reserved))}"/>' if len(reserved) else "")
        + f'<line class="peak" x1="{peak_x:.1f}" x2="{peak_x:.1f}" y1="0" y2="{height:.0f}"/></svg></div>'
        f'<div class="axis"><span>{start:,.1f} ms</span><span>allocated, peak {peak} at '
        f"{memory.peak_at_ms:,.1f} ms (step {esc(memory.peak_step)})</span>"
        f"<span>{start + span:,.1f} ms</span></div>"
    )
    legend = "".join(
        f'<span><i class="mem-{name}"></i>{esc(name.replace("_", " "))}</span>' for name in shown
    )
    if len(reserved):
        legend += '<span><i class="mem-reserved"></i>reserved by the allocator (dashed)</span>'
    chart += f'<div class="legend">{legend}</div>' if legend else ""
    if not memory.largest:
        return chart + history
    rows = [
        ((_format.size(a.bytes), a.bytes), a.category.replace("_", " "), _num(a.allocated_at_ms, 2),
         a.op or "-", a.module or "-", a.python or "-")
        for a in memory.largest
    ]
    table = _table(
        (("size", NUM), ("category", TEXT), ("allocated at ms", NUM), ("op", TEXT), ("module", NAME),
         ("Python", NAME)),
        rows,
        scroll=False,
    )
    return chart + "<h3>Largest allocations alive at the peak</h3>" + table + history


def _size_axis(top: float, height: float) -> tuple[str, str]:
    """The y-axis of a memory chart whose top (`top` bytes) is `height - 10` above its foot: the SVG's
    gridlines at about `MEMORY_TICKS` round sizes, and their labels (HTML beside the chart, as the
    chart's drawing is stretched to the page's width)."""
    unit, scale = next(((unit, 1024.0 ** power) for unit, power in (("GiB", 3), ("MiB", 2), ("KiB", 1))
                        if top >= 1024.0 ** power), ("B", 1.0))
    raw = top / scale / MEMORY_TICKS
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    grid, labels = [], [f'<span class="unit">{unit}</span>']
    for k in range(int(top / scale / step) + 1):
        y = height - k * step * scale / top * (height - 10)
        grid.append(f'<line class="grid" x1="0" x2="1000" y1="{y:.1f}" y2="{y:.1f}"/>')
        labels.append(f'<span style="top:{100 * y / height:.2f}%">{k * step:g}</span>')
    return "".join(grid), f'<div class="y-axis" aria-hidden="true">{"".join(labels)}</div>'


def _history(view: HistoryView) -> str:
    """The allocator's recorded history (`memory.HistoryView`): allocated and reserved totals over the
    window, a line at each step end, and the failed allocation if there was one."""
    if not view.t_ms:
        return ""
    t_ms = np.asarray(view.t_ms, dtype=np.float64)
    marks = {step: at for step, at in view.step_marks.items() if np.isfinite(at)}
    ends = [*t_ms.tolist(), *marks.values(), *([view.oom_at_ms] if view.oom_at_ms is not None else [])]
    start, span = min(ends), max(max(ends) - min(ends), 1e-9)
    highest = max(view.allocated_bytes, default=0)
    top = max(highest, max(view.reserved_bytes, default=0), 1)
    width, height = 1000.0, 160.0

    def x(at: float) -> float:
        return (at - start) / span * width

    def curve(values: list[int]) -> str:
        return " ".join(f"{x(t):.1f},{height - v / top * (height - 10):.1f}"
                        for t, v in zip(t_ms.tolist(), values, strict=False))

    lines = "".join(f'<line class="step-mark" x1="{x(at):.1f}" x2="{x(at):.1f}" y1="0" y2="{height:.0f}">'
                    f"<title>step {esc(step)} begins</title></line>" for step, at in sorted(marks.items()))
    if view.oom_at_ms is not None:
        lines += (f'<line class="peak" x1="{x(view.oom_at_ms):.1f}" x2="{x(view.oom_at_ms):.1f}" y1="0" '
                  f'y2="{height:.0f}"><title>out of memory</title></line>')
    grid, labels = _size_axis(top, height)
    return (
        f"<h3>Allocator history ({view.entries:,} events; open {esc(view.file)} in "
        "PyTorch's memory viewer, https://pytorch.org/memory_viz)</h3>"
        f'<div class="plot history">{labels}'
        f'<svg class="memory history" viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="none" '
        'role="img" aria-label="allocated and reserved GPU memory over the recorded history">'
        f"<title>allocator history; highest allocated {esc(_format.size(highest))}</title>{grid}{lines}"
        f'<polyline class="curve" points="{curve(view.allocated_bytes)}"/>'
        f'<polyline class="reserved" points="{curve(view.reserved_bytes)}"/></svg></div>'
        f'<div class="axis"><span>{start:,.1f} ms</span><span>allocated (solid), reserved (dashed); '
        f"a line where each step begins</span><span>{start + span:,.1f} ms</span></div>"
    )


def _timeline_section(traces: list[TraceInfo]) -> str:
    select = ""
    if len(traces) > 1:
        options = "".join(
            f'<option value="{i}">{esc(_trace_label(trace))}</option>' for i, trace in enumerate(traces)
        )
        select = f'<select id="trace-select" aria-label="trace">{options}</select>'
    lanes = [lane for trace in traces for lane in trace.views.timeline.lanes]
    drawn = set(np.unique(np.concatenate([lane.category for lane in lanes])).tolist()) if lanes else set()
    legend = "".join(
        f'<span><i style="background:var(--cat-{c})"></i>{esc(CATEGORY_LABELS[c])}</span>'
        for code, c in enumerate(CATEGORIES) if code in drawn
    )
    return (
        f'<div class="toolbar">{select}<span id="timeline-steps" class="toolbar"></span></div>'
        '<div id="timeline-chart" class="chart"></div>'
        f'<div class="legend">{legend}</div>{_legend()}'
        '<p class="hint">Hover for a kernel\'s name, op, module and duration; wheel to zoom, drag to pan, '
        "double-click to see everything. Every lane is drawn on one time scale: a pixel column is filled "
        "where the kernels (or the idle runs) in it add up to half a pixel, what it leaves carried to the "
        "next, so tiny gaps merge and the share drawn is the share measured; each lane's share of the "
        "steps in view is printed beside its name. Kernels closer together than a pixel at full view are "
        "joined into one block (its hover says how many). For the raw timeline, open the trace file in "
        "Perfetto (ui.perfetto.dev).</p>"
    )


def _flame_section(traces: list[TraceInfo]) -> str:
    gpu = any(trace.views.timeline.lanes for trace in traces)
    stacks = all(trace.views.recorded_with.get("with_stack") for trace in traces)
    return (
        '<div class="toolbar"><button data-metric="host" class="on">host time</button>'
        + ('<button data-metric="gpu">GPU time launched beneath</button>' if gpu else "")
        + '<button id="flame-reset">reset zoom</button></div>'
        '<div id="flame-chart" class="chart"></div>'
        '<p class="hint">Callers above callees, merged by path over the profiled steps'
        + ("" if stacks else " (Python frames need <code>with_stack=True</code>)")
        + ". Click a frame to zoom into it.</p>"
    )


def _cross_rank(cross: CrossRank) -> str:
    """The cross-rank report as the console and report.md show it (`report.ranks`): the skew and
    the straggler, then its tables."""
    lines = [f'<p class="why"><b>{esc(label)}</b>: {esc(text)}</p>' for label, text in ranks.headline(cross)]
    tables = [f"<h3>{esc(table.title)}</h3>{_shared_table(table)}" for table in ranks.tables(cross)]
    return "".join(lines + tables)


def _shared_table(table: _format.Table) -> str:
    """A table the console and report.md show too (`_format.Table`), sortable: a numeric column's
    cells sort by the number they show (escaped here: `_table` writes a numeric cell as it is)."""
    columns = tuple((column.name, NUM if column.numeric else TEXT) for column in table.columns)
    rows = [
        tuple((esc(cell), _shown_number(cell)) if column.numeric else cell
              for column, cell in zip(table.columns, row, strict=True))
        for row in table.rows
    ]
    return _table(columns, rows)


def _shown_number(text: str) -> float:
    """The number a cell shows (`1,234.5`), for sorting; 0 for `-`."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _data(traces: list[TraceInfo]) -> str:
    """The JSON block the script draws from, safe inside a <script> element."""
    document = {
        "categories": [{"key": key, "label": CATEGORY_LABELS[key]} for key in CATEGORIES],
        "causes": [{"key": cause.key, "meaning": CAUSES[cause].meaning} for cause in Cause],
        "phases": list(PHASES),
        "traces": [
            {
                "label": _trace_label(trace),
                "timeline": _timeline_data(trace.views.timeline),
                "flame": _flame_data(trace.views.flame),
            }
            for trace in traces
        ],
    }
    encoded = _ENCODER.encode(document)
    for raw, safe in _SCRIPT_SAFE:
        encoded = encoded.replace(raw, safe)
    return encoded.decode()


def _times(values: np.ndarray) -> list[float]:
    return np.round(values, TIME_DECIMALS).tolist()


def _starts(values: np.ndarray) -> list[float]:
    """Sorted times as deltas of their rounded values (short numbers; the script adds them up)."""
    rounded = np.round(values, TIME_DECIMALS)
    return np.round(np.diff(rounded, prepend=0.0), TIME_DECIMALS).tolist()


def _timeline_data(view: TimelineView) -> dict[str, Any]:
    return {
        "end": round(view.end_us, TIME_DECIMALS),
        "strings": _format.clean_all(view.strings),
        "steps": [
            [step.number, round(step.start_us, TIME_DECIMALS), round(step.end_us, TIME_DECIMALS)]
            for step in view.steps
        ],
        "lanes": [
            {
                "label": _format.clean(lane.label),
                "start": _starts(lane.start_us),
                "dur": _times(lane.dur_us),
                "busy": _times(lane.busy_us),
                "count": lane.count.tolist(),
                "name": lane.name.tolist(),
                "cat": lane.category.tolist(),
                "op": lane.op.tolist(),
                "module": lane.module.tolist(),
                "phase": lane.phase.tolist(),
            }
            for lane in view.lanes
        ],
        "idle": {
            "start": _starts(view.idle.start_us),
            "dur": _times(view.idle.dur_us),
            "idle": _times(view.idle.idle_us),
            "count": view.idle.count.tolist(),
            "cause": view.idle.cause.tolist(),
            "one_off": view.idle.one_off.astype(np.int8).tolist(),
        },
        "syncs": {
            "at": _times(view.syncs.at_us),
            "blocked": _times(view.syncs.blocked_us),
            "op": view.syncs.op.tolist(),
            "call": view.syncs.call.tolist(),
        },
    }


def _flame_data(graph: FlameGraph) -> dict[str, Any]:
    return {
        "strings": _format.clean_all(graph.strings),
        "parent": graph.parent.tolist(),
        "name": graph.name.tolist(),
        "host": np.round(graph.host_us, 1).tolist(),
        "gpu": np.round(graph.gpu_us, 1).tolist(),
    }
