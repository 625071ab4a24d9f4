"""torch.compile's health: how much of the model's GPU work it compiled, does it recompile in the
steady state, and where does the graph break?

What a trace shows of torch.compile, with Python stacks or without:
- compiling: Dynamo's `dynamo_timed` ranges (`dynamo`, `entire_frame_compile`, `<phase> (dynamo_timed)`,
  `entire_backward_compile` on autograd's thread; `causes.COMPILE_FRAMES`) and annotations
  `<phase>_data: compile_id=F/C`: frame F's compilation number C (C > 0 is a recompile);
- running compiled code: a `Torch-Compiled Region: F/C` op per call of a compiled frame. A graph break
  splits a function into several frames; with stacks, Dynamo's resume functions
  (`torch_dynamo_resume_in_<function>_at_<line>`) name where each break is.

How much it compiled: a kernel launched inside a compiled region (`Torch-Compiled Region`, or the
backward of a compiled graph, `CompiledFunctionBackward`) is compiled work; the other forward and
backward kernels ran eagerly. A model wrapped in torch.compile (`nn.Module: OptimizedModule_i`, or
Dynamo's `compile_wrapper` frame, with stacks; Dynamo's frame counters, live) whose steps run no
compiled region compiled nothing: Dynamo gave up on its forward (an unsupported construct, an error
with `suppress_errors`) and every call runs eagerly behind the wrapper. What compiling the eager
part would win at least: its memory-bound kernels' time above their bytes at the achievable copy
bandwidth (`eager_fusible_ms_per_step`; Inductor fuses those chains, which saves bytes as well).

A step that compiles every time (a new shape each step under `dynamic=False`) pays a whole compile
per step, GPU idle meanwhile: it is not a one-off warm-up, CUDA graphs do not help it, and the fix is
to stop the recompiles (`dynamic=True`, `torch._dynamo.mark_dynamic`, padding to fixed lengths). The
`recompile` finding says so with the compile time per step; its GPU-idle time is the warm-up idle the
generic warm-up finding would otherwise claim. The live count of graph breaks comes from Dynamo's
counters when the session captured them (`Trace.compile_counters`).
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.attribution import BACKWARD, FORWARD, KernelOwners, UserFrames
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.causes import COMPILE_FRAMES
from trainprof.analysis.frames import parse_py_frame
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.kernel_classes import KernelClass, Work
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import COMPILE_IDS_IN_TITLE, GRAPH_BREAK_SITES_KEPT, Thresholds
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import nearest_marked

# Pattern sources (with `causes.COMPILE_FRAMES`), compiled where used, past the check that a trace
# shows torch.compile at all: most traces never compile them.
_REGION = r"^Torch-Compiled Region: (\d+)/(\d+)$"
_COMPILE_ID = r"compile_id=(\d+)/(\d+)"
_RESUME = r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$"
_WRAPPED = r"^nn\.Module: OptimizedModule_\d+$|^torch/_dynamo/eval_frame\.py\(\d+\): compile_wrapper$"
_COMPILED_OPS = ("autograd::engine::evaluate_function: CompiledFunctionBackward", "CompiledFunctionBackward")
# Names only torch.compile's work has (Dynamo's frames show in any trace with stacks: the optimizer's
# step runs under `torch/_dynamo/eval_frame.py`).
_MARKERS = (
    "Torch-Compiled Region", "(dynamo_timed)", "entire_frame_compile", "entire_backward_compile",
    "compile_id=", "torch_dynamo_resume_in_", "OptimizedModule", "compile_wrapper",
)


class CompileStats(Record, frozen=True):
    """torch.compile in a trace's profiled steps (`TraceInfo.compile`; None without torch.compile).

    `compile_ms_per_step`: time inside compile ranges (any thread, their union), mean over the steps;
    `compile_gpu_idle_ms_per_step`: the GPU idle within them; `steps_compiling`: steps with any;
    `recompiles_every_step`: compiling goes on in the steady state (at least two profiled steps, or
    every one of them with a recompile id); `compile_ids`: the `F/C` ids compiled inside the steps;
    `compiled_regions_per_step`: calls of compiled frames (`Torch-Compiled Region`) per step;
    `compiled_frames`: their distinct frame ids F; `graph_breaks`: Dynamo's count (the session's live
    counters), else the distinct resume functions seen, None when neither is known;
    `graph_break_sites`: `function line N` of each resume function (where a break resumes);
    `graph_break_reasons`: Dynamo's reasons with their counts (live counters only);
    `eager_gap_gpu_idle_ms_per_step`: the GPU idle between consecutive compiled regions of a step
    (the eager code a break leaves between them).
    `wrapped_calls_per_step`: calls of a torch.compile wrapper (with stacks); `compiled_gpu_ms_per_step`
    and `eager_gpu_ms_per_step`: the forward and backward kernels' time inside compiled regions and
    outside them (None without the kernels' owners); `eager_fusible_ms_per_step`: the eager
    memory-bound kernels' time above their bytes at the achievable copy bandwidth; `frames_total`,
    `frames_compiled`, `unique_graphs`: Dynamo's counters (the session's live ones; None otherwise).
    """

    compile_ms_per_step: float
    compile_gpu_idle_ms_per_step: float
    steps_compiling: int
    recompiles_every_step: bool
    compile_ids: list[str]
    compiled_regions_per_step: float
    compiled_frames: list[int]
    graph_breaks: int | None
    graph_break_sites: list[str]
    graph_break_reasons: dict[str, int]
    eager_gap_gpu_idle_ms_per_step: float
    wrapped_calls_per_step: float = 0.0
    compiled_gpu_ms_per_step: float | None = None
    eager_gpu_ms_per_step: float | None = None
    eager_fusible_ms_per_step: float | None = None
    frames_total: int | None = None
    frames_compiled: int | None = None
    unique_graphs: int | None = None

    @property
    def compiled_share(self) -> float | None:
        """The compiled share of the model's GPU work (None where unknown)."""
        total = (self.compiled_gpu_ms_per_step or 0.0) + (self.eager_gpu_ms_per_step or 0.0)
        if self.compiled_gpu_ms_per_step is None or not total:
            return None
        return self.compiled_gpu_ms_per_step / total


