"""Question 2: where does the CPU wait for the GPU (sync points), why, how long, and from which line.

A sync point is one synchronizing operation as the user wrote it: the runtime calls that block the
host (stream/device/event synchronize, a copy device-to-host or from pageable host memory; CUDA and
HIP names alike, see `runtime_calls`) grouped by their innermost enclosing `cpu_op`, so `.item()`
(a D2H copy plus a stream synchronize inside `aten::_local_scalar_dense`) counts once.
Not sync points: device-to-device copies, host-to-device copies from pinned memory that do not
wait, and the profiler's own `cudaDeviceSynchronize` when it stops (torch/profiler frames, or
outside every step).

Each sync point carries three answers, all from the trace (no live capture needed):
- `where`: the innermost user frame (`trainprof.user_code`, with the run's recorded layout);
- `cause`: what in the code synchronizes, named from the frames between the user frame and the op
  (`<built-in function print>`, `<built-in method tolist ...>`, `aten::is_nonzero` for `bool()`,
  the GPU copy's kind, ...): the `CAUSE_RULES` table, first match wins;
- `via`: the innermost library frame that made the call, or the known framework site of
  `trainprof/catalog/sync_sites.json` when one matches (its fix replaces the cause's generic fix).
Findings group sync points by (cause, via, where), so distinct causes behind one user line
(`trainer.train()`) are distinct findings. A sync's cost to the GPU is not the time the host blocks
(the GPU is busy meanwhile) but the idle it causes: the queue drains while the host waits, then
refills after (`SyncPoint.gpu_cost_us`); severity follows that (`trainprof.analysis.severity`). Sync
points inside a library warm-up or a torch.compile compilation (cuDNN's algorithm search, Triton's
autotuning) belong to that warm-up's finding, not to one of their own (`SyncPoint.in_warmup`).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct, numpy_round
from trainprof.analysis.causes import FRAME_RULES, WARMUP_OPS, Cause
from trainprof.analysis.frames import CallContext, PyFrame, call_context, is_profiler_file, parse_py_frame
from trainprof.analysis.records import Finding, Record, Via, Where
from trainprof.analysis.runtime_calls import KINDS, call_kind, is_blocking_copy
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import Timeline
from trainprof.catalog import CatalogSite, match_sync_site
from trainprof.trace.model import FRAME_CATEGORIES
from trainprof.user_code import CodeLayout, is_user_file, library_of


class SyncCause(msgspec.Struct, frozen=True):
    """A concrete reason a sync happens: how to say it, and the generic way to remove it (in an
    inference loop, `inference_fix` where that differs: no DataLoader, no training loop)."""

    words: str
    fix: str
    inference_fix: str | None = None


# The causes a sync point can have. `words` completes "The CPU waits for the GPU: ...".
CAUSES: dict[str, SyncCause] = {
    "device_synchronize": SyncCause(
        "an explicit torch.cuda.synchronize()",
        "Remove torch.cuda.synchronize() from the training loop (time with CUDA events instead).",
        "Remove torch.cuda.synchronize() from the serving loop (time with CUDA events instead).",
    ),
    "event_synchronize": SyncCause(
        "an explicit Event.synchronize()",
        "Do not wait on events inside the step: let the stream order the work (stream.wait_event) "
        "and read timings after the loop.",
    ),
    "stream_synchronize": SyncCause(
        "an explicit Stream.synchronize()",
        "Remove stream.synchronize() from the step; order streams with events (wait_stream/wait_event).",
    ),
    "print": SyncCause(
        "printing a CUDA tensor (its values are copied to the host)",
        "Print every N steps, or print a value already on the host; log tensors with a logger that "
        "reads them every N steps.",
    ),
    "tolist": SyncCause(
        "`.tolist()` of a CUDA tensor",
        "Keep the values on the GPU; call .tolist() every N steps or after the loop.",
    ),
    "numpy": SyncCause(
        "`.numpy()` of a CUDA tensor (after .cpu())",
        "Keep the values on the GPU; convert every N steps or after the loop.",
    ),
    "bool": SyncCause(
        "`bool()` of a CUDA tensor (an `if`, `and`/`or`, `assert` or `while` on a tensor)",
        "Do not branch on GPU values in the step: use torch.where / masking to keep it on the GPU, "
        "or check every N steps.",
    ),
    "item": SyncCause(
        "`.item()` (or float()/int()) of a CUDA tensor",
        "Keep the value on the GPU: accumulate losses/metrics as tensors and read them every N steps.",
    ),
    "data_dependent_shape": SyncCause(
        "an op whose output size depends on GPU values (boolean-mask indexing, nonzero, unique, "
        "masked_select): the host must read the size",
        "Use fixed-size forms: torch.where / multiplying by the mask instead of x[mask], "
        "nonzero_static / unique with a known size, or do it every N steps.",
    ),
    "cpu": SyncCause(
        "a device-to-host copy (`.cpu()` / `.to('cpu')`)",
        "Keep the tensor on the GPU; copy every N steps, or copy into pinned memory with "
        "non_blocking=True and read it after an event.",
    ),
    "pageable_copy": SyncCause(
        "a host-to-device copy from pageable (unpinned) memory",
        "Pin the host batch (DataLoader(pin_memory=True) or tensor.pin_memory()) and copy with "
        ".to(device, non_blocking=True).",
        "Build the inputs in pinned host buffers (tensor.pin_memory(), reused across requests) and copy "
        "with .to(device, non_blocking=True).",
    ),
    "pinned_copy_blocking": SyncCause(
        "a host-to-device copy from pinned memory without non_blocking=True",
        "Copy with .to(device, non_blocking=True): from pinned memory it then does not wait.",
    ),
    "event_wait": SyncCause(
        "the host waits on a CUDA event",
        "Avoid waiting on events inside the step; if this is inside a library (e.g. DDP), check its "
        "options (static_graph, broadcast_buffers=False) or look for a straggling rank.",
    ),
    "d2h_copy": SyncCause(
        "a device-to-host read",
        "Keep the value on the GPU and read it every N steps.",
    ),
    "stream_wait": SyncCause(
        "the host waits for a CUDA stream",
        "Avoid stream.synchronize() and data-dependent shapes (nonzero, boolean indexing) in the step.",
    ),
}


class CauseRule(msgspec.Struct, frozen=True):
    """Evidence for one cause. Every non-empty field must match (any of its entries).

    `python`: a python frame below the user frame whose name starts with, or whose file ends with,
    the entry; `ops`: a cpu_op of the chain; `copies`: a GPU copy whose name holds every string of
    the entry; `calls`: a runtime call whose name holds the entry (vendor prefix free).
    """

    cause: str
    python: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    copies: tuple[tuple[str, ...], ...] = ()
    calls: tuple[str, ...] = ()


# First match wins: explicit calls, then the Python-level call that reads a value (print before
# tolist/item, which print uses), then op and copy evidence, then the generic waits.
CAUSE_RULES: tuple[CauseRule, ...] = (
    CauseRule("device_synchronize", calls=("DeviceSynchronize", "CtxSynchronize", "ThreadSynchronize")),
    CauseRule("event_synchronize", calls=("EventSynchronize",), python=("torch/cuda/streams.py",)),
    CauseRule("stream_synchronize", calls=("StreamSynchronize",), python=("torch/cuda/streams.py",)),
    CauseRule("print", python=("<built-in function print>", "torch/_tensor_str.py")),
    CauseRule("tolist", python=("<built-in method tolist of",)),
    CauseRule("numpy", python=("<built-in method numpy of",)),
    CauseRule("bool", ops=("aten::is_nonzero",)),
    CauseRule("bool", python=("<built-in method __bool__ of",)),
    CauseRule(
        "data_dependent_shape",
        ops=("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
             "aten::unique_dim", "aten::unique_consecutive", "aten::repeat_interleave"),
    ),
    CauseRule("item", ops=("aten::item", "aten::_local_scalar_dense")),
    CauseRule("item", python=("<built-in method item of",)),
    CauseRule("cpu", copies=(("DtoH",),), python=("<built-in method cpu of", "<built-in method to of")),
    CauseRule("pageable_copy", copies=(("HtoD", "Pageable"),)),
    CauseRule("pinned_copy_blocking", copies=(("HtoD", "Pinned"),)),
    CauseRule("event_wait", calls=("EventSynchronize",)),
    CauseRule("d2h_copy", copies=(("DtoH",),)),
    CauseRule("stream_wait"),
)

_EXPLICIT_FOR_CALL = {  # a captured site's `call` -> the runtime call (vendor free) its sync point holds
    "torch.cuda.synchronize": "DeviceSynchronize",
    "Event.synchronize": "EventSynchronize",
    "Stream.synchronize": "StreamSynchronize",
}


def name_cause(python_below_user: list[str], ops: list[str], copies: list[str], calls: list[str]) -> str:
    """The key in `CAUSES` for one sync point's evidence (see `CAUSE_RULES`)."""
    files = [frame.file for name in python_below_user if (frame := parse_py_frame(name)) is not None]

    def python_matches(entry: str) -> bool:
        return any(name.startswith(entry) for name in python_below_user) or any(
            file.endswith(entry) for file in files
        )

    for rule in CAUSE_RULES:
        if rule.python and not any(python_matches(entry) for entry in rule.python):
            continue
        if rule.ops and not any(op in rule.ops for op in ops):
            continue
        if rule.copies and not any(all(s in copy for s in want) for copy in copies for want in rule.copies):
            continue
        if rule.calls and not any(want in call for call in calls for want in rule.calls):
            continue
        return rule.cause
    return "stream_wait"


