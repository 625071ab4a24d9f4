"""The facts every analysis needs from one trace: step windows, GPU busy time, kernel <-> launch joins."""

from __future__ import annotations

import re

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.collectives import CommSpans, comm_kernel_mask, comm_spans
from trainprof.analysis.intervals import Coverage
from trainprof.analysis.runtime_calls import call_kind, kind_code, kind_codes
from trainprof.trace import EventTable, Trace

_STEP_NAME = re.compile(r"^ProfilerStep#(\d{1,18})$")  # longer: no step (int() refuses 4300+ digits)


def is_launch_call(name: str) -> bool:
    """A call that submits GPU work: a kernel launch or a graph launch, CUDA or HIP (see runtime_calls)."""
    return call_kind(name) in ("launch", "graph_launch")


class StepWindow(msgspec.Struct):
    """One profiled step: the CPU span of its `ProfilerStep#N` annotation (µs)."""

    number: int
    start_us: float
    end_us: float


class Timeline(msgspec.Struct):
    """Shared, precomputed views of one trace (built once by `build_timeline`)."""

    trace: Trace
    steps: list[StepWindow]
    has_step_annotations: bool
    calls: EventTable  # cuda_runtime + cuda_driver, sorted by start
    kernels: EventTable
    gpu_busy: Coverage  # union of kernels, memcpys, memsets
    kernel_call: np.ndarray  # per kernel: index into `calls` of its launch, -1 if unmatched
    kernel_step: np.ndarray  # per kernel: index into `steps` (by launch time), -1 outside steps
    # per kernel: launched before the trace began (the backlog of earlier steps; in no step's kernels)
    kernel_before_trace: np.ndarray
    kernel_is_comm: np.ndarray  # per kernel: communication (`collectives.comm_kernel_mask`)
    call_is_launch: np.ndarray  # launches and graph launches
    call_kind: np.ndarray  # per call: index into runtime_calls.KINDS
    name_kind: np.ndarray  # per name of `trace.names`: index into runtime_calls.KINDS of its call_kind
    kernel_is_replay: np.ndarray  # per kernel: launched by a graph launch (a replay, no launch of its own)
    # the training loop's thread: ProfilerStep#'s, else the busiest of those that launch GPU work
    main_thread: int | None
    comm: CommSpans  # communication kernels, or the host's collectives on a trace with no GPU work

    def step_of(self, t_us) -> np.ndarray:
        """Index into `steps` of the window holding each time, -1 outside every step."""
        starts = np.array([s.start_us for s in self.steps])
        ends = np.array([s.end_us for s in self.steps])
        t = np.asarray(t_us, dtype=np.float64)
        k = np.searchsorted(starts, t, side="right") - 1
        kc = np.clip(k, 0, None)
        return np.where((k >= 0) & (t <= ends[kc]), k, -1)


def build_timeline(trace: Trace) -> Timeline:
    """Step windows (ProfilerStep#N, else the whole trace as step 0) and the kernel/launch joins."""
    ev = trace.events
    annotations = ev["user_annotation"]
    steps = []
    step_threads = []
    for i in range(len(annotations)):
        match = _STEP_NAME.match(trace.names[int(annotations.name[i])])
        if match:
            start = float(annotations.start_us[i])
            steps.append(StepWindow(int(match.group(1)), start, start + float(annotations.dur_us[i])))
            step_threads.append(int(annotations.thread[i]))
    has_steps = bool(steps)
    if not steps:
        starts = [t.start_us[0] for t in ev.values() if len(t)]
        ends = [t.end_us.max() for t in ev.values() if len(t)]
        steps = [StepWindow(0, float(min(starts)), float(max(ends)))]
    steps.sort(key=lambda s: s.start_us)

    runtime, driver = ev["cuda_runtime"], ev["cuda_driver"]
    calls = EventTable.from_columns(
        np.concatenate((runtime.start_us, driver.start_us)),
        np.concatenate((runtime.dur_us, driver.dur_us)),
        np.concatenate((runtime.thread, driver.thread)),
        np.concatenate((runtime.name, driver.name)),
        np.concatenate((runtime.correlation, driver.correlation)),
        np.concatenate((runtime.value, driver.value)),
    )
    name_kind = kind_codes(trace.names)
    call_kind = name_kind[calls.name] if len(calls) else np.zeros(0, np.int8)
    call_is_launch = (call_kind == kind_code("launch")) | (call_kind == kind_code("graph_launch"))

    kernels = ev["kernel"]
    kernel_call = _join_correlation(kernels.correlation, calls.correlation)
    kernel_is_replay = (kernel_call >= 0) & (
        call_kind[np.clip(kernel_call, 0, None)] == kind_code("graph_launch") if len(calls) else False
    )
    gpu = [ev["kernel"], ev["gpu_memcpy"], ev["gpu_memset"]]
    gpu_busy = Coverage(np.concatenate([t.start_us for t in gpu]), np.concatenate([t.end_us for t in gpu]))
    main_thread: int | None
    if step_threads:
        main_thread = max(set(step_threads), key=step_threads.count)
    else:
        main_thread = _busiest_thread(trace, calls.thread[call_is_launch])
    kernel_is_comm = comm_kernel_mask(trace, kernels, calls, kernel_call)
    timeline = Timeline(
        trace=trace,
        steps=steps,
        has_step_annotations=has_steps,
        calls=calls,
        kernels=kernels,
        gpu_busy=gpu_busy,
        kernel_call=kernel_call,
        kernel_step=np.zeros(0, dtype=np.int64),
        kernel_before_trace=_launched_before_trace(kernels.correlation, kernel_call, calls.correlation),
        kernel_is_comm=kernel_is_comm,
        call_is_launch=call_is_launch,
        call_kind=call_kind,
        name_kind=name_kind,
        kernel_is_replay=kernel_is_replay,
        main_thread=main_thread,
        comm=comm_spans(trace, kernels, kernel_is_comm),
    )
    # A kernel belongs to the step whose CPU code launched it (its GPU run may spill past the window).
    launched_at = (
        np.where(kernel_call >= 0, calls.start_us[np.clip(kernel_call, 0, None)], kernels.start_us)
        if len(kernels) and len(calls)
        else kernels.start_us
    )
    timeline.kernel_step = np.where(timeline.kernel_before_trace, -1, timeline.step_of(launched_at))
    return timeline