def compile_stats(timeline: Timeline, work: KernelWork | None = None,
                  owners: KernelOwners | None = None) -> CompileStats | None:
    """What the trace shows of torch.compile (module docstring); None when it shows none. `work` and
    `owners` (the kernels' classes and owners) give the compiled and eager shares."""
    trace = timeline.trace
    text = "\n".join(trace.names)  # one scan decides for the traces without torch.compile
    live = trace.compile_counters
    if not live and not any(marker in text for marker in _MARKERS):
        return None
    steps = timeline.steps
    n = max(len(steps), 1)
    step_start = np.array([w.start_us for w in steps])
    step_end = np.array([w.end_us for w in steps])

    names = trace.names
    is_compile = _compile_names(trace)
    tagged = trace.names_matching(lambda name: "compile_id=" in name or name.startswith("Torch-Compiled"))
    starts, ends = [], []
    ids: dict[str, float] = {}  # compile id -> when it first shows
    region_rows: list[tuple[float, float, int, int]] = []  # start, end, thread, frame id
    for category in ("cpu_op", "user_annotation"):
        table = trace.events[category]
        starts.append(table.start_us[is_compile[table.name]])
        ends.append(table.end_us[is_compile[table.name]])
        for row in np.flatnonzero(tagged[table.name]).tolist():
            name = names[int(table.name[row])]
            region = re.match(_REGION, name)
            if region is not None:
                region_rows.append((float(table.start_us[row]), float(table.end_us[row]),
                                    int(table.thread[row]), int(region.group(1))))
            elif (found := re.search(_COMPILE_ID, name)) is not None:
                ids.setdefault(f"{found.group(1)}/{found.group(2)}", float(table.start_us[row]))
    compile_starts, compile_ends = np.concatenate(starts), np.concatenate(ends)
    in_steps = timeline.step_of(compile_starts) >= 0
    compiling = Coverage(compile_starts[in_steps], compile_ends[in_steps])
    compile_ms = compiling.covered(step_start, step_end) / 1e3
    idle_ms = _idle_within(timeline, compiling.starts, compiling.ends)
    steps_compiling = int((compile_ms > 0).sum())

    id_in_step = timeline.step_of(np.array(list(ids.values()))) >= 0 if ids else np.zeros(0, bool)
    step_ids = [key for key, inside in zip(ids, id_in_step.tolist(), strict=True) if inside]
    recompile_id = any(int(key.split("/")[1]) > 0 for key in step_ids)
    every_step = steps_compiling == len(steps) and steps_compiling > 0
    recompiles = steps_compiling >= 2 or (every_step and recompile_id)

    region_in_step = (
        timeline.step_of(np.array([r[0] for r in region_rows])) >= 0 if region_rows else np.zeros(0, bool)
    )
    regions = [r for r, inside in zip(region_rows, region_in_step, strict=True) if inside]
    sites = _resume_sites(trace)
    reasons = dict(live.get("graph_break", {})) if live else {}
    if live and "graph_breaks" in live:
        breaks: int | None = int(live["graph_breaks"])
    else:
        breaks = len(sites) if sites else None
    wrapped = _wrapped_calls(timeline)
    frames_total = _live_count(live, "frames_total")
    if not regions and steps_compiling == 0 and not breaks and not wrapped and not frames_total:
        return None
    compiled_ms, eager_ms, fusible_ms = _coverage(timeline, work, owners) if work is not None else (None,) * 3
    return CompileStats(
        compile_ms_per_step=round(float(compile_ms.sum()) / n, 4),
        compile_gpu_idle_ms_per_step=round(idle_ms / n, 4),
        steps_compiling=steps_compiling,
        recompiles_every_step=recompiles,
        compile_ids=sorted(step_ids, key=lambda key: tuple(int(x) for x in key.split("/"))),
        compiled_regions_per_step=round(len(regions) / n, 2),
        compiled_frames=sorted({r[3] for r in regions}),
        graph_breaks=breaks,
        graph_break_sites=sites[:GRAPH_BREAK_SITES_KEPT],
        graph_break_reasons=reasons,
        eager_gap_gpu_idle_ms_per_step=round(_eager_gaps_idle(timeline, regions) / n, 4),
        wrapped_calls_per_step=round(wrapped / n, 2),
        compiled_gpu_ms_per_step=compiled_ms,
        eager_gpu_ms_per_step=eager_ms,
        eager_fusible_ms_per_step=fusible_ms,
        frames_total=frames_total,
        frames_compiled=_live_count(live, "frames_ok"),
        unique_graphs=_live_count(live, "unique_graphs"),
    )


