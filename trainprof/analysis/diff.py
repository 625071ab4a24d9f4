"""What changed between two runs: ops, kernels, copies and findings, per step, before -> after.

    from trainprof.analysis.diff import diff_traces
    result = diff_traces("log/bare", "log/fused")     # files, run folders, or loaded Traces
    result.ops        # OpRow per cpu_op name: calls, host ms, GPU ms and kernels per step, a and b
    result.kernels    # GpuRow per kernel / memcpy / memset name: count and GPU ms per step
    result.findings   # FindingChange per finding (kind, op, where): removed, added or kept
    result.headline   # HeadlineRow per figure of the two summaries (step ms, GPU busy, ...)
    result.a.name     # "bare", "fused": the runs' names (folder, worker or variant) for reports
    result.to_dict()  # what `trainprof diff A B --json` prints

Every figure is per profiled step (a run folder with several ranks: per rank-step), so windows of
different lengths compare. An op's host ms is inclusive (its nested ops are in it too); its GPU
ms are the kernels whose launch it is the innermost op of, as in the top-kernels finding. A trace
without GPU work (a CPU run) has only calls and host ms.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainprof.analysis.core import analyze
from trainprof.analysis.kernels import kernel_ops
from trainprof.analysis.result import Analysis, Finding, Summary
from trainprof.analysis.timeline import Timeline, _join_correlation, build_timeline
from trainprof.trace import Trace, load_traces, worker_of
from trainprof.trace.model import ThreadFrames

REMOVED, ADDED, CHANGED, SAME = "removed", "added", "changed", "same"
# Relative change below which a row counts as the same (per-step averages of identical code differ
# by scheduling noise in host times only; counts are exact).
SAME_RELATIVE = 0.02


def change(before: float | None, after: float | None) -> float | None:
    """After minus before; None where either is missing."""
    return None if before is None or after is None else round(after - before, 6)


def ratio(before: float | None, after: float | None) -> float | None:
    """After over before; None where either is missing or before is 0 (nothing to compare with)."""
    return None if before is None or after is None or before == 0 else round(after / before, 4)


@dataclass
class OpRow:
    """One cpu_op name in both runs, per step. ``status``: removed, added, changed or same."""

    name: str
    status: str
    calls_a: float
    calls_b: float
    host_ms_a: float
    host_ms_b: float
    gpu_ms_a: float
    gpu_ms_b: float
    kernels_a: float
    kernels_b: float

    @property
    def gpu_ms_delta(self) -> float:
        """GPU ms per step after minus before."""
        return self.gpu_ms_b - self.gpu_ms_a

    @property
    def gpu_ms_ratio(self) -> float | None:
        """GPU ms per step after over before (None: none before)."""
        return ratio(self.gpu_ms_a, self.gpu_ms_b)

    @property
    def host_ms_delta(self) -> float:
        """Host ms per step after minus before."""
        return round(self.host_ms_b - self.host_ms_a, 6)


@dataclass
class GpuRow:
    """One kernel, memcpy or memset name (``kind``) in both runs: count and GPU ms per step."""

    name: str
    kind: str  # "kernel" | "memcpy" | "memset"
    status: str
    count_a: float
    count_b: float
    gpu_ms_a: float
    gpu_ms_b: float

    @property
    def gpu_ms_delta(self) -> float:
        """GPU ms per step after minus before."""
        return round(self.gpu_ms_b - self.gpu_ms_a, 6)

    @property
    def gpu_ms_ratio(self) -> float | None:
        """GPU ms per step after over before (None: none before)."""
        return ratio(self.gpu_ms_a, self.gpu_ms_b)


@dataclass
class FindingChange:
    """A finding keyed by (kind, op, where function): in A only (removed), B only (added), or both."""

    kind: str
    op: str | None
    function: str | None
    status: str
    title_a: str | None
    title_b: str | None
    per_step_a: float | None
    per_step_b: float | None
    cost_ms_per_step_a: float | None
    cost_ms_per_step_b: float | None

    @property
    def cost_ms_per_step_delta(self) -> float | None:
        """Cost ms per step after minus before (None where the finding is in one run only)."""
        return change(self.cost_ms_per_step_a, self.cost_ms_per_step_b)


@dataclass
class RunSide:
    """One run of a diff: its name, its trace files, its profiled steps, its analysis's summary.

    ``name`` labels the run in reports: the A/B variant, the run folder's name, or the trace file's
    worker (``a``/``b`` when that does not tell the two runs apart)."""

    files: list[str]
    steps: int
    summary: Summary
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "files", "steps", "summary"}``."""
        return {
            "name": self.name, "files": self.files, "steps": self.steps, "summary": self.summary.to_dict()
        }


