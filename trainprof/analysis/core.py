"""`analyze()`: load traces, run each question's module per trace, merge into one `Analysis`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from trainprof.analysis.allocator import allocator_calls
from trainprof.analysis.arrays import numpy_round
from trainprof.analysis.attention import attention_sites
from trainprof.analysis.attribution import AttributionIndex, attribute_kernels
from trainprof.analysis.busy import BusyBreakdown, busy_breakdown, kernel_work
from trainprof.analysis.busy_findings import busy_findings
from trainprof.analysis.causes import Cause, fix_for
from trainprof.analysis.collectives import (
    Collective,
    CommTotals,
    CommWait,
    collective_stats,
    collectives,
    comm_totals,
    comm_wait,
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
from trainprof.analysis.copies import copy_kernels
from trainprof.analysis.distributed import CrossRank, RankSummary, cross_rank, rank_summary
from trainprof.analysis.folder import analyze_files
from trainprof.analysis.fragmentation import fragmentation, fragmentation_finding
from trainprof.analysis.fsdp_host import fsdp_host_finding
from trainprof.analysis.fusion import swap_prediction
from trainprof.analysis.headroom import headroom
from trainprof.analysis.host_ahead import ahead_rejudged, gpu_step
from trainprof.analysis.host_ops import cpu_only_finding
from trainprof.analysis.host_work import host_work
from trainprof.analysis.idle import host_labels, idle_breakdown
from trainprof.analysis.idle_findings import idle_findings
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.kernels import top_kernels_finding
from trainprof.analysis.launch import launch_finding, launch_stats, tiny_kernels
from trainprof.analysis.links import link_for
from trainprof.analysis.memory import history_view, memory_finding, memory_profile, peak_memory_per_step
from trainprof.analysis.modules import module_costs_finding, owner_costs
from trainprof.analysis.oom import out_of_memory_finding
from trainprof.analysis.overlap import step_exposure
from trainprof.analysis.peaks import device_peaks
from trainprof.analysis.profiler_cost import (
    profiler_cost,
    rejudged,
    slowdown_finding,
    unprofiled_mfu,
)
from trainprof.analysis.profiler_overhead import profiler_host_estimate, verdict_caveat
from trainprof.analysis.rank_work import rank_work
from trainprof.analysis.recompute import recomputation
from trainprof.analysis.result import Analysis, Finding, Step, Summary, TraceInfo
from trainprof.analysis.severity import finding_order
from trainprof.analysis.step_basis import StepBasis, step_basis
from trainprof.analysis.steps import has_gpu_work, step_breakdown
from trainprof.analysis.stragglers import named_straggler
from trainprof.analysis.syncs import find_sync_points, join_sync_sites, step_syncs, sync_findings
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import Timeline, build_timeline
from trainprof.analysis.tokens import step_tokens
from trainprof.analysis.verdict import WAIT_VERDICT, Verdict, verdict
from trainprof.analysis.workload import is_inference, recorded_by_session
from trainprof.trace import Trace
from trainprof.trace.load import (
    first_event_us,
    gc_paused,
    last_windows,
    memory_files_without_trace,
    trace_paths,
)
from trainprof.trace.memory_file import MemoryFile


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
    A folder whose session ran out of GPU memory before it recorded a window (only its
    `<worker>.memory.json`) gives the `out_of_memory` findings alone (`without_window`).
    `windows`: of a folder, only the last this many windows of each process (`load.last_windows`):
    what a session with `repeat=0` analysed (it kept the last `session.MAX_WINDOWS`).
    Raises `trainprof.trace.TraceLoadError` on unreadable input.
    """
    limits = Thresholds(thresholds)
    report = on_progress or (lambda what, done, total: None)
    if isinstance(path_or_traces, (str, Path)):
        errors = memory_files_without_trace(Path(path_or_traces))
        if errors:
            return without_window(errors, limits)
        files = trace_paths(path_or_traces)
        if windows is not None:
            files = last_windows(files, windows)
        in_folder = Path(path_or_traces).is_dir()
        results = analyze_files(files, in_folder, sync_sites, limits, workers, report, views,
                                analyze_one=analyze_trace)
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


