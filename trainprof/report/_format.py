"""Shared wording of the reports: turns values the analysis computed into display strings and tables.

Nothing here computes a metric; it reads fields of the typed `Analysis` and formats them. Every
trace-derived string passes through `trainprof.report.text.safe_text` (cut to a limit: a
multi-megabyte name costs no more than a short one). How much of the analysis a report shows is set
here, in one place (`summary.json` holds all of it).

A report is: a title, the "where the step went" line, the headline rows, the findings (each one
rendered the same way, whatever its kind), then tables. A table is a `Table` of `Column`s and rows
of display strings; `TABLES` lists the functions that build them from an analysis, so a new table
is one function added there: the console lays it out at any width (`trainprof.report.layout`) and
report.md writes it (`trainprof.report.markdown`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from trainprof.analysis.figures import figures_of
from trainprof.analysis.kernels import TopKernelsDetails
from trainprof.analysis.modules import ModuleCostsDetails
from trainprof.analysis.oom import OutOfMemoryDetails
from trainprof.analysis.step_basis import STEP_WORDS
from trainprof.report.names import short_kernel_names, short_names
from trainprof.report.text import safe_text

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.compile import CompileStats
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.fragmentation import Fragmentation
    from trainprof.analysis.headroom import Headroom
    from trainprof.analysis.memory import MemoryProfile
    from trainprof.analysis.result import Analysis, Finding, Summary, TraceInfo

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
"""A kernel's short name (trainprof.report.names), at most."""
NAME_CHARS = 120
"""An op, module, file or function name in a table cell or a finding's evidence."""
TEXT_CHARS = 2000
"""A finding's title, cause or fix: whole in any real report, bounded for a hostile trace."""
DIFF_ROWS = 20
"""Rows of each table of `trainprof diff` (changed ops, changed kernels)."""
AB_DIFF_ROWS = 12
"""Rows of each diff table inside a `trainprof ab` report (one diff per variant)."""
OP_NAME_CHARS = 70
"""An op's name in a diff table."""
FINDING_TITLE_CHARS = 90
"""A finding's title in a diff table (the title, not the finding's whole text)."""
RUN_NAME_CHARS = 24
"""A run's name (a diff's side, an A/B variant) where it heads a column."""
CONSOLE_TABLES_PER_KIND = 1
"""Tables of each kind on the console (the first trace's); report.md has one per trace."""
PIPE_WIDTH = 160
"""Columns of console output that goes to a log or a pipe: paths and fixes are not folded."""
PLAIN_TEXT_WIDTH = 80
"""Columns of the plain-text report when the width is not known."""
STEP_SPLIT_MIN_PCT = 0.5
"""A GPU-idle cause under this share of the step is left out of "where the step went" (noise)."""


class Column(msgspec.Struct, frozen=True):
    """One column of a report table. `drop`: 0 keeps it at any width; on a narrow terminal the
    columns with the highest `drop` go first (and the console says which went)."""

    name: str
    numeric: bool = False
    drop: int = 0


class Table(msgspec.Struct):
    """A report table: title, columns, rows of display strings (already safe: `text.safe_text`).
    The first column names the row (it wraps rather than being cut, so names stay distinct)."""

    title: str
    columns: tuple[Column, ...]
    rows: Sequence[tuple[str, ...]] = msgspec.field(default_factory=list)


# Each headline row: (label, `Summary` field, unit suffix, decimals).
HEADLINE_ROWS: tuple[tuple[str, str, str, int], ...] = (
    ("verdict", "verdict", "", 0),
    ("step time", "mean_step_ms", " ms", 1),  # the judged step where known: `step_time`
    ("GPU busy", "gpu_busy_pct", " %", 1),
    ("syncs / step", "syncs_per_step", "", 1),
    ("kernels / step", "kernels_per_step", "", 0),
    ("comm / step", "comm_ms_per_step", " ms", 1),
    ("exposed comm / step", "comm_exposed_ms_per_step", " ms", 1),
)

# The GPU-idle causes of `Summary.idle_ms_per_step` in words, in the order they are named.
IDLE_CAUSE_WORDS: dict[str, str] = {
    "launch": "launch",
    "sync": "sync",
    "blocking": "blocking calls",
    "warmup": "warm-up",
    "input": "input",
    "host": "host code",
    "comm": "communication",
    "unknown": "unattributed",
    "profiler": "profiler",
    "one_off": "one-off",
}


def clean(value: Any, max_chars: int = TEXT_CHARS) -> str:
    """Trace-derived text for display (`text.safe_text`), at most `max_chars` characters."""
    return safe_text(value, max_chars)