def copy_blocks_host(call_name: str, copy_name: str | None) -> bool:
    """Whether a memcpy call blocks the host, from the GPU copy's name (`Memcpy DtoH (Device -> Pinned)`)."""
    if copy_name is None:
        return False  # kind unknown: do not claim a sync
    if "DtoD" in copy_name or "PtoP" in copy_name:
        return False
    if "HtoD" in copy_name or "DtoH" in copy_name:
        # A pinned non_blocking copy does not block; `.item()`-style reads and blocking pinned copies
        # follow it with a stream synchronize in the same op, which is what makes that point a sync.
        return "Pageable" in copy_name or is_blocking_copy(call_name)
    return False


class SyncPoint(msgspec.Struct):
    """One synchronizing operation in one step."""

    step: int
    thread: int
    start_us: float
    end_us: float
    blocked_us: float
    calls: list[str]
    copies: list[str]
    op: str
    ops: list[str]
    function: str | None
    file: str | None
    gpu_idle_after_us: float
    gpu_idle_during_us: float = 0.0
    """GPU idle while the host was inside the sync point (its first call's start to its last's end)."""
    in_warmup: bool = False
    """Inside a library warm-up op or a torch.compile compilation: that warm-up's cost, not the sync's."""
    line: int | None = None
    cause: str = "stream_wait"
    via: Via | None = None
    catalog: CatalogSite | None = None
    library_frames: list[PyFrame] = msgspec.field(default_factory=list)
    """Parsed library frames inside the user frame, outermost first."""
    python_below_user: list[str] = msgspec.field(default_factory=list)
    """Every python_function name inside the user frame (builtins included), outermost first."""

    @property
    def kind(self) -> str:
        """h2d_pageable | d2h_copy | device_sync | event_sync | stream_sync (the runtime-level kind)."""
        if any("HtoD" in c and "Pageable" in c for c in self.copies):
            return "h2d_pageable"
        if any("DtoH" in c for c in self.copies):
            return "d2h_copy"
        if any("DeviceSynchronize" in c or "CtxSynchronize" in c for c in self.calls):
            return "device_sync"
        if any("EventSynchronize" in c for c in self.calls):
            return "event_sync"
        return "stream_sync"

    @property
    def fix(self) -> str:
        """The catalog site's fix when a known framework site made the call, else the cause's."""
        return self.catalog.fix if self.catalog is not None else CAUSES[self.cause].fix

    @property
    def gpu_cost_us(self) -> float:
        """The GPU idle this sync causes: the idle while the host waits in it, plus the refill after
        it, at most the time it blocked. The host blocked as long as the GPU had queued work ahead
        of it: without the sync the host would run that far ahead, so the GPU would idle after it
        only for the part of the refill beyond that lead (a sync inside a GPU-bound stretch: ~0)."""
        return self.gpu_idle_during_us + min(self.gpu_idle_after_us, self.blocked_us)