def _live_count(live: dict | None, key: str) -> int | None:
    value = (live or {}).get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _wrapped_calls(timeline: Timeline) -> int:
    """Calls of a torch.compile wrapper inside the steps (`OptimizedModule`'s frame, Dynamo's
    `compile_wrapper`): a trace with stacks shows them whether or not anything compiled."""
    python = timeline.trace.events["python_function"]
    if not len(python):
        return 0
    wrapper = re.compile(_WRAPPED)
    marked = timeline.trace.names_matching(lambda name: wrapper.match(name) is not None)[python.name]
    return int((timeline.step_of(python.start_us[marked]) >= 0).sum()) if marked.any() else 0


def _coverage(
    timeline: Timeline, work: KernelWork, owners: KernelOwners | None
) -> tuple[float | None, float | None, float | None]:
    """GPU ms per step of the forward and backward kernels inside compiled regions and outside, and
    the eager memory-bound kernels' time above their bytes at the achievable copy bandwidth."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if owners is None or not len(owners.op_parent) or not len(work.rows):
        return None, None, None
    region = re.compile(_REGION)
    marked = trace.names_matching(lambda name: region.match(name) is not None or name in _COMPILED_OPS)
    inside = nearest_marked(owners.op_parent, marked[ops.name])
    compiled = np.where(work.op >= 0, inside[np.clip(work.op, 0, None)], -1) >= 0
    model = (work.phase == FORWARD) | (work.phase == BACKWARD)
    eager = model & ~compiled
    copy = work.peaks.bytes_per_s if work.peaks is not None else None
    fusible = None
    if copy:
        memory = eager & work.of_class(KernelClass.NORM, KernelClass.ELEMENTWISE, KernelClass.REDUCTION,
                                       KernelClass.COPY) & work.carries(Work.BYTES)
        floor = np.minimum(work.bytes[memory] / copy * 1e6, work.dur_us[memory])
        fusible = round(float((work.dur_us[memory] - floor).sum()) / 1e3 / max(work.steps, 1), 4)
    return round(work.per_step_ms(model & compiled), 4), round(work.per_step_ms(eager), 4), fusible


def _idle_within(timeline: Timeline, starts: np.ndarray, ends: np.ndarray) -> float:
    """GPU idle ms inside the (disjoint) intervals [starts, ends)."""
    if not len(starts):
        return 0.0
    busy = timeline.gpu_busy.covered(starts, ends)
    return float(((ends - starts) - busy).sum()) / 1e3


def _eager_gaps_idle(timeline: Timeline, regions: list[tuple[float, float, int, int]]) -> float:
    """GPU idle ms between consecutive compiled regions of one thread inside one step."""
    if len(regions) < 2:
        return 0.0
    rows = np.array(sorted(regions, key=lambda r: (r[2], r[0])))
    start, end, thread = rows[:, 0], rows[:, 1], rows[:, 2]
    step = timeline.step_of(start)
    same = (thread[1:] == thread[:-1]) & (step[1:] == step[:-1]) & (start[1:] > end[:-1])
    return _idle_within(timeline, end[:-1][same], start[1:][same])


def _compile_names(trace) -> np.ndarray:
    """Per name of the trace: is it a frame of torch.compile's work (`COMPILE_FRAMES`)?"""
    compile_frame = re.compile(COMPILE_FRAMES)
    return trace.names_matching(lambda name: compile_frame.search(name) is not None)


