"""`analyze()`: load traces, run each question's module per trace, merge into one `Analysis`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from trainprof.analysis.allocator import allocator_calls
from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.attribution import AttributionIndex, attribute_kernels
from trainprof.analysis.busy import BusyBreakdown, busy_breakdown, kernel_work
from trainprof.analysis.busy_findings import busy_findings
from trainprof.analysis.causes import INFERENCE_FIXES, Cause
from trainprof.analysis.collectives import (
    CommTotals,
    collective_stats,
    collectives,
    comm_totals,
    compute_spans,
    is_rocm_device,
)
from trainprof.analysis.comm_findings import (
    exposed_comm_finding,
    framework_of,
    hand_over_exposure,
    no_sync_finding,
    slow_collective_findings,
)
from trainprof.analysis.compile import compile_findings, compile_stats
from trainprof.analysis.distributed import RankSummary, cross_rank, rank_summary
from trainprof.analysis.folder import analyze_files
from trainprof.analysis.fusion import swap_prediction
from trainprof.analysis.host_ops import cpu_only_finding
from trainprof.analysis.idle import idle_breakdown
from trainprof.analysis.idle_findings import idle_findings
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.kernels import top_kernels_finding
from trainprof.analysis.launch import launch_finding, launch_stats, tiny_kernels
from trainprof.analysis.links import link_for
from trainprof.analysis.memory import memory_finding, memory_profile, peak_memory_per_step
from trainprof.analysis.modules import module_costs_finding, owner_costs
from trainprof.analysis.overlap import step_exposure
from trainprof.analysis.peaks import device_peaks
from trainprof.analysis.profiler_cost import (
    bound_findings,
    profiler_cost,
    rejudged,
    slowdown_finding,
    unprofiled_mfu,
)
from trainprof.analysis.result import Analysis, Finding, Step, Summary, TraceInfo
from trainprof.analysis.severity import finding_order
from trainprof.analysis.steps import has_gpu_work, step_breakdown
from trainprof.analysis.syncs import find_sync_points, join_sync_sites, step_syncs, sync_findings
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import Timeline, build_timeline
from trainprof.analysis.verdict import Verdict, verdict
from trainprof.analysis.workload import is_inference
from trainprof.trace import Trace
from trainprof.trace.load import first_event_us, gc_paused, last_windows, trace_paths


def analyze(
    path_or_traces: str | Path | Sequence[Trace],
    sync_sites: list[dict] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    thresholds: Mapping[str, float] | None = None,
    workers: int | None = None,
    views: bool = False,
    windows: int | None = None,
) -> Analysis:
    """Answer why the profiled steps are slow.

    `path_or_traces`: a trace file (.json/.json.gz), a folder of them (one per rank), or loaded `Trace`s.
    `sync_sites`: captured sync sites (DEVELOPING.md contract) applied to every trace, overriding the
    `<worker>.syncsites.json` files found beside the traces.
    `on_progress(what, done, total)`, if given, is called as each file is loaded and each trace
    analysed (two units a file), for a progress bar.
    `thresholds` overrides the cut-offs of `trainprof.analysis.thresholds.THRESHOLDS` by name
    (ValueError for an unknown name).
    `workers`: how many processes analyse a folder's files, each holding one trace at a time
    (default: one per core from `folder.PARALLEL_MIN_FILES` files on, else this process alone).
    `views`: also build what report.html draws of each trace (`TraceInfo.views`: timeline, op and
    kernel tables, flame graph; the memory chart is `TraceInfo.memory`).
    `windows`: of a folder, only the last this many windows of each process (`load.last_windows`):
    what a session with `repeat=0` analysed (it kept the last `session.MAX_WINDOWS`).
    Raises `trainprof.trace.TraceLoadError` on unreadable input.
    """
    limits = Thresholds(thresholds)
    report = on_progress or (lambda what, done, total: None)
    if isinstance(path_or_traces, (str, Path)):
        files = trace_paths(path_or_traces)
        if windows is not None:
            files = last_windows(files, windows)
        in_folder = Path(path_or_traces).is_dir()
        results = analyze_files(files, in_folder, sync_sites, limits, workers, report, views)
    else:
        traces = list(path_or_traces)
        if not traces or not all(isinstance(t, Trace) for t in traces):
            raise TypeError("analyze() takes a path or a non-empty list of trainprof.trace.Trace")
        results = []
        for position, trace in enumerate(traces):
            report(f"analysing {trace.path.name}", len(traces) + position, 2 * len(traces))
            results.append(analyze_trace(trace, sync_sites, limits, views))
    report("done", 2 * len(results), 2 * len(results))
    return compose(results, limits)


def compose(results: list[TraceResult], limits: Thresholds) -> Analysis:
    """One `Analysis` from the traces' results (in order): the steps and findings of each, and across
    processes (the windows of one process are one rank) the cross-rank report and its findings."""
    all_steps: list[Step] = []
    findings: list[Finding] = []
    infos: list[TraceInfo] = []
    by_process: dict[int | str, tuple[list[Step], list[TraceInfo]]] = {}
    for result in results:
        all_steps.extend(result.steps)
        findings.extend(result.findings)
        infos.append(result.info)
        steps, windows = by_process.setdefault(result.process, ([], []))
        steps.extend(result.steps)
        windows.append(result.info)
    summaries = [rank_summary(process, steps, windows) for process, (steps, windows) in by_process.items()]
    cross = None
    if len(summaries) > 1:
        cross, cross_findings = cross_rank(summaries, limits)
        findings.extend(cross_findings)
    else:
        findings.extend(_slow_on_one_rank(summaries[0], limits))
    findings = hand_over_exposure(findings, limits)
    straggler = next((f for f in findings if f.kind == "straggler"), None)
    findings.sort(key=finding_order)
    return Analysis(
        summary=_summary(all_steps, infos, straggler, limits),
        steps=all_steps,
        findings=findings,
        files=[result.info.file for result in results],
        traces=infos,
        ranks=cross.ranks if cross is not None else [],
        cross_rank=cross,
    )


def _slow_on_one_rank(summary: RankSummary, limits: Thresholds) -> list[Finding]:
    """Collectives far below their link, from one process's own durations (no other rank's to tell
    its waits from its transfers)."""
    if not summary.collectives:
        return []
    stats = collective_stats(
        summary.collectives,
        len(summary.step_ms_by_step),
        lambda group: link_for(summary.device, summary.visible_gpus, group),
    )
    n = max(len(summary.step_ms_by_step), 1)
    step_ms = sum(summary.step_ms_by_step) / n
    exposed_ms = sum(summary.exposed_comm_ms_by_step) / n
    rank = summary.rank if isinstance(summary.rank, int) else None
    return slow_collective_findings(
        stats, step_ms, exposed_ms, False, rank, is_rocm_device(summary.device), limits
    )


class TraceResult(msgspec.Struct):
    """What the analysis of one trace gives `compose`: its steps, findings and `TraceInfo`, the
    process that recorded it (its rank, else its worker name) and when its first event is (µs: a
    folder's windows of one process are numbered by it, `folder.analyze_files`)."""

    process: int | str
    steps: list[Step]
    findings: list[Finding]
    info: TraceInfo
    first_event_us: float = 0.0


def analyze_trace(
    trace: Trace, sync_sites: list[dict] | None, limits: Thresholds, views: bool = False
) -> TraceResult:
    """Run every question's module over one trace (`views`: as `analyze`'s)."""
    with gc_paused():
        steps, findings, info = _analyze_one(trace, sync_sites, limits, views)
    for finding in findings:
        finding.window = trace.window
    return TraceResult(trace.process, steps, findings, info, first_event_us(trace))


def _analyze_one(
    trace: Trace, sync_sites: list[dict] | None, limits: Thresholds, views: bool = False
) -> tuple[list[Step], list[Finding], TraceInfo]:
    timeline = build_timeline(trace)
    times = step_breakdown(timeline)
    n = len(times)

    points = find_sync_points(timeline, limits)
    sites = sync_sites if sync_sites is not None else trace.sync_sites
    matched_sites = join_sync_sites(points, sites, trace.code_layout) if sites else 0
    syncs = step_syncs(points, [t.number for t in times])

    sites = AttributionIndex(trace)  # nested once for the kernels' owners and the allocations'
    owners = attribute_kernels(timeline, sites)
    costs = owner_costs(timeline, owners, tiny_kernels(timeline))
    launch_per_step, launch_totals = launch_stats(timeline, costs)
    idle = idle_breakdown(timeline, limits)
    peaks = peak_memory_per_step(timeline)
    memory = memory_profile(timeline, sites)
    device = trace.device_properties[0] if trace.device_properties else {}
    device_memory = device.get("totalGlobalMem") if isinstance(device.get("totalGlobalMem"), int) else None
    device_name = device.get("name") if isinstance(device.get("name"), str) else None
    gpu_work = has_gpu_work(times)  # else no GPU-idle time to split by cause
    compute = Coverage(*compute_spans(timeline))
    exposure = step_exposure(timeline, compute)
    parts = zip(times, syncs, launch_per_step, idle.per_step, peaks, exposure, strict=True)
    steps = [
        Step(times=t, syncs=sync, launch=launch, idle=row if gpu_work else None, peak_memory_bytes=peak,
             comm=comm)
        for t, sync, launch, row, peak, comm in parts
    ]

    tiny_pct = 100.0 * launch_totals.tiny_kernel_count / max(launch_totals.kernel_count, 1)
    trace_verdict = verdict(steps, tiny_pct, limits)
    inference = is_inference(trace)
    if inference and trace_verdict.cause in INFERENCE_FIXES:  # no optimizer advice to a forward loop
        trace_verdict = msgspec.structs.replace(trace_verdict, fix=INFERENCE_FIXES[trace_verdict.cause])
    busy = work = None
    if gpu_work:
        work = kernel_work(timeline, owners, device_peaks(trace))
        busy = busy_breakdown(timeline, work, costs, limits)
    # The recorded steps against the session's un-profiled ones: what the profiler's own cost did.
    cost = profiler_cost(trace, trace_verdict, steps, limits, busy)
    trace_verdict = rejudged(trace_verdict, cost, limits)
    findings = sync_findings(points, n, trace.rank, trace_verdict.step_ms, limits)
    if gpu_work:
        busy = unprofiled_mfu(busy, cost)
        swap, swapped = swap_prediction(timeline, owners, work)
        # Gains are predicted from the un-profiled step where the profiler slowed the recorded ones.
        judged = work if cost is None or not cost.slowed else msgspec.structs.replace(
            work, step_ms=cost.judged_step_ms)
        findings.extend(busy_findings(trace, judged, busy, swap, swapped, costs, trace.rank, limits))
    compiled = compile_stats(timeline)
    recompiling = compiled is not None and compiled.recompiles_every_step
    # A recompile's GPU idle is warm-up idle: its own finding holds it, not the generic warm-up one.
    explained = {Cause.WARMUP: compiled.compile_gpu_idle_ms_per_step * n} if recompiling else None
    blocked = any(s.idle is not None and s.idle.costs[Cause.BLOCKING] > 0 for s in steps)
    allocator = allocator_calls(timeline) if blocked else None
    findings.extend(idle_findings(trace_verdict, idle, steps, trace.rank, limits, explained, allocator))
    findings.extend(compile_findings(compiled, timeline, trace_verdict.step_ms, trace.rank, limits))
    for maybe in (
        launch_finding(trace_verdict, launch_totals, steps, trace.rank, limits, recompiling, inference),
        top_kernels_finding(timeline, trace.rank, owners.launch_op),
        module_costs_finding(costs, trace.rank),
        memory_finding(memory, trace_verdict.step_ms, trace.rank, limits, device_memory, inference),
        cpu_only_finding(timeline, times, trace.rank),
        slowdown_finding(cost, n, trace.rank),
    ):
        if maybe is not None:
            findings.append(maybe)
    comm = _communication(timeline, steps, compute, trace_verdict, findings, device_name, limits)
    bound_findings(findings, cost, limits)
    known_peaks = [p for p in peaks if p is not None]
    drawn = None
    if views:  # imported here: an analysis without views (`trainprof analyze`) never loads them
        from trainprof.analysis.views import trace_views

        drawn = trace_views(timeline, owners, idle.pieces if gpu_work else None, points, work)
    info = TraceInfo(
        file=str(trace.path),
        worker=trace.worker,
        rank=trace.rank,
        device=device_name,
        step_numbers=[t.number for t in times],
        has_step_annotations=timeline.has_step_annotations,
        sync_sites_file=str(trace.sync_sites_path) if trace.sync_sites_path else None,
        sync_sites_matched=matched_sites,
        verdict=trace_verdict,
        peak_memory_bytes=max(known_peaks) if known_peaks else None,
        launch=launch_totals,
        idle=idle,
        compile=compiled,
        memory=memory,
        views=drawn,
        window=trace.window,
        comm=comm,
        busy=busy,
        profiler=cost,
    )
    return steps, findings, info


def _communication(
    timeline: Timeline,
    steps: list[Step],
    compute: Coverage,
    trace_verdict: Verdict,
    findings: list[Finding],
    device: str | None,
    limits: Thresholds,
) -> CommTotals | None:
    """The trace's `CommTotals` (None without communication); its communication findings are
    appended to `findings`: exposed communication, gradients synced on every micro-batch."""
    if not len(timeline.comm):
        return None
    trace = timeline.trace
    calls = collectives(timeline, compute)
    framework = framework_of(trace)
    comm = comm_totals(
        timeline.comm.on_host,
        [s.times.comm_ms for s in steps],
        [s.comm.comm_exposed_ms if s.comm is not None else 0.0 for s in steps],
        calls,
        device,
        len(trace.device_properties),
        framework.name if framework is not None else None,
    )
    step_ms = trace_verdict.step_ms
    comm_bound = trace_verdict.label == "communication-bound"
    for maybe in (
        exposed_comm_finding(comm, step_ms, comm_bound, trace.rank, len(steps), limits),
        no_sync_finding(timeline, calls, framework, step_ms, trace.rank, limits),
    ):
        if maybe is not None:
            findings.append(maybe)
    return comm


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
    comm_ms = sum(s.times.comm_ms for s in steps)
    exposed_ms = sum(s.comm.comm_exposed_ms for s in steps if s.comm is not None)
    communicates = any(t.comm is not None for t in traces)
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
        comm_ms_per_step=round(comm_ms / n, 4) if communicates else None,
        comm_exposed_ms_per_step=round(exposed_ms / n, 4) if communicates else None,
        comm_hidden_pct=round(100 * (1 - exposed_ms / comm_ms), 2) if communicates and comm_ms > 0 else None,
        thresholds_overridden=limits.overridden(),
        idle_ms_per_step=_idle_ms_per_step(steps),
        **_busy_summary(busy),
        **_unprofiled_summary(traces),
    )