def _library_frames(context: CallContext) -> list[PyFrame]:
    """Parsed library frames inside the user frame, outermost first (builtins carry no file)."""
    return [frame for name in context.below_user if (frame := parse_py_frame(name)) is not None]


def _via(frame: PyFrame | None, layout: CodeLayout | None) -> Via | None:
    if frame is None:
        return None
    library = library_of(frame.file, layout)
    version = layout.version_of(library) if layout is not None else None
    return Via(file=frame.file, line=frame.line, function=frame.function, library=library, version=version)


def describe(point: SyncPoint, layout: CodeLayout | None) -> None:
    """Fill `cause`, `catalog` and `via` of a sync point from its frames (see the module docstring)."""
    frames = point.library_frames
    point.cause = name_cause(point.python_below_user, point.ops, point.copies, point.calls)
    versions = dict(layout.versions) if layout is not None else None
    match = match_sync_site([(f.file, f.function) for f in frames], point.cause, versions)
    if match is not None:
        point.catalog, index = match
        point.via = _via(frames[index], layout)
    else:
        point.via = _via(frames[-1] if frames else None, layout)


# Frame names that are a warm-up region (torch.compile, Triton compilation, graph capture): the
# `warmup` rules of the idle causes' table. A pattern source, compiled on first use: most traces never
# ask (compiling it is 0.4 ms of `trainprof analyze`'s start, 2-core development machine, 2026-11-25).
_WARMUP_FRAMES = "|".join(f"(?:{r.pattern})" for r in FRAME_RULES if r.cause == Cause.WARMUP)