def clean_all(values: list[str], max_chars: int = TEXT_CHARS) -> list[str]:
    """`clean` of each of `values`; checked in one pass when all are short printable ASCII (a
    view's table of names), which they then stay."""
    joined = "".join(values)
    if joined.isascii() and joined.isprintable() and max(map(len, values), default=0) <= max_chars:
        return list(values)
    return [clean(value, max_chars) for value in values]


def number(value: Any, decimals: int = 1, unit: str = "") -> str:
    """A number for display; '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{clean(value, NAME_CHARS)}{unit}"
    return f"{value:,.{decimals}f}{unit}"


def ratio(value: float | None) -> str:
    """A ratio for display (`1.23x`); '-' when missing (nothing to divide by)."""
    return "-" if value is None else f"{value:,.2f}x"


def signed(value: float | None, decimals: int = 2) -> str:
    """A change for display with its sign (`+1.25`, `-0.50`); '-' when missing."""
    return "-" if value is None else f"{value:+,.{decimals}f}"


GPU_ONLY_ROWS = frozenset({"GPU busy", "kernels / step"})
"""Headline rows a run without GPU work leaves out: they would be zeros nothing measured."""


def headline(analysis: Analysis) -> list[tuple[str, str]]:
    """(label, value) rows of the headline; rows whose value the analysis lacks are left out."""
    summary = analysis.summary
    no_gpu = summary.verdict == "cpu-only" or (
        bool(analysis.traces) and all(t.verdict.label == "cpu-only" for t in analysis.traces))
    rows = [
        (label, number(getattr(summary, name), decimals, unit))
        for label, name, unit, decimals in HEADLINE_ROWS
        if getattr(summary, name) is not None and not (no_gpu and label in GPU_ONLY_ROWS)
    ]
    labels = [label for label, _ in rows]
    if "step time" in labels and summary.judged_step_ms is not None:
        rows[labels.index("step time")] = ("step time", step_time(summary))
    if summary.one_off_left_out_pct is not None:
        rows[0] = ("verdict", f"{rows[0][1]} (leaves out one-off costs, which left the GPU idle "
                              f"{summary.one_off_left_out_pct:.0f}% of the recorded steps' time: see the "
                              "one-off findings)")
    if summary.verdict_caveat is not None:
        rows.insert(1, ("caveat", clean(summary.verdict_caveat)))
    if summary.reason is not None:
        rows.insert(1, ("why", clean(summary.reason)))
    mfu = mfu_line(summary)
    if mfu is not None:
        slowed = profiler_slowed(analysis) and (summary.mfu_pct or summary.mfu_achievable_pct)
        over = " (over the un-profiled step)" if slowed else ""
        rows.append(("MFU", mfu + over))
    if summary.peaks_label is not None:
        rows.append(("device peaks", clean(summary.peaks_label)))
    if summary.peak_memory_bytes is not None:
        rows.append(("peak memory", size(summary.peak_memory_bytes)))
    memory = max((t.memory for t in analysis.traces if t.memory is not None), key=lambda m: m.peak_bytes,
                 default=None)
    if memory is not None:
        rows.append(("memory at peak", memory_breakdown(memory)))
    at_peak = max((t for t in analysis.traces if t.memory is not None),
                  key=lambda t: t.memory.peak_bytes if t.memory is not None else 0, default=None)
    if at_peak is not None and at_peak.fragmentation is not None:
        rows.append(("memory reserved", reserve_line(at_peak.fragmentation)))
    if at_peak is not None and at_peak.headroom is not None:
        rows.append(("memory headroom", headroom_line(at_peak.headroom)))
    compiled = next((t.compile for t in analysis.traces if t.compile is not None), None)
    if compiled is not None:
        rows.append(("torch.compile", compile_line(compiled)))
    if analysis.cross_rank is not None:
        rows += rank_headline(analysis.cross_rank)
    return rows


def step_time(summary: Summary) -> str:
    """The step that judges (`Summary.judged_step_ms`), and in words the other step lengths, only
    where they differ from it (`Summary.other_steps`): `49.7 ms as the GPU ran it; 21.5 ms in the
    host's step windows (the host runs ahead of the GPU)`."""
    judged = number(summary.judged_step_ms, 1, " ms")
    others = summary.other_steps
    if not others:
        return judged
    basis = summary.judged_step_basis or "window"
    text = f"{judged} {STEP_WORDS[basis]}; " + ", ".join(
        f"{ms:,.1f} ms {STEP_WORDS[other]}" for other, ms in others)
    if basis == "gpu_busy":
        text += " (the un-profiled steps were timed shorter than the GPU's work in a step)"
    elif basis == "unprofiled" and summary.profiler_slowdown_pct is not None:
        text += f" (the profiler made the recorded steps {summary.profiler_slowdown_pct:.0f}% longer)"
    elif summary.host_ran_ahead:
        text += " (the host runs ahead of the GPU)"
    return text


FLOPS_ALL_KNOWN_PCT = 99.5
"""From this share of the compute time with known FLOPs the MFU line names no coverage."""


def headline_notes(analysis: Analysis) -> dict[str, str]:
    """The detail behind some headline rows, by label, for the HTML report's tooltips."""
    source = analysis.summary.peaks_source
    return {"device peaks": clean(source)} if source is not None else {}


