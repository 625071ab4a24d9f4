"""Question 2: where does the CPU wait for the GPU (sync points), how long, and from which user line.

A sync point is one synchronizing operation as the user wrote it: the runtime calls that block the
host (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize`, a `cudaMemcpy*`
device-to-host or from pageable host memory) grouped by their innermost enclosing `cpu_op`, so
`.item()` (a D2H copy plus a stream synchronize inside `aten::_local_scalar_dense`) counts once.
Not sync points: device-to-device copies, host-to-device copies from pinned memory, and the
profiler's own `cudaDeviceSynchronize` when it stops (torch/profiler frames, or outside every step).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.frames import call_context
from trainprof.analysis.result import Finding
from trainprof.analysis.timeline import Timeline

SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaStreamWaitEvent_host",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
_EXPLICIT_FOR_CALL = {  # a captured site's `call` -> the runtime call that must be in its sync point
    "torch.cuda.synchronize": "cudaDeviceSynchronize",
    "Event.synchronize": "cudaEventSynchronize",
    "Stream.synchronize": "cudaStreamSynchronize",
}


def copy_blocks_host(call_name: str, copy_name: str | None) -> bool:
    """Whether a memcpy call blocks the host, from the GPU copy's name (`Memcpy DtoH (Device -> Pinned)`)."""
    if copy_name is None:
        return False  # kind unknown: do not claim a sync
    if "DtoD" in copy_name or "PtoP" in copy_name:
        return False
    if "HtoD" in copy_name:
        return "Pageable" in copy_name or not call_name.endswith("Async")
    if "DtoH" in copy_name:
        # A pinned non_blocking D2H copy does not block; `.item()`-style reads follow it with a stream
        # synchronize in the same op, which is what makes that point a sync.
        return "Pageable" in copy_name or not call_name.endswith("Async")
    return False


@dataclass
class SyncPoint:
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
    line: int | None = None

    @property
    def kind(self) -> str:
        """h2d_pageable | d2h_copy | device_sync | event_sync | stream_sync."""
        if any("HtoD" in c and "Pageable" in c for c in self.copies):
            return "h2d_pageable"
        if any("DtoH" in c for c in self.copies):
            return "d2h_copy"
        if "cudaDeviceSynchronize" in self.calls or "cuCtxSynchronize" in self.calls:
            return "device_sync"
        if "cudaEventSynchronize" in self.calls or "cuEventSynchronize" in self.calls:
            return "event_sync"
        return "stream_sync"


def find_sync_points(timeline: Timeline) -> list[SyncPoint]:
    """Every sync point inside a profiled step, in time order."""
    trace = timeline.trace
    calls = timeline.calls
    if len(calls) == 0:
        return []
    copy_name = {
        int(c): trace.names[int(n)]
        for c, n in zip(trace.events["gpu_memcpy"].correlation, trace.events["gpu_memcpy"].name, strict=False)
    }
    is_sync_name = trace.names_matching(lambda n: n in SYNC_CALLS)
    is_copy_name = trace.names_matching(lambda n: n.startswith(("cudaMemcpy", "cuMemcpy")))
    candidates = np.flatnonzero(is_sync_name[calls.name] | is_copy_name[calls.name])
    call_step = timeline.step_of(calls.start_us[candidates])

    groups: dict[tuple, dict] = {}
    for idx, step_index in zip(candidates.tolist(), call_step.tolist(), strict=False):
        name = trace.names[int(calls.name[idx])]
        copy = None
        blocking = True
        if is_copy_name[calls.name[idx]]:
            # Non-blocking copies are still grouped: a `.item()`'s D2H copy belongs to its sync point.
            copy = copy_name.get(int(calls.correlation[idx]))
            blocking = copy_blocks_host(name, copy)
        thread = int(calls.thread[idx])
        start, end = float(calls.start_us[idx]), float(calls.end_us[idx])
        context = call_context(trace, thread, start, end)
        if context.in_profiler or step_index < 0:
            continue  # the profiler's own synchronize, or outside every profiled step
        if not blocking and not context.ops:
            continue
        if (
            not timeline.has_step_annotations
            and not context.ops
            and not context.annotations
            and not context.python
            and name == "cudaDeviceSynchronize"
        ):
            continue  # a bare device synchronize with nothing around it: the profiler stopping
        frames = trace.frames(thread)
        innermost = frames.innermost(start, end)
        op_frame = next(
            (i for i in reversed(frames.chain(innermost)) if frames.categories[i] == "cpu_op"), None
        )
        key = (thread, op_frame) if op_frame is not None else (thread, "call", idx)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "step": step_index,
                "thread": thread,
                "start": start,
                "end": end,
                "blocked": 0.0,
                "calls": [],
                "copies": [],
                "blocking": False,
                "context": context,
            }
        group["end"] = max(group["end"], end)
        group["calls"].append(name)
        if copy:
            group["copies"].append(copy)
        if blocking:
            group["blocked"] += end - start
            group["blocking"] = True

    points = []
    for group in sorted(groups.values(), key=lambda g: g["start"]):
        if not group["blocking"]:
            continue
        context = group["context"]
        annotations = [a for a in context.annotations if not a.startswith("ProfilerStep#")]
        op = context.op_chain or (annotations[-1] if annotations else group["calls"][-1])
        idle_after = timeline.gpu_busy.next_busy_after(group["end"])
        step_end = timeline.steps[group["step"]].end_us
        idle_after = min(idle_after, max(step_end - group["end"], 0.0)) if idle_after is not None else 0.0
        points.append(
            SyncPoint(
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
            )
        )
    return points