def _in_warmup(trace, thread: int, start_us: float, end_us: float, thresholds: Thresholds) -> bool:
    """Whether [start_us, end_us] on `thread` lies inside a warm-up: a warm-up frame (compilation,
    capture) or a cuDNN/cuBLAS op call (`WARMUP_OPS`) of at least `warmup_call_min_ms` (a search)."""
    warmup_frame = re.compile(_WARMUP_FRAMES)  # from re's cache after the first call
    frames = trace.frames(thread)
    for i in frames.chain(frames.innermost(start_us, end_us)):
        name = trace.names[int(frames.name_ids[i])]
        if warmup_frame.search(name):
            return True
        long_call = frames.ends[i] - frames.starts[i] >= thresholds.warmup_call_min_ms * 1e3
        if long_call and frames.categories[i] == "cpu_op" and WARMUP_OPS.match(name):
            return True
    return False


def find_sync_points(timeline: Timeline, thresholds: Thresholds | None = None) -> list[SyncPoint]:
    """Every sync point inside a profiled step, in time order, with its cause, `via` and catalog site."""
    limits = thresholds or Thresholds()
    trace = timeline.trace
    calls = timeline.calls
    if len(calls) == 0:
        return []
    copy_name = {
        int(c): trace.names[int(n)]
        for c, n in zip(trace.events["gpu_memcpy"].correlation, trace.events["gpu_memcpy"].name, strict=False)
    }
    is_sync_name = timeline.name_kind == KINDS.index("sync")
    is_copy_name = timeline.name_kind == KINDS.index("copy")
    candidates = np.flatnonzero(is_sync_name[calls.name] | is_copy_name[calls.name])
    call_step = timeline.step_of(calls.start_us[candidates])

    # Per candidate call, its innermost enclosing frame, the innermost cpu_op around it (which
    # groups it) and whether torch.profiler's own Python encloses it, per thread at once: only the
    # calls that open a blocking group need their full `call_context` (on ddp_straggler 48 of 506
    # candidates; a context per candidate cost 12 ms per trace).
    cand_thread = calls.thread[candidates]
    innermost = np.full(len(candidates), -1, dtype=np.int64)
    op_frame = np.full(len(candidates), -1, dtype=np.int64)
    in_profiler = np.zeros(len(candidates), dtype=bool)
    profiler_name = trace.names_matching(is_profiler_file)
    for thread in distinct(cand_thread).tolist():
        rows = np.flatnonzero(cand_thread == thread)
        frames = trace.frames(int(thread))
        inner = frames.innermost_of(calls.start_us[candidates[rows]], calls.end_us[candidates[rows]])
        innermost[rows] = inner
        op_frame[rows] = frames.enclosing_op(inner)
        is_profiler = (frames.category_codes == FRAME_CATEGORIES.index("python_function")) & profiler_name[
            frames.name_ids
        ]
        in_profiler[rows] = frames.nearest_marked(inner, is_profiler) >= 0

    groups: dict[tuple, dict] = {}
    for row, (idx, step_index) in enumerate(zip(candidates.tolist(), call_step.tolist(), strict=False)):
        name = trace.names[int(calls.name[idx])]
        copy = None
        blocking = True
        if is_copy_name[calls.name[idx]]:
            # Non-blocking copies are still grouped: a `.item()`'s D2H copy belongs to its sync point.
            copy = copy_name.get(int(calls.correlation[idx]))
            blocking = copy_blocks_host(name, copy)
        if in_profiler[row] or step_index < 0:
            continue  # the profiler's own synchronize, or outside every profiled step
        if not blocking and op_frame[row] < 0:
            continue
        if (
            not timeline.has_step_annotations
            and innermost[row] < 0
            and call_kind(name) == "sync"
            and "DeviceSynchronize" in name
        ):
            continue  # a bare device synchronize with nothing around it: the profiler stopping
        thread = int(calls.thread[idx])
        start, end = float(calls.start_us[idx]), float(calls.end_us[idx])
        key = (thread, int(op_frame[row])) if op_frame[row] >= 0 else (thread, "call", idx)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "step": step_index,
                "thread": thread,
                "start": start,
                "end": end,
                "first_end": end,
                "blocked": 0.0,
                "calls": [],
                "copies": [],
                "blocking": False,
            }
        group["end"] = max(group["end"], end)
        group["calls"].append(name)
        if copy:
            group["copies"].append(copy)
        if blocking:
            group["blocked"] += end - start
            group["blocking"] = True

    layout = trace.code_layout
    points = []
    blocking = sorted((g for g in groups.values() if g["blocking"]), key=lambda g: g["start"])
    # GPU idle inside each point's span, all at once (a `covered` call per point cost ~60 µs each).
    start, end = np.array([(g["start"], g["end"]) for g in blocking]).reshape(-1, 2).T
    idle_inside = np.maximum(end - start - timeline.gpu_busy.covered(start, end), 0.0)
    for group, idle_during in zip(blocking, idle_inside.tolist(), strict=True):
        # The frames around the group's first call.
        context = call_context(trace, group["thread"], group["start"], group["first_end"])
        annotations = [a for a in context.annotations if not a.startswith("ProfilerStep#")]
        op = context.op_chain or (annotations[-1] if annotations else group["calls"][-1])
        idle_after = timeline.gpu_busy.next_busy_after(group["end"])
        step_end = timeline.steps[group["step"]].end_us
        idle_after = min(idle_after, max(step_end - group["end"], 0.0)) if idle_after is not None else 0.0
        point = SyncPoint(
            step=timeline.steps[group["step"]].number,
            thread=group["thread"],
            start_us=group["start"],
            end_us=group["end"],
            blocked_us=group["blocked"],
            calls=group["calls"],
            copies=group["copies"],
            op=op,
            ops=context.ops,
            function=context.user.function if context.user else None,
            file=context.user.file if context.user else None,
            gpu_idle_after_us=idle_after,
            gpu_idle_during_us=idle_during,
            in_warmup=_in_warmup(trace, group["thread"], group["start"], group["first_end"], limits),
            library_frames=_library_frames(context),
            python_below_user=context.below_user,
        )
        describe(point, layout)
        points.append(point)
    return points