@dataclass
class HeadlineRow:
    """One figure of both runs, per step (``None`` where a run lacks it)."""

    metric: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        """B minus A."""
        return change(self.a, self.b)

    @property
    def ratio(self) -> float | None:
        """B over A (None where A is 0 or missing)."""
        return ratio(self.a, self.b)


@dataclass
class TraceDiff:
    """The diff of run A against run B; every figure per profiled step."""

    a: RunSide
    b: RunSide
    headline: list[HeadlineRow]
    """Step ms, GPU busy, kernel ms, kernels, launches, copies, ops, syncs, peak memory."""
    ops: list[OpRow] = field(default_factory=list)
    kernels: list[GpuRow] = field(default_factory=list)
    findings: list[FindingChange] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"a", "b", "headline", "ops", "kernels", "findings"}``."""
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "headline": [asdict(row) for row in self.headline],
            "ops": [asdict(row) for row in self.ops],
            "kernels": [asdict(row) for row in self.kernels],
            "findings": [asdict(change) for change in self.findings],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceDiff:
        """A diff back from its ``to_dict()`` form (e.g. the diffs an A/B result carries)."""

        def side(run: dict[str, Any], default: str) -> RunSide:
            return RunSide(files=run["files"], steps=run["steps"], summary=Summary(**run["summary"]),
                           name=run.get("name") or default)

        return cls(
            a=side(data["a"], "a"),
            b=side(data["b"], "b"),
            headline=[HeadlineRow(**row) for row in data["headline"]],
            ops=[OpRow(**row) for row in data["ops"]],
            kernels=[GpuRow(**row) for row in data["kernels"]],
            findings=[FindingChange(**change) for change in data["findings"]],
        )

    def op(self, name: str) -> OpRow | None:
        """The row of one op name, or None."""
        return next((row for row in self.ops if row.name == name), None)


@dataclass
class _Totals:
    """Sums over the profiled steps of one run (all its traces)."""

    steps: int = 0
    op_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    op_host_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_gpu_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_kernels: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gpu_count: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    gpu_us: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    launches: int = 0

    def per_step(self, table: dict, key, scale: float = 1.0) -> float:
        """``table[key] * scale`` per profiled step (0 when absent)."""
        return round(table.get(key, 0) * scale / max(self.steps, 1), 4)

    def total_per_step(self, table: dict, kind: str, scale: float = 1.0) -> float:
        """The sum over ``table``'s (kind, name) keys of one kind, per profiled step."""
        total = sum(value for (row_kind, _), value in table.items() if row_kind == kind)
        return round(total * scale / max(self.steps, 1), 4)


def _load(run: str | Path | Sequence[Trace]) -> list[Trace]:
    if isinstance(run, (str, Path)):
        return load_traces(run)
    traces = list(run)
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise TypeError("diff_traces() takes a path or a non-empty list of trainprof.trace.Trace")
    return traces


