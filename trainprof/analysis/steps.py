"""Question 1: how long is each step and where does its time go (GPU kernels, copies, comms, idle; CPU)."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.intervals import Coverage
from trainprof.analysis.records import Record
from trainprof.analysis.timeline import Timeline


class StepTimes(Record, frozen=True, rename={"number": "step"}):
    """One step's duration and where its time went, in ms (counts as counts); the first part of a
    step row (`trainprof.analysis.result.Step`). `gpu_idle_ms` is None when the trace has no GPU
    work at all (no kernel and no busy time in any step): there is no GPU to be idle."""

    number: int
    """The profiler's step number (`ProfilerStep#N`); JSON `step`."""
    rank: int | None
    start_ms: float
    """From the first step's start."""
    duration_ms: float
    gpu_busy_ms: float
    """Union of kernels, copies and memsets inside the step."""
    gpu_busy_pct: float
    gpu_idle_ms: float | None
    kernel_ms: float
    """Union of compute kernels (communication kernels left out)."""
    comm_ms: float
    """Union of communication kernels (NCCL, RCCL, DeepEP, ...: `collectives`); on a trace with no
    GPU work, of the host's collectives (gloo)."""
    memcpy_ms: float
    memset_ms: float
    kernel_count: int
    """Kernels launched inside the step (communication ones included)."""
    kernels_launched_before_trace: int
    """Kernels queued before the trace began that ran inside the step (busy time, not its kernels)."""
    comm_kernel_count: int
    cpu_op_ms: float
    """Union of host ops."""
    cuda_runtime_ms: float
    """Sum of runtime calls (CUDA/HIP) on every thread."""
    launch_count: int
    launch_ms: float
    """Sum of the launch calls."""


def has_gpu_work(steps: list[StepTimes]) -> bool:
    """Whether any of a trace's steps launched a kernel or kept the GPU busy (else it ran on the CPU)."""
    return any(step.kernel_count or step.gpu_busy_ms for step in steps)


def step_breakdown(timeline: Timeline) -> list[StepTimes]:
    """Per step, its duration and the GPU/CPU breakdown."""
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
    comm_us = Coverage(timeline.comm.start_us, timeline.comm.end_us).covered(a, b)
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
    busy_ms = [float(round(busy_us[i] / 1e3, 4)) for i in range(n)]
    gpu_work = any(kernel_n[i] or busy_ms[i] for i in range(n))  # as `has_gpu_work` reads the rows
    start = timeline.steps[0].start_us if n else 0.0
    return [
        StepTimes(
            number=window.number,
            rank=trace.rank,
            start_ms=round((window.start_us - start) / 1e3, 4),
            duration_ms=float(round(duration[i] / 1e3, 4)),
            gpu_busy_ms=busy_ms[i],
            gpu_busy_pct=float(round(100.0 * busy_us[i] / duration[i], 2)) if duration[i] > 0 else 0.0,
            gpu_idle_ms=float(round((duration[i] - busy_us[i]) / 1e3, 4)) if gpu_work else None,
            kernel_ms=float(round(kernel_us[i] / 1e3, 4)),
            comm_ms=float(round(comm_us[i] / 1e3, 4)),
            memcpy_ms=float(round(memcpy_us[i] / 1e3, 4)),
            memset_ms=float(round(memset_us[i] / 1e3, 4)),
            kernel_count=int(kernel_n[i]),
            kernels_launched_before_trace=int(backlog_n[i]),
            comm_kernel_count=int(comm_n[i]),
            cpu_op_ms=float(round(cpu_op_us[i] / 1e3, 4)),
            cuda_runtime_ms=round(float(runtime_us[i]) / 1e3, 4),
            launch_count=int(launch_n[i]),
            launch_ms=round(float(launch_us[i]) / 1e3, 4),
        )
        for i, window in enumerate(timeline.steps)
    ]
