"""Question 4: while the GPU sat idle inside a step, what was the host doing? And the step's verdict.

Each GPU idle gap inside a step is put in one bucket:
- `sync`: a sync point ended in the gap (the GPU drained while the CPU waited, then had to refill it);
- `launch`: the host spent most of the gap inside torch ops / CUDA runtime calls (dispatch and launch
  overhead: the CPU cannot issue kernels as fast as the GPU runs them);
- `host`: the host was elsewhere (data loading, preprocessing, Python, sleeping) with no GPU work queued.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from trainprof.analysis.frames import call_context
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.result import Finding
from trainprof.analysis.timeline import Timeline

_SAMPLED_HOST_GAPS = 64  # the longest host gaps whose user function is looked up
_MIN_SAMPLED_GAP_US = 20.0


def idle_breakdown(timeline: Timeline, sync_end_us: np.ndarray) -> tuple[list[dict], list[dict]]:
    """Per step: GPU idle ms by cause; and the user functions (or ops) holding the CPU in host gaps."""
    trace = timeline.trace
    ev = trace.events
    calls = timeline.calls
    cpu_busy = Coverage(
        np.concatenate((ev["cpu_op"].start_us, calls.start_us)),
        np.concatenate((ev["cpu_op"].end_us, calls.end_us)),
    )
    sync_end_us = np.sort(sync_end_us)
    main_thread = _main_thread(timeline)
    per_step, host_gaps = [], []
    for _i, window in enumerate(timeline.steps):
        gs, ge = timeline.gpu_busy.gaps(window.start_us, window.end_us)
        length = ge - gs
        # A sync ended inside the gap, or within 5 µs before it started (it returned as the GPU drained).
        lo = np.searchsorted(sync_end_us, gs - 5.0, side="left")
        hi = np.searchsorted(sync_end_us, ge, side="right")
        after_sync = hi > lo
        busy_share = np.where(length > 0, cpu_busy.covered(gs, ge) / np.maximum(length, 1e-9), 0.0)
        launch = ~after_sync & (busy_share >= 0.5)
        host = ~after_sync & ~launch
        per_step.append(
            {
                "idle_sync_ms": round(float(length[after_sync].sum()) / 1e3, 4),
                "idle_launch_ms": round(float(length[launch].sum()) / 1e3, 4),
                "idle_host_ms": round(float(length[host].sum()) / 1e3, 4),
                "idle_gap_count": int(length.size),
            }
        )
        host_gaps.extend(zip(length[host].tolist(), gs[host].tolist(), ge[host].tolist(), strict=False))

    holders: Counter = Counter()
    files: dict = {}
    host_gaps.sort(reverse=True)
    for length, gs, ge in host_gaps[:_SAMPLED_HOST_GAPS]:
        if length < _MIN_SAMPLED_GAP_US or main_thread is None:
            break
        mid = (gs + ge) / 2
        context = call_context(trace, main_thread, mid, mid)
        annotations = [a for a in context.annotations if not a.startswith("ProfilerStep#")]
        if context.user is not None:
            key = ("function", context.user.function)
            files[key] = context.user.file
        elif context.ops:
            key = ("op", context.ops[0])
        elif annotations:
            key = ("annotation", annotations[-1])
        else:
            key = ("none", None)
        holders[key] += length
    holder_list = [
        {"kind": k[0], "name": k[1], "file": files.get(k), "idle_ms": round(v / 1e3, 4)}
        for k, v in holders.most_common(5)
    ]
    return per_step, holder_list


def _main_thread(timeline: Timeline) -> int | None:
    """The CPU thread that issued the most kernel launches (the training loop's thread)."""
    launches = timeline.calls.thread[timeline.call_is_launch]
    if launches.size == 0:
        return None
    return int(np.bincount(launches).argmax())


def verdict(steps: list[dict], tiny_kernel_pct: float) -> dict:
    """What bounds the step: gpu-bound, communication-bound, launch-bound, sync-bound, host-bound,
    or cpu-only when the steps launched no GPU work at all."""
    n = max(len(steps), 1)

    def mean(key):
        return sum(s[key] for s in steps) / n

    busy_pct = mean("gpu_busy_pct")
    idle = {
        "launch-bound": mean("idle_launch_ms"),
        "sync-bound": mean("idle_sync_ms"),
        "host-bound": mean("idle_host_ms"),
    }
    if not any(s["kernel_count"] or s["gpu_busy_ms"] for s in steps):
        label = "cpu-only"  # no GPU work to be bound by: the step is all host time
    elif busy_pct >= 80:
        label = (
            "communication-bound" if mean("comm_ms") >= 0.3 * max(mean("gpu_busy_ms"), 1e-9) else "gpu-bound"
        )
    else:
        label = max(idle, key=idle.get)
    return {
        "verdict": label,
        "gpu_busy_pct": round(busy_pct, 2),
        "step_ms": round(mean("duration_ms"), 4),
        "gpu_idle_ms_per_step": round(mean("gpu_idle_ms"), 4),
        "idle_launch_ms_per_step": round(idle["launch-bound"], 4),
        "idle_sync_ms_per_step": round(idle["sync-bound"], 4),
        "idle_host_ms_per_step": round(idle["host-bound"], 4),
        "comm_ms_per_step": round(mean("comm_ms"), 4),
        "kernels_per_step": round(mean("kernel_count"), 1),
        "tiny_kernel_pct": round(tiny_kernel_pct, 2),
    }


def host_bound_finding(
    verdict_info: dict, holders: list[dict], steps: list[dict], rank: int | None
) -> Finding | None:
    """A finding when the GPU waits on host work with nothing queued (slow input pipeline or Python)."""
    n = max(len(steps), 1)
    host_ms = sum(s["idle_host_ms"] for s in steps)
    share = host_ms / max(sum(s["duration_ms"] for s in steps), 1e-9)
    if verdict_info["verdict"] == "cpu-only" or (share < 0.1 and verdict_info["verdict"] != "host-bound"):
        return None
    top = holders[0] if holders else {"kind": "none", "name": None, "file": None}
    function = top["name"] if top["kind"] == "function" else None
    return Finding(
        kind="host_bound",
        title=(
            f"GPU idle {host_ms / n:.1f} ms/step ({100 * share:.0f}% of the step) while the host does other "
            "work with no GPU work queued" + (f" (in {top['name']})" if top["name"] else "")
        ),
        severity="high" if share >= 0.2 else "medium",
        op=top["name"] if top["kind"] in ("op", "annotation") else None,
        where={"file": top["file"], "line": None, "function": function},
        count=n,
        per_step=1.0,
        cost_ms=round(host_ms, 4),
        fix=(
            "Prepare batches off the training thread: DataLoader(num_workers>0, pin_memory=True, "
            "prefetch_factor, persistent_workers=True), move preprocessing to the GPU or the dataset, "
            "and prefetch the next batch while the current step runs."
        ),
        rank=rank,
        details={
            "idle_host_ms_per_step": round(host_ms / n, 4),
            "idle_host_pct": round(100 * share, 2),
            "cpu_holders": holders,
            "verdict": verdict_info,
        },
    )