def mfu_line(summary: Summary) -> str | None:
    """`41.2 % of the bf16 datasheet peak (989 TFLOP/s dense); 50.8 % of the achievable 804`, with
    the share of the compute time whose FLOPs it counts when that is not all of it; `unknown` when
    too little is known; None without FLOPs or peaks."""
    known = summary.mfu_flops_known_pct
    dtype = clean(summary.mfu_dtype or "?")
    parts = []
    if summary.mfu_pct is not None:
        peak = f" ({summary.mfu_peak_tflops:,.0f} TFLOP/s dense)" if summary.mfu_peak_tflops else ""
        parts.append(f"{number(summary.mfu_pct, 1, ' %')} of the {dtype} datasheet peak{peak}")
    if summary.mfu_achievable_pct is not None:
        rate = f" {summary.mfu_achievable_tflops:,.0f}" if summary.mfu_achievable_tflops else ""
        words = "of the achievable" if parts else f"of the {dtype} achievable peak"
        parts.append(f"{number(summary.mfu_achievable_pct, 1, ' %')} {words}{rate}")
    if parts:
        line = "; ".join(parts)
        if known is not None and known < FLOPS_ALL_KNOWN_PCT:
            line += f" (counts the FLOPs of {known:.0f}% of the compute time)"
        return line
    if known is not None and summary.peaks_source is not None:
        return f"unknown: FLOPs known for only {known:.0f}% of the compute time"
    return None


def memory_breakdown(memory: MemoryProfile) -> str:
    """`temporaries 7.83 GiB, activations 5.70 GiB, persistent 2.21 GiB; logits and the loss 11.74 GiB`:
    the peak's categories, largest first, then its tensor families."""
    parts = [f"{name.replace('_', ' ')} {size(held)}" for name, held in
             sorted(memory.by_category.items(), key=lambda kv: -kv[1]) if held > 0]
    families = [f"{FAMILY_WORDS.get(name, name)} {size(held)}" for name, held in
                sorted(memory.by_family.items(), key=lambda kv: -kv[1]) if held > 0]
    return ", ".join(parts) + (f"; of which {', '.join(families)}" if families else "")


def headroom_line(room: Headroom) -> str:
    """`activations and temporaries 13.53 GiB at 8,192 tokens (1.69 MiB per token): about 9.7x as
    many tokens per step fit in 132.81 GiB usable (batch up to 38 at 2,048 tokens; or sequences up to
    18,112 at batch 4)`."""
    text = f"activations and temporaries {size(room.scaling_bytes)}"
    tokens = room.tokens
    if tokens is not None and room.bytes_per_token is not None:
        text += f" at {tokens.tokens:,} tokens ({size(room.bytes_per_token)} per token)"
    text += f": about {room.fits_times:,.1f}x as many tokens per step fit in {size(room.usable_bytes)} usable"
    limits = []
    if room.largest_batch is not None and tokens is not None and tokens.seq_len is not None:
        limits.append(f"batch up to {room.largest_batch:,} at {tokens.seq_len:,} tokens")
    if room.longest_seq_len is not None and tokens is not None and tokens.batch is not None:
        limits.append(f"sequences up to {room.longest_seq_len:,} tokens at batch {tokens.batch:,}")
    return text + (f" ({'; or '.join(limits)})" if limits else "")


def reserve_line(facts: Fragmentation) -> str:
    """`17.61 GiB at most (11.7% of the device); 0.72 GiB (4.1%) of it held no tensor at the peak;
    2 cudaMalloc retries`."""
    text = f"{size(facts.reserved_peak_bytes)} at most"
    if facts.reserved_device_pct is not None:
        text += f" ({facts.reserved_device_pct:.1f}% of the device)"
    text += f"; {size(facts.cached_bytes)} ({facts.cached_pct:.1f}%) of it held no tensor at the peak"
    if facts.num_alloc_retries:
        text += f"; {facts.num_alloc_retries:,} cudaMalloc retries"
    if facts.expandable_segments:
        text += "; expandable segments"
    return text


