"""Question 5: which kernels and which ops take the GPU time."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.arrays import distinct
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

    # Each kernel's op: the innermost cpu_op around its launch call (name id; -1: none), found per
    # launching thread at once (a walk per kernel cost 10 ms on ddp_straggler's 5k kernels).
    op_name = np.full(len(in_steps), -1, dtype=np.int64)
    call = timeline.kernel_call[in_steps]
    launched = np.flatnonzero(call >= 0)
    call_thread = calls.thread[call[launched]]
    for thread in distinct(call_thread).tolist():
        rows = launched[call_thread == thread]
        frames = trace.frames(int(thread))
        op = frames.enclosing_op(frames.innermost_of(calls.start_us[call[rows]], calls.end_us[call[rows]]))
        op_name[rows] = frames.name_ids_at(op)
    empty_name = trace.name_id("")
    if empty_name >= 0:  # an op with an empty name counts as no op, as "(no op)" is its label
        op_name[op_name == empty_name] = -1
    # Ops ranked by GPU time, ties in order of their first kernel; bincount adds each op's kernel
    # times in kernel order, as a running sum would.
    ops, first, inverse = np.unique(op_name, return_index=True, return_inverse=True)
    op_us = np.bincount(inverse, weights=kernels.dur_us[in_steps])
    op_n = np.bincount(inverse)
    top_ops = [
        {
            "op": trace.names[int(ops[i])] if ops[i] >= 0 else "(no op)",
            "kernels": int(op_n[i]),
            "total_ms": round(float(op_us[i]) / 1e3, 4),
            "pct": round(100 * float(op_us[i]) / total_us, 2),
        }
        for i in np.lexsort((first, -op_us))[:TOP_N].tolist()
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