def join_sync_sites(points: list[SyncPoint], sites: list[dict], layout: CodeLayout | None = None) -> int:
    """Fill `line` (and the captured file/function) of sync points from captured sites; returns matches.

    Per step and per innermost user function (plus file basename), the trace's sync points and the
    captured sites are paired in order only when their counts agree and every pair is compatible
    (an explicit `torch.cuda.synchronize` site needs a device synchronize, etc.). Otherwise that
    group stays unmatched (`line` None): a missing or extra site never shifts a line onto another sync.
    A matched site's stack also gives the exact line of `via` when it names the same function.
    """

    def basename(file):
        return os.path.basename(file) if isinstance(file, str) and file else None

    trace_groups: dict[tuple, list[SyncPoint]] = defaultdict(list)
    for point in points:
        if point.function is not None:
            trace_groups[(point.step, point.function, basename(point.file))].append(point)
    site_groups: dict[tuple, list[dict]] = defaultdict(list)
    for site in sites:
        step, function = site.get("step"), site.get("function")
        if isinstance(step, int) and isinstance(function, str) and function:
            site_groups[(step, function, basename(site.get("file")))].append(site)

    matched = 0
    for key, group_points in trace_groups.items():
        group_sites = site_groups.get(key, [])
        if len(group_sites) != len(group_points):
            continue
        if not all(_compatible(site, point) for site, point in zip(group_sites, group_points, strict=False)):
            continue
        for site, point in zip(group_sites, group_points, strict=False):
            point.line = site.get("line") if isinstance(site.get("line"), int) else None
            point.file = site.get("file") if isinstance(site.get("file"), str) else point.file
            _refine_via(point, site.get("stack"), layout)
            matched += 1
    return matched