def join_sync_sites(points: list[SyncPoint], sites: list[dict]) -> int:
    """Fill `line` (and the captured file/function) of sync points from captured sites; returns matches.

    Per step and per innermost user function (plus file basename), the trace's sync points and the
    captured sites are paired in order only when their counts agree and every pair is compatible
    (an explicit `torch.cuda.synchronize` site needs a device synchronize, etc.). Otherwise that
    group stays unmatched (`line` None): a missing or extra site never shifts a line onto another sync.
    """

    def basename(file):
        return os.path.basename(file) if file else None

    trace_groups: dict[tuple, list[SyncPoint]] = defaultdict(list)
    for point in points:
        if point.function is not None:
            trace_groups[(point.step, point.function, basename(point.file))].append(point)
    site_groups: dict[tuple, list[dict]] = defaultdict(list)
    for site in sites:
        step, function = site.get("step"), site.get("function")
        if isinstance(step, int) and function:
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
            point.file = site.get("file") or point.file
            matched += 1
    return matched


def _compatible(site: dict, point: SyncPoint) -> bool:
    needed = _EXPLICIT_FOR_CALL.get(site.get("call"))
    if needed is not None:
        return needed in point.calls and not point.copies
    return True


_TITLES = {
    "h2d_pageable": "Host-to-device copy from pageable memory blocks the CPU",
    "d2h_copy": "Device-to-host read blocks the CPU until the GPU catches up",
    "device_sync": "Explicit device synchronize",
    "event_sync": "CPU waits on a CUDA event",
    "stream_sync": "CPU waits for a CUDA stream",
}
_FIXES = {
    "h2d_pageable": "Pin the host batch (DataLoader(pin_memory=True) or tensor.pin_memory()) and copy with "
    ".to(device, non_blocking=True).",
    "d2h_copy": "Keep the value on the GPU: accumulate losses/metrics as tensors and read them every "
    "N steps; replace data-dependent Python branches on `.item()` with torch.where or a check every N steps.",
    "device_sync": "Remove torch.cuda.synchronize() from the training loop (time with CUDA events instead).",
    "event_sync": "Avoid waiting on events inside the step; if this is inside a library (e.g. DDP), "
    "check its options (static_graph, broadcast_buffers=False) or look for a straggling rank.",
    "stream_sync": "Avoid stream.synchronize() and data-dependent shapes (nonzero, boolean indexing) "
    "in the step.",
}


def sync_findings(
    points: list[SyncPoint], step_count: int, rank: int | None, step_ms: float
) -> list[Finding]:
    """One finding per (op, user function, file, line), with counts, blocked time and GPU idle after."""
    grouped: dict[tuple, list[SyncPoint]] = defaultdict(list)
    for point in points:
        grouped[(point.op, point.function, point.file, point.line)].append(point)
    findings = []
    for (op, function, file, line), group in grouped.items():
        kind = group[0].kind
        blocked_ms = sum(p.blocked_us for p in group) / 1e3
        idle_ms = sum(p.gpu_idle_after_us for p in group) / 1e3
        per_step = len(group) / max(step_count, 1)
        impact_pct = 100.0 * (blocked_ms + idle_ms) / max(step_ms * step_count, 1e-9)
        severity = "high" if impact_pct >= 5 else "medium" if function is not None else "low"
        where_text = f" in {function}" if function else ""
        findings.append(
            Finding(
                kind="sync_point",
                title=f"{_TITLES[kind]}{where_text} ({per_step:g}/step, {op})",
                severity=severity,
                op=op,
                where={"file": file, "line": line, "function": function},
                count=len(group),
                per_step=round(per_step, 3),
                cost_ms=round(blocked_ms, 4),
                fix=_FIXES[kind],
                rank=rank,
                details={
                    "sync_kind": kind,
                    "op_chain": group[0].ops,
                    "runtime_calls": sorted(set(c for p in group for c in p.calls)),
                    "copies": sorted(set(c for p in group for c in p.copies)),
                    "gpu_idle_after_ms": round(idle_ms, 4),
                    "cost_pct_of_step_time": round(impact_pct, 3),
                    "occurrences": [
                        {
                            "step": p.step,
                            "at_ms": round(p.start_us / 1e3, 4),
                            "blocked_ms": round(p.blocked_us / 1e3, 4),
                            "gpu_idle_after_ms": round(p.gpu_idle_after_us / 1e3, 4),
                        }
                        for p in group
                    ],
                },
            )
        )
    findings.sort(key=lambda f: -(f.cost_ms + f.details["gpu_idle_after_ms"]))
    return findings