FAMILY_WORDS = {"logits_loss": "logits and loss", "attention_scores": "attention scores"}
"""Short names of the memory analysis' tensor families, for the headline."""


def compile_line(compiled: CompileStats) -> str:
    """`recompiles in 2 of 2 steps (1,747.4 ms/step compiling); 1 compiled region/step; graph breaks 1`."""
    if compiled.recompiles_every_step:
        head = (f"recompiles in {compiled.steps_compiling} steps "
                f"({number(compiled.compile_ms_per_step, 1)} ms/step compiling)")
    elif compiled.steps_compiling:
        compile_ms = number(compiled.compile_ms_per_step, 1)
        head = f"compiles in {compiled.steps_compiling} step(s) ({compile_ms} ms/step)"
    else:
        head = "no recompiles"
    breaks = "unknown" if compiled.graph_breaks is None else str(compiled.graph_breaks)
    share = compiled.compiled_share
    covered = f"; {100 * share:.0f}% of the model's GPU time compiled" if share is not None else ""
    return (f"{head}; {compiled.compiled_regions_per_step:g} compiled regions/step{covered}; "
            f"graph breaks {breaks}")


def step_split(analysis: Analysis) -> str | None:
    """Where the step went, in one line: GPU busy, then GPU idle by cause, largest first, as shares
    of the step (`Summary.gpu_busy_pct`, `Summary.idle_step_pct`)."""
    summary = analysis.summary
    if summary.gpu_busy_pct is None or not summary.mean_step_ms:
        return None
    if not summary.idle_ms_per_step:
        return f"where the step went: {summary.mean_step_ms:,.1f} ms of host time, no GPU work recorded"
    shares = sorted(((pct, cause) for cause, pct in summary.idle_step_pct.items()),
                    key=lambda share: -share[0])
    idle = [f"{IDLE_CAUSE_WORDS.get(cause, cause)} {pct:.1f}%" for pct, cause in shares
            if pct >= STEP_SPLIT_MIN_PCT]
    text = f"where the step went: GPU busy {summary.gpu_busy_pct:.1f}%"
    text += f"; GPU idle: {', '.join(idle)}" if idle else ""
    if profiler_slowed(analysis):
        unprofiled = summary.unprofiled_step_ms or summary.mean_step_ms
        text = (f"{text} (recorded); un-profiled ({unprofiled:,.1f} ms/step) GPU busy "
                f"{summary.unprofiled_gpu_busy_pct or 0.0:.0f}%: the rest of the idle time is the profiler's")
    return text


def profiler_slowed(analysis: Analysis) -> bool:
    """Whether a trace's recorded steps are judged by its un-profiled ones (`ProfilerCost.slowed`)."""
    return any(t.profiler is not None and t.profiler.slowed for t in analysis.traces)


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
    text = os.path.basename(clean(file, NAME_CHARS)) if file else "?"
    if line is not None:
        text += f":{line}"
    if function:
        text += f" {clean(function, NAME_CHARS)}"
    return text


FINDING_COLUMNS = ("severity", "finding", "op", "where", "per step", "GPU time at stake", "cost", "fix")
TOP_KERNELS_KIND = "top_kernels"  # rendered as its own table, not as a findings row
MODULE_COSTS_KIND = "module_costs"  # likewise


def source_labels(findings: list[Finding]) -> bool:
    """Whether the findings come from more than one rank or window: the reports then say whose each is."""
    return len({(f.rank, f.window) for f in findings}) > 1


def source_column(findings: list[Finding]) -> str:
    """The header of the column that says whose each finding is: `rank`, `window` or `rank, window`."""
    ranks = len({f.rank for f in findings}) > 1
    windows = len({f.window for f in findings if f.window is not None}) > 1
    return "rank, window" if ranks and windows else "rank" if ranks else "window"


def source_of(finding: Finding | TraceInfo, findings: Sequence[Finding | TraceInfo]) -> str:
    """`rank 1`, `window 2` or `rank 1 window 2`: what tells the finding's trace apart among
    `findings`' (windows counted from 1); '-' for a finding over all traces. Traces (`TraceInfo`)
    are told apart the same way."""
    ranks = {f.rank for f in findings}
    windows = {f.window for f in findings if f.window is not None}
    parts = []
    if len(ranks) > 1 and finding.rank is not None:
        parts.append(f"rank {finding.rank}")
    if len(windows) > 1 and finding.window is not None:
        parts.append(f"window {finding.window + 1}")
    return " ".join(parts) or "-"