def without_window(documents: list[MemoryFile], limits: Thresholds, reason: str | None = None) -> Analysis:
    """The analysis of runs that ran out of GPU memory before a recorded window ended: the
    `out_of_memory` finding of each, explained by the error alone; verdict `not-profiled`."""
    findings = [
        out_of_memory_finding(document.out_of_memory, None, None, None, None, _rank_of(document.worker))
        for document in documents if document.out_of_memory is not None
    ]
    findings.sort(key=finding_order)
    steps = sorted({document.out_of_memory.steps_ended for document in documents if document.out_of_memory})
    reason = reason or (f"the loop ran out of GPU memory in step {', '.join(map(str, steps))}, before a "
                        "recorded step ended: the error is explained without a profile")
    return Analysis(summary=Summary(verdict="not-profiled", reason=reason), findings=findings)


def _rank_of(worker: str) -> int | None:
    from trainprof.trace.load import rank_in_name

    return rank_in_name(worker)


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
        infos = [_with_waits(result, cross, limits) for result in results]
        verdicts = {result.process: info.verdict.label for result, info in zip(results, infos, strict=True)}
        cross.ranks = [msgspec.structs.replace(row, verdict=verdicts.get(row.rank, row.verdict))
                       for row in cross.ranks]
    else:
        findings.extend(_slow_on_one_rank(summaries[0], limits))
    findings = hand_over_exposure(findings, limits)
    straggler = named_straggler(findings)
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


def _with_waits(result: TraceResult, cross: CrossRank, limits: Thresholds) -> TraceInfo:
    """A trace's `TraceInfo` with its verdict judged again on its rank's waits for later ranks as
    measured across ranks (`CrossRank.exposed_wait_ms`), which its own trace could not tell from
    transfers: that time is neither its GPU's work nor its communication's."""
    info = result.info
    waits = cross.exposed_wait_ms.get(result.process)
    if not waits or not any(waits.get(n, 0.0) > 0 for n in info.step_numbers) or info.verdict.idle is None:
        return info
    measured = CommWait(exposed_wait_ms_by_step=waits, undecided=[], best_link_pct=None)
    judged = verdict(result.steps, info.verdict.tiny_kernel_pct, limits, measured)
    judged = rejudged(judged, info.profiler, limits)
    if judged.label == info.verdict.label:
        return info
    return msgspec.structs.replace(info, verdict=judged)