def _refine_via(point: SyncPoint, stack: object, layout: CodeLayout | None) -> None:
    """Give `via` the captured line: the innermost library frame of the captured stack with the same
    function and file name (the trace gives a function's first line only)."""
    if point.via is None or not isinstance(stack, list):
        return
    for frame in reversed(stack):
        if not isinstance(frame, dict):
            continue
        file, line, function = frame.get("file"), frame.get("line"), frame.get("function")
        if not (isinstance(file, str) and isinstance(line, int) and function == point.via.function):
            continue
        same_file = os.path.basename(file) == os.path.basename(point.via.file or "")
        if same_file and not is_user_file(file, layout):
            point.via = Via(file=point.via.file, line=line, function=point.via.function,
                            library=point.via.library, version=point.via.version)
            return


def _compatible(site: dict, point: SyncPoint) -> bool:
    needed = _EXPLICIT_FOR_CALL.get(site.get("call"))
    if needed is not None:
        return any(needed in call for call in point.calls) and not point.copies
    return True


class StepSyncs(Record, frozen=True, rename={"count": "sync_count", "blocked_ms": "sync_blocked_ms"}):
    """One step's sync points and the time the host was blocked in them: a part of the step row."""

    count: int
    blocked_ms: float


def step_syncs(points: list[SyncPoint], step_numbers: list[int]) -> list[StepSyncs]:
    """Per step (of `step_numbers`, a trace's steps in order), its sync points' count and blocked ms."""
    index = {number: i for i, number in enumerate(step_numbers)}
    count = [0] * len(step_numbers)
    blocked = [0.0] * len(step_numbers)
    for point in points:
        i = index[point.step]
        count[i] += 1
        blocked[i] = round(blocked[i] + point.blocked_us / 1e3, 4)
    return [StepSyncs(c, b) for c, b in zip(count, blocked, strict=True)]


class SyncOccurrence(Record, frozen=True):
    """One sync point of a finding: its step, when (ms into the trace), how long the host blocked,
    and the GPU idle time after it in its step."""

    step: int
    at_ms: float
    blocked_ms: float
    gpu_idle_after_ms: float