def finding_row(finding: Finding, analysis: Analysis | None = None) -> tuple[str, ...]:
    """The cells of one finding, in FINDING_COLUMNS order, whole (the console wraps, never cuts);
    `analysis`, when given, holds the step its GPU time is a share of (`Analysis.gpu_step_pct`)."""
    return (
        clean(finding.severity or "-", NAME_CHARS),
        clean(finding.title or finding.kind or "-"),
        clean(finding.op or "-", NAME_CHARS),
        where(finding),
        count_per_step(finding),
        gpu_at_stake(finding, analysis.gpu_step_pct(finding) if analysis is not None else None),
        cost(finding),
        clean(finding.fix or "-"),
    )


def count_per_step(finding: Finding) -> str:
    """`185 kernels`: `per_step` with what it counts (`figures.FIGURES`); '-' where that says nothing."""
    figures = figures_of(finding.kind)
    if figures.count_of is None or finding.per_step is None:
        return "-"
    counted = figures.count_one if finding.per_step == 1 and figures.count_one else figures.count_of
    return f"{finding.per_step:,.2f}".rstrip("0").rstrip(".") + f" {counted}"


def gpu_at_stake(finding: Finding, step_pct: float | None) -> str:
    """`5.27 ms of GPU time per step (11% of the step)`: what the fix could win back; '-' where the
    finding has no such time or is about memory (`figures.Figures.gain`)."""
    if finding.gpu_ms_per_step is None or not figures_of(finding.kind).gain:
        return "-"
    text = f"{finding.gpu_ms_per_step:,.2f} ms of GPU time per step"
    if step_pct is None:
        return text
    return text + (f" ({step_pct:.0f}% of the step)" if step_pct >= 0.5 else " (under 1% of the step)")


def cost(finding: Finding) -> str:
    """`12.40 ms of CPU time blocked in the syncs, over the recorded steps`: `cost_ms` with what it
    measures (`figures.FIGURES`); '-' where it is no time or the gain again."""
    cost_of = figures_of(finding.kind).cost_of
    return "-" if cost_of is None else f"{finding.cost_ms:,.2f} {cost_of}"


def finding_facts(finding: Finding, analysis: Analysis | None = None) -> list[str]:
    """The evidence of a finding as short facts (`op ...`, `at ...`, `185 kernels per step`, `at stake
    5.26 ms of GPU time per step (11% of the step)`, `cost ... over the recorded steps`), those the
    finding has, each with its unit and scope: any kind of finding renders the same way."""

    _, _, op, at, per_step, at_stake, spent, _ = finding_row(finding, analysis)
    facts = []
    if op != "-":
        facts.append(f"op {op}")
    if at != "-":
        facts.append(f"at {at}")
    if finding.cause and finding.cause not in finding.title:  # a sync's title names its cause
        facts.append(f"cause {clean(finding.cause, NAME_CHARS)}")
    if per_step != "-":
        facts.append(f"{per_step} per step")
    if at_stake != "-":
        facts.append(f"at stake {at_stake}")
    if spent != "-":
        facts.append(f"cost {spent}")
    return facts


def top_findings(analysis: Analysis, limit: int) -> list[Finding]:
    """The findings in the analysis's order (it ranks them), at most `limit`; those a table shows
    (`TABLES`) are left out."""
    shown_as_tables = {kind for kind, _ in TABLES if kind is not None}
    return [f for f in analysis.findings if f.kind not in shown_as_tables][:limit]


def finding_count(analysis: Analysis) -> int:
    """How many findings `top_findings` chooses from."""
    shown_as_tables = {kind for kind, _ in TABLES if kind is not None}
    return sum(f.kind not in shown_as_tables for f in analysis.findings)


def _details_of(analysis: Analysis, kind: type) -> list[tuple[Finding, Any]]:
    return [(f, f.details) for f in analysis.findings if isinstance(f.details, kind)]


def _titled(title: str, finding: Finding | TraceInfo, findings: Sequence[Finding | TraceInfo]) -> str:
    source = source_of(finding, findings)
    return title if source == "-" else f"{title}: {source}"


def top_kernels_tables(analysis: Analysis) -> list[Table]:
    """The kernels with the most GPU time (over all profiled steps), one table per trace."""
    found = _details_of(analysis, TopKernelsDetails)
    tables = []
    for finding, details in found:
        kernels = details.kernels[:KERNEL_ROWS]
        names = short_kernel_names([kernel.name for kernel in kernels], KERNEL_NAME_CHARS)
        rows = [
            (name, number(kernel.count, 0), number(kernel.total_ms, 2), number(kernel.mean_us, 1),
             number(kernel.pct, 1))
            for name, kernel in zip(names, kernels, strict=True)
        ]
        tables.append(Table(_titled("Top kernels", finding, [f for f, _ in found]), KERNEL_COLUMNS, rows))
    return tables