def with_cross_rank(
    analysis: Analysis,
    process: int | str,
    cross: CrossRank,
    cross_findings: list[Finding],
    limits: Thresholds,
) -> Analysis:
    """One process's own analysis (a session's rank 0) with what the ranks' gathered summaries say
    across ranks: the cross-rank findings beside its own (its exposed communication handing its wait
    over to the straggler's finding), its verdict judged on its measured waits, the straggler as the
    headline verdict, and the cross-rank report."""
    infos = []
    for info in analysis.traces:
        numbers = set(info.step_numbers)
        steps = [step for step in analysis.steps if step.times.number in numbers]
        infos.append(_with_waits(TraceResult(process, steps, [], info), cross, limits))
    findings = hand_over_exposure(analysis.findings + cross_findings, limits)
    findings.sort(key=finding_order)
    straggler = named_straggler(findings)
    summary = analysis.summary
    verdict_by_trace = {**summary.verdict_by_trace, **{
        (f"rank {t.rank}" if t.rank is not None else t.worker): t.verdict.label for t in infos}}
    if straggler is not None:
        summary = msgspec.structs.replace(
            summary, verdict=f"straggler: rank {straggler.rank}", straggler_rank=straggler.rank,
            verdict_by_trace=verdict_by_trace)
    else:
        summary = msgspec.structs.replace(summary, verdict_by_trace=verdict_by_trace)
    return msgspec.structs.replace(
        analysis, summary=summary, findings=findings, traces=infos, ranks=cross.ranks, cross_rank=cross
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

    attribution = AttributionIndex(trace)  # nested once for the kernels' owners and the allocations'
    owners = attribute_kernels(timeline, attribution)
    costs = owner_costs(timeline, owners, tiny_kernels(timeline))
    launch_per_step, launch_totals = launch_stats(timeline, costs)
    labels = host_labels(timeline, limits)
    idle = idle_breakdown(timeline, limits, labels)
    peaks = peak_memory_per_step(timeline)
    memory = memory_profile(timeline, attribution)
    device = trace.device_properties[0] if trace.device_properties else {}
    device_memory = device.get("totalGlobalMem") if isinstance(device.get("totalGlobalMem"), int) else None
    saved = trace.memory_file  # the allocator's state the session captured (trace.memory_file)
    if device_memory is None and saved is not None and saved.device is not None:
        device_memory = saved.device.total_bytes
    tokens = step_tokens(timeline, memory.peak_step if memory is not None else None)
    room = headroom(memory, device_memory, tokens, limits)
    reserve = fragmentation(memory, device_memory, saved.window_state(trace.path.name) if saved else None,
                            saved.alloc_conf if saved else None)
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
    calls = collectives(timeline, compute) if len(timeline.comm) else []
    wait = (
        comm_wait(calls, lambda group: link_for(device_name, len(trace.device_properties), group),
                  limits.slow_collective_min_bytes, limits.slow_collective_link_share)
        if calls else None
    )
    trace_verdict = verdict(steps, tiny_pct, limits, wait)
    inference = is_inference(trace)
    session = recorded_by_session(trace)
    if trace_verdict.cause is not None:  # no training advice to a forward loop, no session options elsewhere
        fix = fix_for(trace_verdict.cause, inference, session)
        trace_verdict = msgspec.structs.replace(trace_verdict, fix=fix)
    busy = work = copies = None
    sites = []
    recompute = (None, None)
    if gpu_work:
        work = kernel_work(timeline, owners, device_peaks(trace))
        busy = busy_breakdown(timeline, work, costs, limits)
    # The recorded steps against the session's un-profiled ones: what the profiler's own cost did.
    cost = profiler_cost(trace, trace_verdict, steps, limits, busy)
    trace_verdict = rejudged(trace_verdict, cost, limits)
    # A host that ran ahead of the GPU: its windows are not the steps; the GPU's step judges.
    trace_verdict = ahead_rejudged(trace_verdict, busy, limits)
    # The one step every rule below judges against (and the headline shows), made once.
    basis = step_basis(trace_verdict, busy, cost)
    # Without un-profiled steps to judge on, what the profiler's own host cost could have made.
    estimate = profiler_host_estimate(timeline, trace_verdict, limits) if cost is None and gpu_work else None
    findings = sync_findings(points, n, trace.rank, basis, limits, inference)
    if gpu_work:
        busy = unprofiled_mfu(busy, cost)
        swap, swapped = swap_prediction(timeline, owners, work)
        # Gains are predicted from the judged step: the un-profiled one where the profiler slowed
        # the recorded ones, else the GPU's (`work.step_ms` itself).
        judged = work if basis.judged_by == "gpu" else msgspec.structs.replace(work, step_ms=basis.judged_ms)
        copies = copy_kernels(trace, work, owners)
        sites = attention_sites(trace, work, owners)
        known_peaks = [p for p in peaks if p is not None]
        recompute = recomputation(trace, work, owners, max(known_peaks) if known_peaks else None, limits)
        findings.extend(
            busy_findings(
                trace, judged, busy, swap, swapped, costs, trace.rank, limits, copies, sites, recompute
            )
        )
    compiled = compile_stats(timeline, work, owners)
    recompiling = compiled is not None and compiled.recompiles_every_step
    # A recompile's GPU idle is warm-up idle: its own finding holds it, not the generic warm-up one.
    explained = {Cause.WARMUP: compiled.compile_gpu_idle_ms_per_step * n} if recompiling else None
    blocked = any(s.idle is not None and s.idle.costs[Cause.BLOCKING] > 0 for s in steps)
    allocator = allocator_calls(timeline) if blocked else None
    named_host = host_work(timeline, idle.host_functions, limits) if idle.host_functions else None
    findings.extend(idle_findings(trace_verdict, idle, steps, trace.rank, limits, explained, allocator,
                                  inference, session, named_host, basis=basis))
    findings.extend(compile_findings(compiled, timeline, basis, trace.rank, limits))
    for maybe in (
        launch_finding(trace_verdict, launch_totals, steps, trace.rank, basis, limits, recompiling,
                       inference),
        top_kernels_finding(timeline, trace.rank, owners.launch_op),
        module_costs_finding(costs, trace.rank),
        memory_finding(memory, basis, trace.rank, limits, device_memory, inference),
        fragmentation_finding(reserve, basis, trace.rank, limits),
        cpu_only_finding(timeline, times, trace.rank),
        slowdown_finding(cost, n, trace.rank),
    ):
        if maybe is not None:
            findings.append(maybe)
    error = saved.out_of_memory_after(trace.path.name) if saved is not None else None
    if error is not None:  # the loop ran out of memory after this window: it explains the error
        world = (trace.distributed_info or {}).get("world_size")
        findings.append(out_of_memory_finding(error, memory, room, tokens, reserve, trace.rank,
                                              world if type(world) is int else None))
    comm = _communication(timeline, steps, calls, trace_verdict, basis, findings, device_name, limits)
    if gpu_work and (comm is not None and comm.framework == "FSDP2" or comm is None and _is_fsdp2(trace)):
        fsdp = fsdp_host_finding(timeline, calls, basis, trace.rank, limits)
        if fsdp is not None:
            findings.append(fsdp)
    # Ranks are compared on it (`distributed`): only a trace of a rank, or one that communicates.
    compared = rank_work(timeline, compute, gpu_work, labels) if trace.rank is not None or comm else None
    known_peaks = [p for p in peaks if p is not None]
    drawn = None
    if views:  # imported here: an analysis without views (`trainprof analyze`) never loads them
        from trainprof.analysis.views import trace_views

        drawn = trace_views(timeline, owners, idle.pieces if gpu_work else None, points, work,
                            host_index=None if gpu_work else attribution)
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
        step_basis=basis,
        work=compared,
        profiler_estimate=estimate,
        headroom=room,
        fragmentation=reserve,
        memory_history=history_view(saved.history_of(trace.path.name)) if saved is not None else None,
        copies=copies.breakdown if copies is not None else None,
        attention=sites,
        recompute=recompute[0],
    )
    return steps, findings, info