def _add_trace(totals: _Totals, timeline: Timeline) -> None:
    trace, calls = timeline.trace, timeline.calls
    totals.steps += len(timeline.steps)
    ops = trace.events["cpu_op"]
    op_step = timeline.step_of(ops.start_us)
    for i in np.flatnonzero(op_step >= 0).tolist():
        name = trace.names[int(ops.name[i])]
        totals.op_calls[name] += 1
        totals.op_host_us[name] += float(ops.dur_us[i])
    totals.launches += int((timeline.call_is_launch & (timeline.step_of(calls.start_us) >= 0)).sum())

    kernels = timeline.kernels
    in_steps = np.flatnonzero(timeline.kernel_step >= 0)
    for k, op in zip(in_steps.tolist(), kernel_ops(timeline, in_steps).tolist(), strict=True):
        name = trace.names[int(kernels.name[k])]
        totals.gpu_count[("kernel", name)] += 1
        totals.gpu_us[("kernel", name)] += float(kernels.dur_us[k])
        key = trace.names[op] if op >= 0 else "(no op)"
        totals.op_gpu_us[key] += float(kernels.dur_us[k])
        totals.op_kernels[key] += 1
    for kind, category in (("memcpy", "gpu_memcpy"), ("memset", "gpu_memset")):
        table = trace.events[category]
        if not len(table):
            continue
        call = _join_correlation(table.correlation, calls.correlation)
        # A copy belongs to the step whose code issued it (as kernels do), else to where it ran.
        issued = (
            np.where(call >= 0, calls.start_us[np.clip(call, 0, None)], table.start_us)
            if len(calls)
            else table.start_us
        )
        for i in np.flatnonzero(timeline.step_of(issued) >= 0).tolist():
            name = trace.names[int(table.name[i])]
            totals.gpu_count[(kind, name)] += 1
            totals.gpu_us[(kind, name)] += float(table.dur_us[i])


def _status(before: float, after: float, *others: tuple[float, float]) -> str:
    if before == 0 and after > 0:
        return ADDED
    if before > 0 and after == 0:
        return REMOVED
    pairs = ((before, after), *others)
    if all(abs(b - a) <= SAME_RELATIVE * max(abs(a), abs(b)) for a, b in pairs):
        return SAME
    return CHANGED


def _per_step(value: float, steps: int, digits: int = 4) -> float:
    return round(value / max(steps, 1), digits)


def _op_rows(a: _Totals, b: _Totals) -> list[OpRow]:
    rows = []
    for name in set(a.op_calls) | set(b.op_calls) | set(a.op_gpu_us) | set(b.op_gpu_us):
        calls = a.per_step(a.op_calls, name), b.per_step(b.op_calls, name)
        host = a.per_step(a.op_host_us, name, 1e-3), b.per_step(b.op_host_us, name, 1e-3)
        gpu = a.per_step(a.op_gpu_us, name, 1e-3), b.per_step(b.op_gpu_us, name, 1e-3)
        kernels = a.per_step(a.op_kernels, name), b.per_step(b.op_kernels, name)
        # "(no op)" (kernels launched outside any cpu_op) exists where it has kernels.
        status = _status(calls[0] or kernels[0], calls[1] or kernels[1], gpu, kernels)
        rows.append(OpRow(name, status, *calls, *host, *gpu, *kernels))
    rows.sort(key=lambda r: (-abs(r.gpu_ms_b - r.gpu_ms_a), -abs(r.host_ms_b - r.host_ms_a), r.name))
    return rows


def _gpu_rows(a: _Totals, b: _Totals) -> list[GpuRow]:
    rows = []
    for key in set(a.gpu_count) | set(b.gpu_count):
        count = a.per_step(a.gpu_count, key), b.per_step(b.gpu_count, key)
        gpu = a.per_step(a.gpu_us, key, 1e-3), b.per_step(b.gpu_us, key, 1e-3)
        rows.append(GpuRow(key[1], key[0], _status(*count, gpu), *count, *gpu))
    rows.sort(key=lambda r: (-abs(r.gpu_ms_b - r.gpu_ms_a), r.kind, r.name))
    return rows


# Findings whose identity is their site; the others (launch overhead, host-bound, top kernels, ...)
# are one per run and keep their identity when their op list or function changes.
_KEYED_BY_SITE = frozenset({"sync_point"})


def _finding_key(finding: Finding) -> tuple:
    if finding.kind not in _KEYED_BY_SITE:
        return finding.kind, None, None
    return finding.kind, finding.op, finding.where.function


