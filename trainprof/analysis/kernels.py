"""Question 5: which kernels and which ops take the GPU time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.thresholds import TOP_ROWS

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.timeline import Timeline
    from trainprof.trace import EventTable, Trace
    from trainprof.trace.model import ThreadFrames


class KernelTime(Record, frozen=True):
    """One kernel name's GPU time in the steps: calls, total ms, mean µs, % of all kernel time."""

    name: str
    count: int
    total_ms: float
    mean_us: float
    pct: float


class OpTime(Record, frozen=True):
    """One op's GPU time in the steps: the kernels launched with it innermost; where no op encloses
    a launch, the Python function or annotation that does (`kernel_ops`), else `(no op)`."""

    op: str
    kernels: int
    total_ms: float
    pct: float


class TopKernelsDetails(Record, frozen=True):
    """The top-kernels finding's evidence: kernels and ops by GPU time, most first."""

    kernels: list[KernelTime]
    ops: list[OpTime]
    top_kernel: str
    kernel_ms_per_step: float


def kernel_ops(timeline: Timeline, kernels: np.ndarray, frame_fallback: bool = False) -> np.ndarray:
    """Per kernel (rows of `timeline.kernels`), its op: the name id of the innermost cpu_op around
    its launch call, or -1 (no launch in the trace, no op around it, or an op with an empty name,
    which reports label "(no op)" as well).

    With `frame_fallback`, a launch that no op encloses takes the innermost Python function or
    annotation around it instead (`ProfilerStep#N` excepted): libraries that launch from their own
    extension code (DeepEP, DeepGEMM, FlashMLA) record no op, only the Python call that made it.
    """
    call = timeline.kernel_call[kernels]
    op_name = np.full(len(kernels), -1, dtype=np.int64)
    launched = np.flatnonzero(call >= 0)
    op_name[launched] = ops_around_calls(timeline.trace, timeline.calls, call[launched], frame_fallback)
    return op_name


def ops_around_calls(
    trace: Trace, calls: EventTable, call_rows: np.ndarray, frame_fallback: bool = False
) -> np.ndarray:
    """Per runtime call (rows of `calls`), the name id of the innermost cpu_op around it, or -1
    (`frame_fallback`: see `kernel_ops`). Found per calling thread at once: a walk per kernel cost
    10 ms on ddp_straggler's 5k kernels."""
    op_name = np.full(len(call_rows), -1, dtype=np.int64)
    call_thread = calls.thread[call_rows]
    for thread in distinct(call_thread).tolist():
        rows = np.flatnonzero(call_thread == thread)
        frames = trace.frames(int(thread))
        inner = frames.innermost_of(calls.start_us[call_rows[rows]], calls.end_us[call_rows[rows]])
        op_name[rows] = frames.name_ids_at(frames.enclosing_op(inner))
        if frame_fallback:
            missing = np.flatnonzero(op_name[rows] < 0)
            named = frames.nearest_marked(inner[missing], _named_frames(trace, frames))
            op_name[rows[missing]] = frames.name_ids_at(named)
    empty_name = trace.name_id("")
    if empty_name >= 0:
        op_name[op_name == empty_name] = -1
    return op_name


def _named_frames(trace: Trace, frames: ThreadFrames) -> np.ndarray:
    """Per frame of a thread, whether it may name a kernel that no op encloses: a Python function
    or an annotation, not a `ProfilerStep#N` range (which encloses everything)."""
    step_names = trace.names_matching(lambda name: name.startswith("ProfilerStep#"))
    return ~step_names[frames.name_ids] if len(frames.name_ids) else np.zeros(0, dtype=bool)


def _op_names(trace: Trace, op_rows: np.ndarray) -> np.ndarray:
    """The name ids of cpu_op rows (-1: none, or an op with an empty name), as `kernel_ops` gives them."""
    cpu_ops = trace.events["cpu_op"]
    if not len(cpu_ops):
        return np.full(len(op_rows), -1, dtype=np.int64)
    names = np.where(op_rows >= 0, cpu_ops.name[np.clip(op_rows, 0, None)], -1)
    empty_name = trace.name_id("")
    if empty_name >= 0:
        names[names == empty_name] = -1
    return names.astype(np.int64)


def top_kernels_finding(
    timeline: Timeline, rank: int | None, launch_op: np.ndarray | None = None
) -> Finding | None:
    """An info finding listing the kernels and the (innermost) ops with the most GPU time in the steps.

    `launch_op`: per kernel, the cpu_op row of the innermost op around its launch, when the caller
    has it (`attribution.KernelOwners.launch_op`: the same ops `kernel_ops` finds, already found)."""
    trace, kernels = timeline.trace, timeline.kernels
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
    top = np.argsort(-by_name_us)[:TOP_ROWS]
    n_steps = max(len(timeline.steps), 1)
    top_kernels = [
        KernelTime(
            name=trace.names[i],
            count=int(by_name_n[i]),
            total_ms=float(round(by_name_us[i] / 1e3, 4)),
            mean_us=float(round(by_name_us[i] / by_name_n[i], 3)),
            pct=float(round(100 * by_name_us[i] / total_us, 2)),
        )
        for i in top
        if by_name_n[i]
    ]

    if launch_op is not None and len(launch_op) == len(kernels):
        op_name = _op_names(trace, launch_op[in_steps])
        # Only the launches no op encloses are looked up again, for the frame around them.
        unnamed = np.flatnonzero(op_name < 0)
        if unnamed.size:
            op_name[unnamed] = kernel_ops(timeline, in_steps[unnamed], frame_fallback=True)
    else:
        op_name = kernel_ops(timeline, in_steps, frame_fallback=True)
    # Ops ranked by GPU time, ties in order of their first kernel; bincount adds each op's kernel
    # times in kernel order, as a running sum would.
    ops, first, inverse = np.unique(op_name, return_index=True, return_inverse=True)
    op_us = np.bincount(inverse, weights=kernels.dur_us[in_steps])
    op_n = np.bincount(inverse)
    top_ops = [
        OpTime(
            op=trace.names[int(ops[i])] if ops[i] >= 0 else "(no op)",
            kernels=int(op_n[i]),
            total_ms=round(float(op_us[i]) / 1e3, 4),
            pct=round(100 * float(op_us[i]) / total_us, 2),
        )
        for i in np.lexsort((first, -op_us))[:TOP_ROWS].tolist()
    ]
    head = top_kernels[0]
    return Finding(
        kind="top_kernels",
        title=f"Top GPU time: {top_ops[0].op} ({top_ops[0].pct:.0f}% of kernel time)",
        severity="info",
        op=top_ops[0].op,
        where=Where(),
        count=int(in_steps.size),
        per_step=round(in_steps.size / n_steps, 2),
        cost_ms=round(total_us / 1e3, 4),
        fix=None,
        rank=rank,
        details=TopKernelsDetails(
            kernels=top_kernels,
            ops=top_ops,
            top_kernel=head.name,
            kernel_ms_per_step=round(total_us / 1e3 / n_steps, 4),
        ),
    )