def _communication(
    timeline: Timeline,
    steps: list[Step],
    calls: list[Collective],
    trace_verdict: Verdict,
    basis: StepBasis,
    findings: list[Finding],
    device: str | None,
    limits: Thresholds,
) -> CommTotals | None:
    """The trace's `CommTotals` (None without communication); its communication findings are
    appended to `findings`: exposed communication, gradients synced on every micro-batch."""
    if not len(timeline.comm):
        return None
    trace = timeline.trace
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
    comm_bound = trace_verdict.label == "communication-bound"
    for maybe in (
        exposed_comm_finding(comm, basis, comm_bound, trace.rank, len(steps), limits),
        no_sync_finding(timeline, calls, framework, basis, trace.rank, limits),
    ):
        if maybe is not None:
            findings.append(maybe)
    return comm


def _is_fsdp2(trace: Trace) -> bool:
    """Whether FSDP2 ran in the trace (its ranges), with or without communication (one rank)."""
    framework = framework_of(trace)
    return framework is not None and framework.name == "FSDP2"


def _summary(
    steps: list[Step], traces: list[TraceInfo], straggler: Finding | None, limits: Thresholds
) -> Summary:
    n = max(len(steps), 1)
    total_ms = sum(s.times.duration_ms for s in steps)
    verdicts = [t.verdict.label for t in traces]
    # A rank that waits for another is not what bounds the job: the rank it waits for is.
    bounding = [label for label in verdicts if label != WAIT_VERDICT] or verdicts
    if straggler is not None:
        headline = f"straggler: rank {straggler.rank}"
    else:
        headline = max(sorted(set(bounding)), key=bounding.count) if bounding else "unknown"
    peaks = [t.peak_memory_bytes for t in traces if t.peak_memory_bytes is not None]
    comm_ms = sum(s.times.comm_ms for s in steps)
    exposed_ms = sum(s.comm.comm_exposed_ms for s in steps if s.comm is not None)
    communicates = any(t.comm is not None for t in traces)
    busy = [(t.busy, len(t.step_numbers)) for t in traces if t.busy is not None]
    idle_ms = _idle_ms_per_step(steps)
    mean_step_ms = numpy_round(total_ms / n, 4)
    shares = {
        # Time-weighted: the union of GPU busy time over the total step time, not a mean of per-step %.
        "gpu_busy_pct": numpy_round(100.0 * sum(s.times.gpu_busy_ms for s in steps) / total_ms, 2)
        if total_ms > 0 else 0.0,
        "idle_step_pct": {cause: round(100.0 * ms / mean_step_ms, 4) for cause, ms in idle_ms.items()}
        if mean_step_ms else {},
        **_ahead_shares(traces, idle_ms),
    }
    return Summary(
        verdict=headline,
        verdict_by_trace={
            (f"rank {t.rank}" if t.rank is not None else t.worker): label
            for t, label in zip(traces, verdicts, strict=True)
        },
        mean_step_ms=mean_step_ms,
        **shares,
        syncs_per_step=round(sum(s.syncs.count for s in steps) / n, 3),
        kernels_per_step=round(sum(s.times.kernel_count for s in steps) / n, 1),
        peak_memory_bytes=max(peaks) if peaks else None,
        straggler_rank=straggler.rank if straggler is not None else None,
        comm_ms_per_step=round(comm_ms / n, 4) if communicates else None,
        comm_exposed_ms_per_step=round(exposed_ms / n, 4) if communicates else None,
        comm_hidden_pct=round(100 * (1 - exposed_ms / comm_ms), 2) if communicates and comm_ms > 0 else None,
        thresholds_overridden=limits.overridden(),
        idle_ms_per_step=idle_ms,
        **_busy_summary(busy),
        **_unprofiled_summary(traces),
        verdict_caveat=None if straggler is not None else verdict_caveat(
            [t.profiler_estimate for t in traces if t.profiler_estimate is not None]),
        **_judged_step(traces),
        one_off_left_out_pct=_one_off_left_out_pct(steps, total_ms, limits),
    )