KERNEL_COLUMNS = (
    Column("kernel"),
    Column("calls", numeric=True, drop=2),
    Column("total ms", numeric=True),
    Column("mean us", numeric=True, drop=1),
    Column("% GPU time", numeric=True),
)


CLASS_COLUMNS = (
    Column("kernel class"),
    Column("GPU ms / step", numeric=True),
    Column("% of step", numeric=True),
    Column("achieved", numeric=True, drop=1),
    Column("% of achievable", numeric=True),
)
CLASS_ROWS = 12
"""Rows of the GPU-time-by-kernel-class table (there are 18 classes)."""


def kernel_class_tables(analysis: Analysis) -> list[Table]:
    """GPU time by kernel class, one table per trace with GPU work: time per step, share of the GPU
    step, throughput (TFLOP/s for GEMMs and attention, TB/s for memory-bound classes) and its share
    of the device's peak."""
    busy = [trace for trace in analysis.traces if trace.busy is not None]
    tables = []
    for trace in busy:
        rows = []
        for row in (trace.busy.classes if trace.busy is not None else [])[:CLASS_ROWS]:
            if row.achieved_tflops is not None:
                achieved = number(row.achieved_tflops, 1, " TFLOP/s")
            elif row.achieved_tb_s is not None:
                achieved = number(row.achieved_tb_s, 2, " TB/s")
            else:
                achieved = "-"
            rows.append(
                (
                    clean(row.label, NAME_CHARS),
                    number(row.gpu_ms_per_step, 2),
                    number(row.step_pct, 1),
                    achieved,
                    number(row.peak_pct, 0),
                )
            )
        tables.append(Table(_titled("GPU time by kernel class", trace, busy), CLASS_COLUMNS, rows))
    return tables


COPY_COLUMNS = (
    Column("made by"),
    Column("GPU ms / step", numeric=True),
    Column("calls / step", numeric=True, drop=2),
    Column("% of class", numeric=True, drop=1),
    Column("module", drop=3),
)
COPY_TABLE_MIN_STEP_PCT = 5.0
"""The copies table shows where the copy-and-cast class holds at least this share of the step."""


def copy_tables(analysis: Analysis) -> list[Table]:
    """The copy-and-cast class by what makes it (`TraceInfo.copies`), one table per trace where the
    class holds at least `COPY_TABLE_MIN_STEP_PCT` of the step."""
    shown = []
    for trace in analysis.traces:
        if trace.copies is None or trace.busy is None or not trace.busy.step_ms:
            continue
        if 100.0 * trace.copies.gpu_ms_per_step / trace.busy.step_ms >= COPY_TABLE_MIN_STEP_PCT:
            shown.append(trace)
    tables = []
    for trace in shown:
        rows = [
            (
                clean(row.label.split(" (")[0], NAME_CHARS),  # the words before the example
                number(row.gpu_ms_per_step, 2),
                number(row.calls_per_step, 1),
                number(row.class_pct, 0),
                clean(row.module or "-", NAME_CHARS),
            )
            for row in (trace.copies.rows if trace.copies is not None else ())
        ]
        tables.append(Table(_titled("Copies and casts by what makes them", trace, shown), COPY_COLUMNS, rows))
    return tables


ATTENTION_COLUMNS = (
    Column("call site, backend"),
    Column("calls / step", numeric=True, drop=3),
    Column("GPU ms / step", numeric=True),
    Column("TFLOP/s", numeric=True, drop=2),
    Column("mask", drop=1),
    Column("causal", drop=4),
)


def attention_tables(analysis: Analysis) -> list[Table]:
    """Which attention kernel each call site ran (`TraceInfo.attention`), one table per trace with
    fused attention: backend, time, rate, the mask it was given and its causal flag."""
    shown = [trace for trace in analysis.traces if trace.attention]
    tables = []
    for trace in shown:
        rows = []
        for site in trace.attention:
            mask = "-" if site.mask_shape is None else f"{site.mask_dtype or '?'} {site.mask_shape}"
            causal = "-" if site.is_causal is None else ("yes" if site.is_causal else "no")
            rows.append(
                (
                    f"{site.module or '-'} {site.query_shape or ''} {site.backend}",
                    number(site.calls_per_step, 1),
                    number(site.gpu_ms_per_step, 2),
                    number(site.achieved_tflops, 0),
                    clean(mask, NAME_CHARS),
                    causal,
                )
            )
        names = short_names([row[0] for row in rows], NAME_CHARS)  # a site is its module, shape, backend
        rows = [(name, *row[1:]) for name, row in zip(names, rows, strict=True)]
        tables.append(Table(_titled("Attention kernels by call site", trace, shown), ATTENTION_COLUMNS, rows))
    return tables


