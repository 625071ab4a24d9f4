"""Question 1: how long is each step and where does its time go (GPU kernels, copies, comms, idle; CPU)."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.intervals import Coverage
from trainprof.analysis.timeline import Timeline


def step_breakdown(timeline: Timeline) -> list[dict]:
    """One dict per step: duration and the GPU/CPU breakdown, in ms (the `steps` entries' base)."""
    trace = timeline.trace
    ev = trace.events
    a = np.array([s.start_us for s in timeline.steps])
    b = np.array([s.end_us for s in timeline.steps])
    duration = b - a

    def covered(table, mask=None):
        if mask is not None:
            table = table.select(mask)
        return Coverage(table.start_us, table.end_us).covered(a, b)

    comm = timeline.kernel_is_comm
    kernel_us = covered(ev["kernel"], ~comm)
    comm_us = covered(ev["kernel"], comm)
    memcpy_us = covered(ev["gpu_memcpy"])
    memset_us = covered(ev["gpu_memset"])
    busy_us = timeline.gpu_busy.covered(a, b)
    cpu_op_us = covered(ev["cpu_op"])
    calls = timeline.calls
    call_step = timeline.step_of(calls.start_us)
    # Per-step sums in one pass each (a mask per step would cost steps x events: 200k steps, minutes).
    n = len(timeline.steps)
    in_steps = call_step >= 0
    launches = in_steps & timeline.call_is_launch
    runtime_us = np.bincount(call_step[in_steps], weights=calls.dur_us[in_steps], minlength=n)
    launch_n = np.bincount(call_step[launches], minlength=n)
    launch_us = np.bincount(call_step[launches], weights=calls.dur_us[launches], minlength=n)
    kernel_step = timeline.kernel_step
    kernel_n = np.bincount(kernel_step[kernel_step >= 0], minlength=n)
    comm_n = np.bincount(kernel_step[(kernel_step >= 0) & comm], minlength=n)
    # Kernels queued before the trace began that run inside a step: busy time there, not its kernels.
    backlog_step = timeline.step_of(timeline.kernels.start_us[timeline.kernel_before_trace])
    backlog_n = np.bincount(backlog_step[backlog_step >= 0], minlength=n)
    steps = []
    for i, window in enumerate(timeline.steps):
        steps.append(
            {
                "step": window.number,
                "rank": trace.rank,
                "start_ms": round((window.start_us - timeline.steps[0].start_us) / 1e3, 4),
                "duration_ms": round(duration[i] / 1e3, 4),
                "gpu_busy_ms": round(busy_us[i] / 1e3, 4),
                "gpu_busy_pct": round(100.0 * busy_us[i] / duration[i], 2) if duration[i] > 0 else 0.0,
                "gpu_idle_ms": round((duration[i] - busy_us[i]) / 1e3, 4),
                "kernel_ms": round(kernel_us[i] / 1e3, 4),
                "comm_ms": round(comm_us[i] / 1e3, 4),
                "memcpy_ms": round(memcpy_us[i] / 1e3, 4),
                "memset_ms": round(memset_us[i] / 1e3, 4),
                "kernel_count": int(kernel_n[i]),
                "kernels_launched_before_trace": int(backlog_n[i]),
                "comm_kernel_count": int(comm_n[i]),
                "cpu_op_ms": round(cpu_op_us[i] / 1e3, 4),
                "cuda_runtime_ms": round(float(runtime_us[i]) / 1e3, 4),
                "launch_count": int(launch_n[i]),
                "launch_ms": round(float(launch_us[i]) / 1e3, 4),
            }
        )
    return steps