def _ahead_shares(traces: list[TraceInfo], idle_ms: dict[str, float]) -> dict:
    """Where every trace's host ran ahead of its GPU (`StepBasis.gpu_step_idle_ms`): `gpu_busy_pct`
    and `idle_step_pct` over the GPU's steps, not over the host's windows (which hold earlier steps'
    GPU work, or none: `host_ahead`), each cause's idle cut to what the GPU's steps hold; else
    empty (the windows' shares stand)."""
    ahead = [t for t in traces if t.step_numbers]
    if not ahead or any(t.busy is None or t.step_basis is None or t.step_basis.gpu_step_idle_ms is None
                        for t in ahead):
        return {}
    spans = [(gpu_step(t.busy), len(t.step_numbers), t.step_basis.idle_kept) for t in ahead]
    span_ms = sum(span * n for (span, _), n, _ in spans)
    work_ms = sum(work * n for (_, work), n, _ in spans)
    steps = sum(n for _, n, _ in spans)
    if span_ms <= 0:
        return {}
    kept = sum(k * n for _, n, k in spans) / steps
    step_ms = span_ms / steps
    return {
        "gpu_busy_pct": numpy_round(100.0 * work_ms / span_ms, 2),
        "idle_step_pct": {cause: round(100.0 * ms * kept / step_ms, 4) for cause, ms in idle_ms.items()},
    }