def _finding_changes(a: Analysis, b: Analysis) -> list[FindingChange]:
    steps_a = max(a.step_count, 1)
    steps_b = max(b.step_count, 1)
    found_a = {_finding_key(f): f for f in a.findings}
    found_b = {_finding_key(f): f for f in b.findings}
    changes = []
    for key in list(found_a) + [k for k in found_b if k not in found_a]:
        fa, fb = found_a.get(key), found_b.get(key)
        either = fb if fb is not None else fa
        assert either is not None  # the key is a finding's of a or of b
        status = REMOVED if fb is None else ADDED if fa is None else CHANGED
        changes.append(
            FindingChange(
                kind=key[0],
                op=either.op,
                function=either.where.function,
                status=status,
                title_a=fa.title if fa else None,
                title_b=fb.title if fb else None,
                per_step_a=fa.per_step if fa else None,
                per_step_b=fb.per_step if fb else None,
                cost_ms_per_step_a=round(fa.cost_ms / steps_a, 4) if fa else None,
                cost_ms_per_step_b=round(fb.cost_ms / steps_b, 4) if fb else None,
            )
        )
    return changes


def _headline(a: Analysis, b: Analysis, ta: _Totals, tb: _Totals) -> list[HeadlineRow]:
    sa, sb = a.summary, b.summary
    # A host that ran ahead of the GPU has step windows shorter than the steps the GPU ran: those
    # are the steps (a 128,256-token head against Liger's loss read 2.25x by its windows).
    ahead = sa.host_ran_ahead or sb.host_ran_ahead
    rows = [
        ("step ms (host window)" if ahead else "step ms", sa.mean_step_ms, sb.mean_step_ms),
        ("GPU busy %", sa.gpu_busy_pct, sb.gpu_busy_pct),
        (
            "kernel GPU ms / step",
            ta.total_per_step(ta.gpu_us, "kernel", 1e-3),
            tb.total_per_step(tb.gpu_us, "kernel", 1e-3),
        ),
        ("kernels / step", sa.kernels_per_step, sb.kernels_per_step),
        ("launches / step", _per_step(ta.launches, ta.steps, 1), _per_step(tb.launches, tb.steps, 1)),
        (
            "memcpys / step",
            ta.total_per_step(ta.gpu_count, "memcpy"),
            tb.total_per_step(tb.gpu_count, "memcpy"),
        ),
        (
            "cpu ops / step",
            _per_step(sum(ta.op_calls.values()), ta.steps, 1),
            _per_step(sum(tb.op_calls.values()), tb.steps, 1),
        ),
        ("syncs / step", sa.syncs_per_step, sb.syncs_per_step),
        ("peak memory bytes", sa.peak_memory_bytes, sb.peak_memory_bytes),
    ]
    if sa.unprofiled_step_ms is not None or sb.unprofiled_step_ms is not None:
        # The step without the profiler, where a session timed it: what a fix really changed.
        rows.insert(1, ("un-profiled step ms", sa.unprofiled_step_ms, sb.unprofiled_step_ms))
    if ahead:
        rows.insert(1, ("GPU step ms", sa.gpu_step_ms, sb.gpu_step_ms))
    return [HeadlineRow(metric, va, vb) for metric, va, vb in rows]


def run_names(run_a: str | Path | Sequence[Trace], run_b: str | Path | Sequence[Trace]) -> tuple[str, str]:
    """Names for two runs: a folder's name, a trace file's worker (``bare``, ``fused`` for
    ``log/ab/bare log/ab/fused``); ``a`` and ``b`` when they would not tell the runs apart."""

    def name(run: str | Path | Sequence[Trace]) -> str:
        if not isinstance(run, (str, Path)):
            return ""
        path = Path(run)
        return path.resolve().name if path.is_dir() else worker_of(path)

    a, b = name(run_a), name(run_b)
    return (a, b) if a and b and a != b else ("a", "b")