MODULE_COLUMNS = (
    Column("module"),
    Column("phases", drop=3),
    Column("instances", numeric=True, drop=5),
    Column("kernels / step", numeric=True, drop=2),
    Column("GPU ms / step", numeric=True),
    Column("% tiny", numeric=True, drop=1),
    Column("top tiny op", drop=4),
)


def module_costs_tables(analysis: Analysis) -> list[Table]:
    """The per-module cost table (`nn.Module` class paths by GPU time, forward + backward), one per
    trace; `% tiny`: kernels shorter than their launch."""
    found = _details_of(analysis, ModuleCostsDetails)
    tables = []
    for finding, details in found:
        modules = details.modules[:MODULE_ROWS]
        names = short_names([row.module or "-" for row in modules], NAME_CHARS)
        rows = [
            (
                name,
                clean(row.phases or "-", NAME_CHARS),
                number(row.instances, 0),
                number(row.kernels_per_step, 0),
                number(row.gpu_ms_per_step, 2),
                number(row.tiny_kernel_pct, 0),
                clean((row.top_ops[0].op if row.top_ops else None) or "-", NAME_CHARS),
            )
            for name, row in zip(names, modules, strict=True)
        ]
        title = _titled("GPU time by module (forward + backward)", finding, [f for f, _ in found])
        tables.append(Table(title, MODULE_COLUMNS, rows))
    return tables


HELD_COLUMNS = (Column("held by"), Column("GiB", numeric=True), Column("how known", drop=1))
FIX_COLUMNS = (Column("fix"), Column("saves GiB", numeric=True), Column("rests on", drop=1))


def out_of_memory_tables(analysis: Analysis) -> list[Table]:
    """Per out-of-memory finding: what held the device's memory at the error, and its fixes with the
    memory each would save (`oom.OutOfMemoryDetails`)."""
    found = _details_of(analysis, OutOfMemoryDetails)
    tables = []
    for finding, details in found:
        head = _titled(f"Out of memory in step {details.failing_step}", finding, [f for f, _ in found])
        held = [(clean(h.category.replace("_", " "), NAME_CHARS), number(h.bytes / 2**30, 2),
                 clean(h.how, NAME_CHARS)) for h in details.held]
        tables.append(Table(f"{head}: what held the memory", HELD_COLUMNS, held))
        if details.fixes:
            fixes = [(clean(f.fix.replace("_", " "), NAME_CHARS), number(f.saves_bytes / 2**30, 2),
                      clean(f.basis)) for f in details.fixes]
            tables.append(Table(f"{head}: fixes", FIX_COLUMNS, fixes))
    return tables


def cross_rank_tables(analysis: Analysis) -> list[Table]:
    """With several ranks: the ranks' table, then the collectives across ranks and the longest waits
    (`rank_tables`); the console shows the first, the ranks'."""
    if analysis.cross_rank is None:
        return []
    return rank_tables(analysis.cross_rank)


TABLES: tuple[tuple[str | None, Callable[[Analysis], list[Table]]], ...] = (
    (None, out_of_memory_tables),
    (TOP_KERNELS_KIND, top_kernels_tables),
    (None, kernel_class_tables),
    (None, copy_tables),
    (None, attention_tables),
    (MODULE_COSTS_KIND, module_costs_tables),
    (None, cross_rank_tables),
)
"""The tables of a report, in order: (the finding kind a table shows instead of a findings entry,
or None; the function that builds its tables from an analysis)."""


def tables(analysis: Analysis, per_kind: int | None = None) -> list[Table]:
    """The tables of the report of `analysis`, in `TABLES` order: every one, or the first `per_kind`
    of each kind (a run of eight ranks has eight top-kernel tables; the console shows one)."""
    return [table for _, build in TABLES for table in build(analysis)[:per_kind]]


def trace_name(analysis: Analysis) -> str:
    """What was analysed, for the report's title: the trace file(s) by base name."""
    files = analysis.files
    if not files:
        return "trace"
    names = [os.path.basename(clean(f, NAME_CHARS)) for f in files]
    text = names[0] if len(names) == 1 else f"{len(names)} traces in {os.path.dirname(clean(files[0]))}"
    return clean(text, NAME_CHARS)