def _judged_step(traces: list[TraceInfo]) -> dict:
    """`Summary.judged_step_ms` (the traces' `StepBasis.judged_ms`, weighted by steps) and
    `judged_step_basis` (that of most steps), as `Summary` fields; empty without steps."""
    judged = [(t.step_basis, len(t.step_numbers)) for t in traces
              if t.step_basis is not None and t.step_numbers]
    steps = sum(n for _, n in judged)
    if not steps:
        return {}
    by_basis: dict[str, int] = {}
    for basis, n in judged:
        by_basis[basis.judged_by] = by_basis.get(basis.judged_by, 0) + n
    return {
        "judged_step_ms": round(sum(basis.judged_ms * n for basis, n in judged) / steps, 4),
        "judged_step_basis": max(sorted(by_basis), key=by_basis.__getitem__),
    }


def _one_off_left_out_pct(steps: list[Step], total_ms: float, limits: Thresholds) -> float | None:
    """`Summary.one_off_left_out_pct`: the one-off GPU-idle time over the recorded steps' time, from
    `one_off_named_share` on."""
    one_off_ms = sum(s.idle.one_off_ms for s in steps if s.idle is not None)
    share = one_off_ms / total_ms if total_ms > 0 else 0.0
    return round(100.0 * share, 2) if share >= limits.one_off_named_share else None


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
    """The un-profiled step, how much longer the recorded steps are and the recorded GPU busy time
    over it (at most 100%), over the traces that know it (weighted by their steps), as `Summary`
    fields; empty when none does."""
    known = [(t.profiler, len(t.step_numbers)) for t in traces if t.profiler is not None]
    steps = sum(n for _, n in known)
    if not steps:
        return {}
    unprofiled = sum(cost.unprofiled_step_ms * n for cost, n in known) / steps
    recorded = sum(cost.recorded_step_ms * n for cost, n in known) / steps
    busy = sum(cost.gpu_busy_ms_per_step * n for cost, n in known) / steps
    return {
        "unprofiled_step_ms": round(unprofiled, 4),
        "profiler_slowdown_pct": round(100.0 * (recorded / unprofiled - 1.0), 2),
        "unprofiled_gpu_busy_pct": round(min(100.0, 100.0 * busy / round(unprofiled, 4)), 2),
    }


def _busy_summary(busy: list[tuple[BusyBreakdown, int]]) -> dict:
    """The headline's GPU step time, MFU against the datasheet and the achievable peaks (and the
    share of the compute time whose FLOPs it counts) and peaks source over the traces
    (time-weighted), as `Summary` fields; empty without GPU work."""
    if not busy:
        return {}
    total_ms = sum(b.step_ms * n for b, n in busy)

    def weighted(value_of) -> float | None:
        known = [(value_of(b), b.step_ms * n) for b, n in busy if value_of(b) is not None]
        weight = sum(w for _, w in known)
        return round(sum(v * w for v, w in known) / weight, 2) if weight else None

    dtypes = [b.mfu_dtype for b, _ in busy if b.mfu_dtype is not None]
    dtype = max(sorted(set(dtypes)), key=dtypes.count) if dtypes else None
    of_dtype = [b for b, _ in busy if b.mfu_dtype == dtype and dtype is not None]
    peaks = [b.peaks for b, _ in busy if b.peaks is not None]
    sources = [p.label for p in peaks]
    labels = [p.short_label for p in peaks]
    return {
        "gpu_step_ms": numpy_round(total_ms / max(sum(n for _, n in busy), 1), 4),
        "mfu_pct": weighted(lambda b: b.mfu_pct),
        "mfu_achievable_pct": weighted(lambda b: b.mfu_achievable_pct),
        "mfu_dtype": dtype,
        "mfu_peak_tflops": next((b.mfu_peak_tflops for b in of_dtype if b.mfu_peak_tflops), None),
        "mfu_achievable_tflops": max((b.mfu_achievable_tflops or 0.0 for b in of_dtype), default=0.0) or None,
        "mfu_flops_known_pct": weighted(lambda b: b.flops_known_pct),
        "peaks_source": max(sorted(set(sources)), key=sources.count) if sources else None,
        "peaks_label": max(sorted(set(labels)), key=labels.count) if labels else None,
    }