def _idle_ms_per_step(steps: list[Step]) -> dict[str, float]:
    """GPU-idle ms per step over every step, by cause key and `one_off` (`Summary.idle_ms_per_step`)."""
    if all(step.idle is None for step in steps):
        return {}
    n = max(len(steps), 1)
    totals = dict.fromkeys([cause.key for cause in Cause] + ["one_off"], 0.0)
    for step in steps:
        if step.idle is not None:
            for cause, ms in step.idle.costs.items():
                totals[cause.key] += ms
            totals["one_off"] += step.idle.one_off_ms
    return {key: round(ms / n, 4) for key, ms in totals.items()}


def _unprofiled_summary(traces: list[TraceInfo]) -> dict:
    """The un-profiled step and how much longer the recorded steps are, over the traces that know
    it (weighted by their steps), as `Summary` fields; empty when none does."""
    known = [(t.profiler, len(t.step_numbers)) for t in traces if t.profiler is not None]
    steps = sum(n for _, n in known)
    if not steps:
        return {}
    unprofiled = sum(cost.unprofiled_step_ms * n for cost, n in known) / steps
    recorded = sum(cost.recorded_step_ms * n for cost, n in known) / steps
    return {
        "unprofiled_step_ms": round(unprofiled, 4),
        "profiler_slowdown_pct": round(100.0 * (recorded / unprofiled - 1.0), 2),
    }