# The cross-rank report's tables and headline rows (`trainprof.analysis.distributed.CrossRank`): every
# report's with several ranks, and report.ranks.md's (`report.ranks`).
RANK_COLUMNS = (
    Column("rank"),
    Column("step ms", numeric=True),
    Column("comm ms", numeric=True, drop=3),
    Column("exposed comm ms", numeric=True, drop=1),
    Column("non-comm ms", numeric=True, drop=2),
    Column("waited ms", numeric=True),
    Column("exposed wait ms", numeric=True, drop=5),
    Column("arrived last %", numeric=True, drop=4),
    Column("compute ms", numeric=True, drop=7),
    Column("un-profiled late ms", numeric=True, drop=8),
    Column("verdict"),
    Column("each step ms", drop=6),
)
COLLECTIVE_COLUMNS = (
    Column("op"),
    Column("library", drop=5),
    Column("ranks", numeric=True, drop=6),
    Column("calls / step", numeric=True, drop=4),
    Column("median MiB", numeric=True, drop=3),
    Column("ms / step", numeric=True),
    Column("exposed ms / step", numeric=True, drop=1),
    Column("bus GB/s", numeric=True),
    Column("link", drop=2),
    Column("% of link", numeric=True),
)
WAIT_COLUMNS = (
    Column("step"),
    Column("#", numeric=True, drop=3),
    Column("op"),
    Column("MiB", numeric=True, drop=2),
    Column("transfer µs", numeric=True, drop=1),
    Column("arrived last", numeric=True),
    Column("longest wait µs", numeric=True),
)
WAIT_ROWS = 10
"""Rows of the longest-waits table in report.md (summary.ranks.json keeps them all)."""
STRAGGLER_MARK = " (straggler)"
"""After the straggler's rank in the ranks' table."""


def _mib(value: Any) -> str:
    return number(value / 2**20, 2) if value else "-"


def rank_rows(cross: CrossRank) -> list[tuple[str, ...]]:
    """The rows of the ranks' table; the straggler's rank says so."""
    return [
        (
            clean(row.rank) + (STRAGGLER_MARK if row.rank == cross.straggler_rank else ""),
            number(row.step_ms, 1),
            number(row.comm_ms, 1),
            number(row.comm_exposed_ms, 1),
            number(row.non_comm_ms, 1),
            number(row.waited_ms_per_step, 1),
            number(row.exposed_wait_ms_per_step, 1),
            number(row.last_arrival_pct, 0),
            number(row.compute_ms, 1),
            number(row.unprofiled_late_ms, 1),
            clean(row.verdict),
            " ".join(number(ms, 1) for ms in row.step_ms_by_step),
        )
        for row in cross.ranks
    ]


def collective_rows(cross: CrossRank) -> list[tuple[str, ...]]:
    """The rows of the collectives' table (bus bandwidth from the transfer times across ranks)."""
    return [
        (
            clean(row.op),
            clean(row.library),
            number(row.group_size, 0),
            number(row.calls_per_step, 1),
            _mib(row.median_bytes),
            number(row.ms_per_step, 2),
            number(row.exposed_ms_per_step, 2),
            number(row.busbw_gbps, 1),
            f"{row.link.kind} {row.link.gbps:.0f} GB/s" if row.link is not None else "-",
            number(row.link_pct, 0),
        )
        for row in cross.collectives
    ]


def wait_rows(cross: CrossRank, limit: int = WAIT_ROWS) -> list[tuple[str, ...]]:
    """The rows of the longest-waits table: collectives where some rank waited longest."""
    return [
        (
            str(match.step),
            str(match.index),
            clean(match.op),
            _mib(match.bytes),
            number(match.transfer_us, 1),
            clean(match.last_rank),
            number(match.max_wait_us, 1),
        )
        for match in cross.matched[:limit]
    ]


def rank_tables(cross: CrossRank) -> list[Table]:
    """The ranks' table, then (when known) the collectives across ranks and the longest waits."""
    found = [Table("Ranks", RANK_COLUMNS, rank_rows(cross))]
    if cross.collectives:
        title = "Collectives across ranks (bus bandwidth from the last arriver's time)"
        found.append(Table(title, COLLECTIVE_COLUMNS, collective_rows(cross)))
    if cross.matched:
        found.append(Table("Longest waits inside collectives", WAIT_COLUMNS, wait_rows(cross)))
    return found


def rank_headline(cross: CrossRank) -> list[tuple[str, str]]:
    """(label, value) rows: the skew and the straggler."""
    rows = [("step skew", f"{cross.step_skew_ms:.1f} ms ({cross.step_skew_pct:.1f}% of the median step)")]
    if cross.straggler_rank is not None:
        doing = clean(cross.straggler_doing)
        rows.append(("straggler", f"rank {clean(cross.straggler_rank)}: {doing}"))
    else:
        rows.append(("straggler", "none"))
    return rows
