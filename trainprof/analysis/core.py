"""`analyze()`: load traces, run each question's module per trace, merge into one `Analysis`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.attribution import attribute_kernels
from trainprof.analysis.busy import BusyBreakdown, busy_breakdown, kernel_work
from trainprof.analysis.busy_findings import busy_findings
from trainprof.analysis.distributed import rank_table, straggler_finding
from trainprof.analysis.fusion import swap_prediction
from trainprof.analysis.host_ops import cpu_only_finding
from trainprof.analysis.idle import idle_breakdown
from trainprof.analysis.idle_findings import idle_findings
from trainprof.analysis.kernels import top_kernels_finding
from trainprof.analysis.launch import launch_finding, launch_stats, tiny_kernels
from trainprof.analysis.memory import peak_memory_per_step
from trainprof.analysis.modules import module_costs_finding, owner_costs
from trainprof.analysis.peaks import device_peaks
from trainprof.analysis.result import SEVERITY_ORDER, Analysis, Finding, Step, Summary, TraceInfo
from trainprof.analysis.steps import has_gpu_work, step_breakdown
from trainprof.analysis.syncs import find_sync_points, join_sync_sites, step_syncs, sync_findings
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import build_timeline
from trainprof.analysis.verdict import verdict
from trainprof.trace import Trace, load_traces
from trainprof.trace.load import gc_paused


def analyze(
    path_or_traces: str | Path | Sequence[Trace],
    sync_sites: list[dict] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> Analysis:
    """Answer why the profiled steps are slow.

    `path_or_traces`: a trace file (.json/.json.gz), a folder of them (one per rank), or loaded `Trace`s.
    `sync_sites`: captured sync sites (DEVELOPING.md contract) applied to every trace, overriding the
    `<worker>.syncsites.json` files found beside the traces.
    `on_progress(what, done, total)`, if given, is called as each file is loaded and each trace
    analysed (two units a file), for a progress bar.
    `thresholds` overrides the cut-offs of `trainprof.analysis.thresholds.THRESHOLDS` by name
    (ValueError for an unknown name).
    Raises `trainprof.trace.TraceLoadError` on unreadable input.
    """
    limits = Thresholds(thresholds)
    report = on_progress or (lambda what, done, total: None)
    if isinstance(path_or_traces, (str, Path)):

        def on_file(file: Path, index: int, count: int) -> None:
            report(f"loading {file.name}", index, 2 * count)

        traces = load_traces(path_or_traces, on_file=on_file)
    else:
        traces = list(path_or_traces)
        if not traces or not all(isinstance(t, Trace) for t in traces):
            raise TypeError("analyze() takes a path or a non-empty list of trainprof.trace.Trace")

    all_steps: list[Step] = []
    findings: list[Finding] = []
    infos: list[TraceInfo] = []
    steps_by_rank: dict[int | str, list[Step]] = {}  # by process: the windows of one run are one rank
    for position, trace in enumerate(traces):
        report(f"analysing {trace.path.name}", len(traces) + position, 2 * len(traces))
        with gc_paused():
            steps, trace_findings, info = _analyze_one(trace, sync_sites, limits)
        all_steps.extend(steps)
        findings.extend(trace_findings)
        infos.append(info)
        steps_by_rank.setdefault(trace.process, []).extend(steps)

    ranks = rank_table(steps_by_rank) if len(steps_by_rank) > 1 else []
    straggler = straggler_finding(ranks, limits) if ranks else None
    if straggler is not None:
        findings.append(straggler)
    report("done", 2 * len(traces), 2 * len(traces))
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], -f.cost_ms))
    return Analysis(
        summary=_summary(all_steps, infos, straggler, limits),
        steps=all_steps,
        findings=findings,
        files=[str(t.path) for t in traces],
        traces=infos,
        ranks=ranks,
    )


def _analyze_one(
    trace: Trace, sync_sites: list[dict] | None, limits: Thresholds
) -> tuple[list[Step], list[Finding], TraceInfo]:
    timeline = build_timeline(trace)
    times = step_breakdown(timeline)
    n = len(times)

    points = find_sync_points(timeline)
    sites = sync_sites if sync_sites is not None else trace.sync_sites
    matched_sites = join_sync_sites(points, sites, trace.code_layout) if sites else 0
    syncs = step_syncs(points, [t.number for t in times])

    owners = attribute_kernels(timeline)
    costs = owner_costs(timeline, owners, tiny_kernels(timeline))
    launch_per_step, launch_totals = launch_stats(timeline, costs)
    idle = idle_breakdown(timeline, limits)
    peaks = peak_memory_per_step(timeline)
    gpu_work = has_gpu_work(times)  # else no GPU-idle time to split by cause
    parts = zip(times, syncs, launch_per_step, idle.per_step, peaks, strict=True)
    steps = [
        Step(times=t, syncs=sync, launch=launch, idle=row if gpu_work else None, peak_memory_bytes=peak)
        for t, sync, launch, row, peak in parts
    ]

    tiny_pct = 100.0 * launch_totals.tiny_kernel_count / max(launch_totals.kernel_count, 1)
    trace_verdict = verdict(steps, tiny_pct, limits)
    findings = sync_findings(points, n, trace.rank, trace_verdict.step_ms, limits)
    busy = None
    if gpu_work:
        work = kernel_work(timeline, owners, device_peaks(trace))
        busy = busy_breakdown(timeline, work, costs)
        swap, swapped = swap_prediction(timeline, owners, work)
        findings.extend(busy_findings(trace, work, busy, swap, swapped, costs, trace.rank, limits))
    findings.extend(idle_findings(trace_verdict, idle, steps, trace.rank, limits))
    for maybe in (
        launch_finding(trace_verdict, launch_totals, steps, trace.rank, limits),
        top_kernels_finding(timeline, trace.rank, owners.launch_op),
        module_costs_finding(costs, trace.rank),
        cpu_only_finding(timeline, times, trace.rank),
    ):
        if maybe is not None:
            findings.append(maybe)
    known_peaks = [p for p in peaks if p is not None]
    info = TraceInfo(
        file=str(trace.path),
        worker=trace.worker,
        rank=trace.rank,
        device=trace.device_properties[0].get("name") if trace.device_properties else None,
        step_numbers=[t.number for t in times],
        has_step_annotations=timeline.has_step_annotations,
        sync_sites_file=str(trace.sync_sites_path) if trace.sync_sites_path else None,
        sync_sites_matched=matched_sites,
        verdict=trace_verdict,
        peak_memory_bytes=max(known_peaks) if known_peaks else None,
        launch=launch_totals,
        idle=idle,
        busy=busy,
    )
    return steps, findings, info


def _summary(
    steps: list[Step], traces: list[TraceInfo], straggler: Finding | None, limits: Thresholds
) -> Summary:
    n = max(len(steps), 1)
    total_ms = sum(s.times.duration_ms for s in steps)
    verdicts = [t.verdict.label for t in traces]
    if straggler is not None:
        headline = f"straggler: rank {straggler.rank}"
    else:
        headline = max(set(verdicts), key=verdicts.count) if verdicts else "unknown"
    peaks = [t.peak_memory_bytes for t in traces if t.peak_memory_bytes is not None]
    busy = [(t.busy, len(t.step_numbers)) for t in traces if t.busy is not None]
    return Summary(
        verdict=headline,
        verdict_by_trace={
            (f"rank {t.rank}" if t.rank is not None else t.worker): label
            for t, label in zip(traces, verdicts, strict=True)
        },
        mean_step_ms=numpy_round(total_ms / n, 4),
        # Time-weighted: the union of GPU busy time over the total step time, not a mean of per-step %.
        gpu_busy_pct=numpy_round(100.0 * sum(s.times.gpu_busy_ms for s in steps) / total_ms, 2)
        if total_ms > 0
        else 0.0,
        syncs_per_step=round(sum(s.syncs.count for s in steps) / n, 3),
        kernels_per_step=round(sum(s.times.kernel_count for s in steps) / n, 1),
        peak_memory_bytes=max(peaks) if peaks else None,
        straggler_rank=straggler.rank if straggler is not None else None,
        thresholds_overridden=limits.overridden(),
        **_busy_summary(busy),
    )


def _busy_summary(busy: list[tuple[BusyBreakdown, int]]) -> dict:
    """The headline's GPU step time, MFU and peaks source over the traces (time-weighted), as
    `Summary` fields; empty without GPU work."""
    if not busy:
        return {}
    total_ms = sum(b.step_ms * n for b, n in busy)
    with_mfu = [(b, n) for b, n in busy if b.mfu_pct is not None]
    mfu_ms = sum(b.step_ms * n for b, n in with_mfu)
    dtypes = [b.mfu_dtype for b, _ in with_mfu]
    sources = [b.peaks.label for b, _ in busy if b.peaks is not None]
    return {
        "gpu_step_ms": numpy_round(total_ms / max(sum(n for _, n in busy), 1), 4),
        "mfu_pct": round(sum(b.mfu_pct * b.step_ms * n for b, n in with_mfu) / mfu_ms, 2) if mfu_ms else None,
        "mfu_dtype": max(set(dtypes), key=dtypes.count) if dtypes else None,
        "peaks_source": max(set(sources), key=sources.count) if sources else None,
    }
