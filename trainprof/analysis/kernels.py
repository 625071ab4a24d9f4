"""Question 5: which kernels and which ops take the GPU time."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from trainprof.analysis.result import Finding
from trainprof.analysis.timeline import Timeline

TOP_N = 10


def top_kernels_finding(timeline: Timeline, rank: int | None) -> Finding | None:
    """An info finding listing the kernels and the (innermost) ops with the most GPU time in the steps."""
    trace, kernels, calls = timeline.trace, timeline.kernels, timeline.calls
    in_steps = np.flatnonzero(timeline.kernel_step >= 0)
    if in_steps.size == 0:
        return None
    total_us = float(kernels.dur_us[in_steps].sum())
    if total_us <= 0:  # every kernel has `dur: 0`: no GPU time to rank
        return None
    by_name_us = np.bincount(
        kernels.name[in_steps], weights=kernels.dur_us[in_steps], minlength=len(trace.names)
    )
    by_name_n = np.bincount(kernels.name[in_steps], minlength=len(trace.names))
    top = np.argsort(-by_name_us)[:TOP_N]
    n_steps = max(len(timeline.steps), 1)
    top_kernels = [
        {
            "name": trace.names[i],
            "count": int(by_name_n[i]),
            "total_ms": round(by_name_us[i] / 1e3, 4),
            "mean_us": round(by_name_us[i] / by_name_n[i], 3),
            "pct": round(100 * by_name_us[i] / total_us, 2),
        }
        for i in top
        if by_name_n[i]
    ]

    op_us: dict[str, float] = defaultdict(float)
    op_n: dict[str, int] = defaultdict(int)
    for k in in_steps.tolist():
        c = int(timeline.kernel_call[k])
        op = None
        if c >= 0:
            frames = trace.frames(int(calls.thread[c]))
            i = frames.innermost(float(calls.start_us[c]), float(calls.end_us[c]))
            while i >= 0 and frames.categories[i] != "cpu_op":
                i = frames.parent[i]
            op = trace.names[int(frames.name_ids[i])] if i >= 0 else None
        key = op or "(no op)"
        op_us[key] += float(kernels.dur_us[k])
        op_n[key] += 1
    top_ops = [
        {"op": op, "kernels": op_n[op], "total_ms": round(us / 1e3, 4), "pct": round(100 * us / total_us, 2)}
        for op, us in sorted(op_us.items(), key=lambda kv: -kv[1])[:TOP_N]
    ]
    head = top_kernels[0]
    return Finding(
        kind="top_kernels",
        title=f"Top GPU time: {top_ops[0]['op']} ({top_ops[0]['pct']:.0f}% of kernel time)",
        severity="info",
        op=top_ops[0]["op"],
        where={"file": None, "line": None, "function": None},
        count=int(in_steps.size),
        per_step=round(in_steps.size / n_steps, 2),
        cost_ms=round(total_us / 1e3, 4),
        fix=None,
        rank=rank,
        details={
            "kernels": top_kernels,
            "ops": top_ops,
            "top_kernel": head["name"],
            "kernel_ms_per_step": round(total_us / 1e3 / n_steps, 4),
        },
    )