def _busy_summary(busy: list[tuple[BusyBreakdown, int]]) -> dict:
    """The headline's GPU step time, MFU (and the share of the compute time whose FLOPs it
    counts) and peaks source over the traces (time-weighted), as `Summary` fields; empty without
    GPU work."""
    if not busy:
        return {}
    total_ms = sum(b.step_ms * n for b, n in busy)
    with_mfu = [(b, n) for b, n in busy if b.mfu_pct is not None]
    mfu_ms = sum(b.step_ms * n for b, n in with_mfu)
    dtypes = [b.mfu_dtype for b, _ in with_mfu]
    peaks = [b.peaks for b, _ in busy if b.peaks is not None]
    sources = [p.label for p in peaks]
    labels = [p.short_label for p in peaks]
    with_known = [(b, n) for b, n in busy if b.flops_known_pct is not None]
    known_ms = sum(b.step_ms * n for b, n in with_known)
    known_pct = sum(b.flops_known_pct * b.step_ms * n for b, n in with_known) / known_ms if known_ms else None
    return {
        "gpu_step_ms": numpy_round(total_ms / max(sum(n for _, n in busy), 1), 4),
        "mfu_pct": round(sum(b.mfu_pct * b.step_ms * n for b, n in with_mfu) / mfu_ms, 2) if mfu_ms else None,
        "mfu_dtype": max(set(dtypes), key=dtypes.count) if dtypes else None,
        "mfu_flops_known_pct": round(known_pct, 2) if known_pct is not None else None,
        "peaks_source": max(set(sources), key=sources.count) if sources else None,
        "peaks_label": max(set(labels), key=labels.count) if labels else None,
    }