class SyncDetails(Record, frozen=True):
    """A sync finding's evidence: the runtime-level kind, the `CAUSES` key, the catalog site (its id
    and why it syncs) when a known framework site made the call, the op chain, the runtime calls and
    copies of its points, the GPU idle time after them, the host's blocked time plus that idle as a
    share of the step time (`cost_pct_of_step_time`; the GPU time at stake is the finding's
    `gpu_ms_per_step`), and each occurrence."""

    sync_kind: str
    cause: str
    catalog_site: str | None
    why: str | None
    op_chain: list[str]
    runtime_calls: list[str]
    copies: list[str]
    gpu_idle_after_ms: float
    cost_pct_of_step_time: float
    occurrences: list[SyncOccurrence]


def sync_findings(
    points: list[SyncPoint],
    step_count: int,
    rank: int | None,
    basis: StepBasis,
    thresholds: Thresholds,
    inference: bool = False,
) -> list[Finding]:
    """One finding per (cause, library call site, user frame): counts, blocked time, GPU idle after,
    and the GPU time at stake (`SyncPoint.gpu_cost_us`, the part an un-profiled step keeps:
    `StepBasis.idle_gain`), which sets the severity against `basis`. Sync points inside
    a warm-up are left to the warm-up's finding. `inference`: the loop is an inference loop
    (`workload.is_inference`), whose fixes differ where the cause says so (`SyncCause.inference_fix`)."""
    grouped: dict[tuple, list[SyncPoint]] = defaultdict(list)
    for point in points:
        if point.in_warmup:
            continue
        via = (point.via.file, point.via.function) if point.via is not None else None
        grouped[(point.cause, via, point.function, point.file, point.line)].append(point)
    findings = []
    steps = max(step_count, 1)
    for (cause_key, _via_site, function, file, line), group in grouped.items():
        first = group[0]
        cause = CAUSES[cause_key]
        blocked_ms = sum(p.blocked_us for p in group) / 1e3
        idle_ms = sum(p.gpu_idle_after_us for p in group) / 1e3
        recorded_ms = sum(p.gpu_cost_us for p in group) / 1e3 / steps
        gpu_ms_per_step = basis.idle_gain(recorded_ms)
        per_step = len(group) / steps
        impact_pct = 100.0 * (blocked_ms + idle_ms) / max(basis.window_ms * steps, 1e-9)
        where_text = f" in {function}" if function else ""
        via = first.via
        via_text = f" via {via.library or '?'} {via.function}" if via is not None and via.library else ""
        catalog = first.catalog
        findings.append(
            Finding(
                kind="sync_point",
                title=f"CPU waits for the GPU: {cause.words}{where_text}{via_text} ({per_step:g}/step)"
                + basis.idle_note(recorded_ms),
                severity=severity_for(gpu_ms_per_step, basis.judged_ms, thresholds),
                op=first.op,
                where=Where(file=file, line=line, function=function),
                via=via,
                cause=cause.words,
                count=len(group),
                per_step=round(per_step, 3),
                cost_ms=round(blocked_ms, 4),
                fix=(cause.inference_fix if inference and catalog is None else None) or first.fix,
                rank=rank,
                gpu_ms_per_step=round(gpu_ms_per_step, 4),
                details=SyncDetails(
                    sync_kind=first.kind,
                    cause=cause_key,
                    catalog_site=catalog.id if catalog is not None else None,
                    why=catalog.why if catalog is not None else None,
                    op_chain=first.ops,
                    runtime_calls=sorted(set(c for p in group for c in p.calls)),
                    copies=sorted(set(c for p in group for c in p.copies)),
                    gpu_idle_after_ms=round(idle_ms, 4),
                    cost_pct_of_step_time=numpy_round(impact_pct, 3),
                    occurrences=[
                        SyncOccurrence(
                            step=p.step,
                            at_ms=round(p.start_us / 1e3, 4),
                            blocked_ms=round(p.blocked_us / 1e3, 4),
                            gpu_idle_after_ms=round(p.gpu_idle_after_us / 1e3, 4),
                        )
                        for p in group
                    ],
                ),
            )
        )
    findings.sort(key=lambda f: (-(f.gpu_ms_per_step or 0.0), -f.cost_ms))
    return findings