def _launched_before_trace(
    kernel_corr: np.ndarray, kernel_call: np.ndarray, call_corr: np.ndarray
) -> np.ndarray:
    """Per kernel: its launch is not in the trace and its correlation id is below every call's.

    Correlation ids grow with each launch, so such a kernel was queued before recording began: the
    GPU is still running earlier steps' work (the host ran ahead). It is GPU busy time where it runs,
    but none of the step's own kernels (on an MI300 ResNet trace, 757 of 2,995 kernels, which made
    the first step's 746 launches look like 1,383 kernels). Traces without correlation ids keep
    every kernel in the step it starts in.
    """
    known = call_corr[call_corr >= 0]
    if known.size == 0:
        return np.zeros(len(kernel_corr), dtype=bool)
    return (kernel_call < 0) & (kernel_corr >= 0) & (kernel_corr < known.min())


def _busiest_thread(trace: Trace, launching: np.ndarray) -> int | None:
    """Among the threads that launch GPU work (`launching`: the thread of each launch call; all
    threads when none launches), the one whose recorded frames (ops, annotations, Python) cover the
    most time.

    Without `ProfilerStep#` ranges this is the training loop's thread: autograd's backward thread
    may launch more kernels, but only the loop's thread is busy for the whole run. A thread that
    launches nothing is never it: a helper asleep for the whole trace (tqdm's monitor, a watchdog
    in `threading.py wait`) covers as much time as the loop, and its wait is not what the GPU waits on.
    """
    tables = [trace.events[c] for c in ("cpu_op", "user_annotation", "python_function")]
    threads = np.concatenate([t.thread for t in tables])
    starts = np.concatenate([t.start_us for t in tables])
    ends = np.concatenate([t.end_us for t in tables])
    launches = np.isin(threads, launching)
    if launches.any():
        threads, starts, ends = threads[launches], starts[launches], ends[launches]
    if threads.size == 0:
        return None
    best, best_us = None, -1.0
    for thread in distinct(threads).tolist():
        on = threads == thread
        covered = Coverage(starts[on], ends[on])
        total = float((covered.ends - covered.starts).sum())
        if total > best_us:
            best, best_us = int(thread), total
    return best


def _join_correlation(gpu_corr: np.ndarray, call_corr: np.ndarray) -> np.ndarray:
    """For each GPU correlation id, the index of the call with the same id (-1 if none)."""
    if len(gpu_corr) == 0 or len(call_corr) == 0:
        return np.full(len(gpu_corr), -1, dtype=np.int64)
    order = np.argsort(call_corr, kind="stable")
    sorted_corr = call_corr[order]
    pos = np.clip(np.searchsorted(sorted_corr, gpu_corr), 0, len(sorted_corr) - 1)
    found = (sorted_corr[pos] == gpu_corr) & (gpu_corr >= 0)
    return np.where(found, order[pos], -1)