def _resume_sites(trace) -> list[str]:
    """`file:N function` of each graph break: Dynamo's resume functions among the trace's Python
    frames (`torch_dynamo_resume_in_<function>_at_<N>`, in the file of the function it broke), in
    name order."""
    python = trace.events["python_function"]
    if not len(python):
        return []
    sites = set()
    resume = re.compile(_RESUME)
    for name_id in distinct(python.name).tolist():
        name = trace.names[name_id]
        found = resume.search(name)
        if found is not None:
            frame = parse_py_frame(name)
            where = f"{frame.file}:{found.group(2)}" if frame is not None else f"line {found.group(2)}"
            sites.add(f"{where} {found.group(1)}")
    return sorted(sites)


RECOMPILE_FIX = (
    "Stop the recompiles: compile with dynamic=True, or mark the dimension that changes as dynamic "
    "before the call (torch._dynamo.mark_dynamic(x, dim)), or pad inputs to a few fixed lengths "
    "(bucketing). TORCH_LOGS=recompiles prints the guard that failed at each recompile."
)
GRAPH_BREAK_FIX = (
    "Remove the graph breaks: torch._dynamo.explain(fn)(*inputs) lists each with its reason (data-"
    "dependent control flow, .item()/.tolist(), print, unsupported calls); rewrite them with torch ops "
    "(torch.where, torch.cond) or move them out of the compiled function. torch.compile(fullgraph=True) "
    "turns each break into an error that names it."
)


COVERAGE_FIX = (
    "Find why Dynamo leaves the model eager: TORCH_LOGS=graph_breaks,recompiles (or "
    "torch._dynamo.explain(model)(*inputs)) names each break and each frame it skipped; "
    "torch.compile(model, fullgraph=True) turns the first into an error with its reason. Move what it "
    "cannot trace (Python-side data structures, .item(), print, unsupported calls) out of the forward, "
    "or compile the submodules that trace (for block in model.layers: block.compile())."
)


def compile_findings(
    stats: CompileStats | None, timeline: Timeline, basis: StepBasis, rank: int | None, thresholds: Thresholds
) -> list[Finding]:
    """The `compile_coverage` finding when torch.compile compiled little or nothing of the model's
    GPU work, the `recompile` finding when compiling goes on in the steady state, and the
    `graph_breaks` finding when breaks are known; severity from the GPU time each costs per step
    (the GPU idle of the last two, as much of it as an un-profiled step keeps) against the trace's
    judged step (`basis`)."""
    if stats is None:
        return []
    findings = []
    n = max(len(timeline.steps), 1)
    coverage = _coverage_finding(stats, timeline, basis.judged_ms, rank, thresholds)
    if coverage is not None:
        findings.append(coverage)
    if stats.recompiles_every_step:
        pct = 100.0 * stats.compile_ms_per_step / max(basis.window_ms, 1e-9)
        idle_ms = basis.idle_gain(stats.compile_gpu_idle_ms_per_step)
        findings.append(
            Finding(
                kind="recompile",
                title=f"torch.compile recompiles in {stats.steps_compiling} of {n} steps: "
                f"{stats.compile_ms_per_step:.1f} ms/step compiling ({pct:.0f}% of the step), the GPU idle "
                f"{stats.compile_gpu_idle_ms_per_step:.1f} ms/step meanwhile"
                + _compilations(stats.compile_ids) + basis.idle_note(stats.compile_gpu_idle_ms_per_step),
                severity=severity_for(idle_ms, basis.judged_ms, thresholds),
                op=None,
                where=_compile_site(timeline),
                count=stats.steps_compiling,
                per_step=round(stats.steps_compiling / n, 3),
                cost_ms=round(stats.compile_ms_per_step * n, 4),
                fix=RECOMPILE_FIX,
                rank=rank,
                cause="a new compilation in every step (a shape or guard that changes each step)",
                gpu_ms_per_step=idle_ms,
                details=stats,
            )
        )
    if stats.graph_breaks:
        where = ", ".join(stats.graph_break_sites) or "TORCH_LOGS=graph_breaks names the sites"
        gap_ms = stats.eager_gap_gpu_idle_ms_per_step
        gain = basis.idle_gain(gap_ms)
        findings.append(
            Finding(
                kind="graph_breaks",
                title=f"torch.compile graph breaks: {stats.graph_breaks} ({where}); "
                f"{stats.compiled_regions_per_step:g} compiled regions per step with the GPU idle "
                f"{gap_ms:.2f} ms/step in the eager code between them" + basis.idle_note(gap_ms),
                severity=severity_for(gain, basis.judged_ms, thresholds),
                op=None,
                where=Where(),
                count=stats.graph_breaks,
                per_step=stats.compiled_regions_per_step,
                cost_ms=round(gap_ms * n, 4),
                fix=GRAPH_BREAK_FIX,
                rank=rank,
                cause="code Dynamo cannot trace splits the compiled function; the pieces between run eagerly",
                gpu_ms_per_step=gain,
                details=stats,
            )
        )
    return findings


