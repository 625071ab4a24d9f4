"""Question 3: is the step bound by kernel launch overhead (the CPU cannot issue tiny kernels fast enough)?"""

from __future__ import annotations

from collections import Counter
from statistics import median  # not np.median: it imports numpy.ma, 25 ms of a fresh process

import numpy as np

from trainprof.analysis.frames import UserFrameIndex
from trainprof.analysis.result import Finding
from trainprof.analysis.timeline import Timeline


def launch_stats(timeline: Timeline) -> tuple[list[dict], dict]:
    """Per step: tiny-kernel counts; and, over all steps, the user regions and ops launching tiny kernels.

    A kernel is tiny when it runs shorter than the CPU call that launched it: the GPU finishes it
    before the CPU can issue the next one, so the GPU waits on the CPU.
    """
    kernels, calls = timeline.kernels, timeline.calls
    matched = timeline.kernel_call >= 0
    call_index = np.clip(timeline.kernel_call, 0, None)
    launch_us = np.where(matched, calls.dur_us[call_index] if len(calls) else 0.0, np.nan)
    tiny = matched & (kernels.dur_us < launch_us) & ~timeline.kernel_is_comm
    per_step = []
    for i in range(len(timeline.steps)):
        in_step = timeline.kernel_step == i
        count = int(in_step.sum())
        tiny_count = int((tiny & in_step).sum())
        per_step.append(
            {
                "tiny_kernel_count": tiny_count,
                "tiny_kernel_pct": round(100.0 * tiny_count / count, 2) if count else 0.0,
                "median_kernel_us": round(median(kernels.dur_us[in_step].tolist()), 3) if count else 0.0,
            }
        )

    regions: Counter = Counter()
    region_files: dict[str | None, str | None] = {}
    top_ops: Counter = Counter()
    indexes: dict[int, UserFrameIndex] = {}
    tiny_in_steps = np.flatnonzero(tiny & (timeline.kernel_step >= 0))
    for k in tiny_in_steps.tolist():
        c = int(timeline.kernel_call[k])
        thread = int(calls.thread[c])
        index = indexes.get(thread)
        if index is None:
            index = indexes[thread] = UserFrameIndex(timeline.trace, thread)
        start, end = float(calls.start_us[c]), float(calls.end_us[c])
        frame = index.user_frame(start, end)
        function = frame.function if frame else None
        regions[function] += 1
        region_files.setdefault(function, frame.file if frame else None)
        top_ops[(function, index.top_op(start, end))] += 1
    region_list = [
        {"function": f, "file": region_files[f], "tiny_kernels": n} for f, n in regions.most_common(5)
    ]
    for region in region_list:
        region["top_ops"] = [
            {"op": op, "tiny_kernels": n} for (f, op), n in top_ops.most_common() if f == region["function"]
        ][:6]
    totals = {
        "tiny_kernel_count": int(tiny_in_steps.size),
        "kernel_count": int((timeline.kernel_step >= 0).sum()),
        "median_launch_us": round(median(launch_us[matched].tolist()), 3) if matched.any() else None,
        "median_kernel_us": round(median(kernels.dur_us.tolist()), 3) if len(kernels) else None,
        "regions": region_list,
    }
    return per_step, totals


def launch_finding(verdict: dict, totals: dict, steps: list[dict], rank: int | None) -> Finding | None:
    """The launch-overhead finding, when the verdict or the tiny-kernel share says launches limit the step."""
    n = max(len(steps), 1)
    tiny_pct = 100.0 * totals["tiny_kernel_count"] / max(totals["kernel_count"], 1)
    if verdict["verdict"] == "cpu-only":
        return None
    launch_bound = verdict["verdict"] == "launch-bound"
    if not launch_bound and not (tiny_pct >= 50 and verdict["gpu_busy_pct"] < 80):
        return None
    region = totals["regions"][0] if totals["regions"] else {"function": None, "file": None, "top_ops": []}
    ops = ", ".join(o["op"] for o in region.get("top_ops", []) if o["op"])
    fixes = [
        "Capture the step with CUDA graphs or torch.compile(mode='reduce-overhead') so one launch replays "
        "hundreds of kernels.",
        "Use a foreach/fused optimizer (torch.optim.AdamW(..., fused=True) or foreach=True) and "
        "clip_grad_norm_(foreach=True).",
        "Replace Python loops over parameters/tensors with one batched op (torch._foreach_norm, "
        "torch.stack + one reduction)" + (f" in {region['function']}" if region["function"] else "") + ".",
        "Give each kernel more work: a larger batch or sequence per step (or fewer, larger ops).",
    ]
    idle_launch_ms = sum(s.get("idle_launch_ms", 0.0) for s in steps)
    where_fn = region["function"]
    return Finding(
        kind="launch_overhead",
        title=(
            f"{'Launch-bound' if launch_bound else 'Many tiny kernels'}: "
            f"{totals['kernel_count'] / n:.0f} kernels/step, {tiny_pct:.0f}% shorter than their launch; "
            f"GPU busy {verdict['gpu_busy_pct']:.0f}%"
            + (f"; most tiny kernels from {where_fn}" if where_fn else "")
        ),
        severity="high" if launch_bound else "medium",
        op=ops or None,
        where={"file": region["file"], "line": None, "function": where_fn},
        count=totals["tiny_kernel_count"],
        per_step=round(totals["tiny_kernel_count"] / n, 2),
        cost_ms=round(idle_launch_ms, 4),
        rank=rank,
        fix=" ".join(f"{i}) {f}" for i, f in enumerate(fixes, 1)),
        details={
            "fixes": fixes,
            "tiny_kernel_pct": round(tiny_pct, 2),
            "kernels_per_step": round(totals["kernel_count"] / n, 1),
            "launch_ms_per_step": round(sum(s["launch_ms"] for s in steps) / n, 4),
            "median_launch_us": totals["median_launch_us"],
            "median_kernel_us": totals["median_kernel_us"],
            "gpu_idle_while_launching_ms_per_step": round(idle_launch_ms / n, 4),
            "regions": totals["regions"],
            "verdict": verdict,
        },
    )