def diff_traces(
    run_a: str | Path | Sequence[Trace],
    run_b: str | Path | Sequence[Trace],
    names: tuple[str, str] | None = None,
) -> TraceDiff:
    """Diff run A (before) against run B (after): each a trace file, a run folder or loaded Traces.

    ``names`` label the two runs in reports (default ``run_names``). Raises
    ``trainprof.trace.TraceLoadError`` on unreadable input.
    """
    names = names or run_names(run_a, run_b)
    traces_a, traces_b = _load(run_a), _load(run_b)
    totals = []
    for traces in (traces_a, traces_b):
        run_totals = _Totals()
        for trace in traces:
            _add_trace(run_totals, build_timeline(trace))
        totals.append(run_totals)
    analysis_a, analysis_b = analyze(traces_a), analyze(traces_b)

    def side(traces: list[Trace], analysis: Analysis, run_totals: _Totals, name: str) -> RunSide:
        return RunSide(files=[str(t.path) for t in traces], steps=run_totals.steps, summary=analysis.summary,
                       name=name)

    return TraceDiff(
        a=side(traces_a, analysis_a, totals[0], names[0]),
        b=side(traces_b, analysis_b, totals[1], names[1]),
        headline=_headline(analysis_a, analysis_b, totals[0], totals[1]),
        ops=_op_rows(totals[0], totals[1]),
        kernels=_gpu_rows(totals[0], totals[1]),
        findings=_finding_changes(analysis_a, analysis_b),
    )


def range_cost(run: str | Path | Sequence[Trace], range_name: str, excluded_name: str | None = None) -> dict:
    """Per step: GPU ms, kernels and host ms of the work inside ``range_name`` profiler ranges.

    A kernel counts when, of the ranges named ``range_name`` or ``excluded_name`` enclosing its
    launch, the innermost is ``range_name`` (so work of an excluded child range is left out). Host
    ms: the ranges' own durations less the excluded ranges nested in them.
    """
    traces = _load(run)
    steps = 0
    gpu_us = host_us = 0.0
    kernel_count = ranges = 0
    for trace in traces:
        timeline = build_timeline(trace)
        steps += len(timeline.steps)
        names = {trace.name_id(range_name): range_name}
        if excluded_name is not None:
            names[trace.name_id(excluded_name)] = excluded_name
        names.pop(-1, None)
        annotations = trace.events["user_annotation"]
        in_step = timeline.step_of(annotations.start_us) >= 0
        for i in np.flatnonzero(in_step).tolist():
            name = names.get(int(annotations.name[i]))
            if name == range_name:
                host_us += float(annotations.dur_us[i])
                ranges += 1
            elif name is not None:
                frames = trace.frames(int(annotations.thread[i]))
                itself = frames.innermost(float(annotations.start_us[i]), float(annotations.end_us[i]))
                if _innermost_named(frames, frames.parent[itself], names) == range_name:
                    host_us -= float(annotations.dur_us[i])
        calls, kernels = timeline.calls, timeline.kernels
        for k in np.flatnonzero(timeline.kernel_step >= 0).tolist():
            c = int(timeline.kernel_call[k])
            if c < 0:
                continue
            frames = trace.frames(int(calls.thread[c]))
            index = frames.innermost(float(calls.start_us[c]), float(calls.end_us[c]))
            if _innermost_named(frames, index, names) == range_name:
                gpu_us += float(kernels.dur_us[k])
                kernel_count += 1
    return {
        "gpu_ms_per_step": _per_step(gpu_us / 1e3, steps),
        "kernels_per_step": _per_step(kernel_count, steps, 2),
        "host_ms_per_step": _per_step(host_us / 1e3, steps),
        "ranges_per_step": _per_step(ranges, steps, 2),
    }


def _innermost_named(frames: ThreadFrames, index: int, names: dict[int, str]) -> str | None:
    """The name of the innermost enclosing frame (from ``index`` up) whose name id is in ``names``."""
    while index >= 0:
        name = names.get(int(frames.name_ids[index]))
        if name is not None and frames.categories[index] == "user_annotation":
            return name
        index = frames.parent[index]
    return None