def _coverage_finding(
    stats: CompileStats, timeline: Timeline, step_ms: float, rank: int | None, thresholds: Thresholds
) -> Finding | None:
    """torch.compile wraps the model but compiled none (or little) of its GPU work: at stake, what
    fusing the eager memory-bound kernels would win at least (`eager_fusible_ms_per_step`)."""
    share = stats.compiled_share
    nothing = stats.compiled_regions_per_step == 0 and (
        stats.wrapped_calls_per_step > 0 or (stats.frames_total and not stats.frames_compiled)
    )
    if not nothing and (share is None or share >= thresholds.compile_min_compiled_share):
        return None
    eager = stats.eager_gpu_ms_per_step or 0.0
    gain = stats.eager_fusible_ms_per_step or 0.0
    n = max(len(timeline.steps), 1)
    live = (
        f"; Dynamo compiled {stats.frames_compiled} of the {stats.frames_total} frames it tried"
        if stats.frames_total else ""
    )
    what = (
        "compiled nothing: no compiled region ran"
        if nothing
        else f"compiled {100 * (share or 0):.0f}% of the model's GPU work"
    )
    return Finding(
        kind="compile_coverage",
        title=f"torch.compile {what}; {eager:.1f} ms/step of forward and backward kernels ran eagerly{live}"
        + (f" (fusing their memory-bound kernels would win at least {gain:.1f} ms/step)" if gain else ""),
        severity=severity_for(gain, step_ms, thresholds),
        op=None,
        where=_compile_site(timeline),
        count=int(round(stats.wrapped_calls_per_step * n)),
        per_step=stats.wrapped_calls_per_step,
        cost_ms=round(eager * n, 4),
        fix=COVERAGE_FIX,
        rank=rank,
        cause="Dynamo could not trace the forward (or most of it): the wrapper runs the eager model",
        gpu_ms_per_step=round(gain, 4),
        details=stats,
    )


def _compilations(compile_ids: list[str]) -> str:
    """` (compile ids 0/15, 0/16: frame 0 compiled for the 16th and 17th time)`, or '' without ids."""
    if not compile_ids:
        return ""
    shown = compile_ids[:COMPILE_IDS_IN_TITLE]
    frames = {key.split("/")[0] for key in shown}
    listed = ", ".join(shown) + (", ..." if len(compile_ids) > len(shown) else "")
    if len(frames) > 1:
        return f" (compile ids {listed}: frame/compilation)"
    times = " and ".join(_ordinal(int(key.split("/")[1]) + 1) for key in shown)
    return f" (compile ids {listed}: frame {frames.pop()} compiled for the {times} time)"


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _compile_site(timeline: Timeline) -> Where:
    """The innermost user frame around the first compile range on the loop's thread (stacks only)."""
    trace = timeline.trace
    thread = timeline.main_thread
    if thread is None or not len(trace.events["python_function"]):
        return Where()
    table = trace.events["cpu_op"]
    compiling = _compile_names(trace)[table.name]
    rows = np.flatnonzero(compiling & (table.thread == thread) & (timeline.step_of(table.start_us) >= 0))
    if not len(rows):
        return Where()
    first = rows[:1]
    frame = UserFrames(trace).innermost(table.thread[first].astype(np.int64), table.start_us[first],
                                        table.end_us[first])[0]
    return Where(file=frame.file, line=frame.line, function=frame.function) if frame else Where()
