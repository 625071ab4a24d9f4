"""The forward work recomputed in backward (activation / gradient checkpointing): its GPU time per
step, the memory it saves against the headroom the trace shows, and what fewer checkpointed layers
(or none) would give.

A recomputed forward op is a forward op (a `Sequence number`, `Fwd thread id` 0: it creates an
autograd node) running inside a backward node (`autograd::engine::evaluate_function: ...`): the
formulas of backward nodes create no nodes of their own, so on the shared GPT-2, Llama and MI300
ResNet traces only a checkpoint's recompute matches (torch/utils/checkpoint.py's `recompute_fn`
under `unpack_hook`, or the reentrant `CheckpointFunctionBackward`). Its kernels are the
recompute's.

Memory, per segment (a backward node's recomputed forward): the bytes it allocates and still holds
when it ends are the activations checkpointing dropped after the forward. Without checkpointing
every segment of a step holds them at once; with it, about one at a time:

    peak without checkpointing ~ peak + sum(segment bytes) - max(segment bytes)

against the device's memory less `recompute_memory_margin_share`. A segment is about one
checkpointed layer: the segments that fit are the layers to stop checkpointing.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.attribution import BACKWARD_PREFIX, MODULE_PREFIX, KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.memory import pair_by_address
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import Thresholds
from trainprof.trace import Trace
from trainprof.trace.model import nearest_marked

CHECKPOINT_FILE = "torch/utils/checkpoint.py"


class Recomputation(Record, frozen=True):
    """The recomputed forward of a trace's profiled steps (`TraceInfo.recompute`; None without one).

    `gpu_ms_per_step`: its kernels' time; `segments_per_step`: backward nodes that recomputed
    (about one per checkpointed layer); `modules`: where, most time first; `checkpoint_frames`:
    torch.utils.checkpoint's frames are in the trace; memory (None without `profile_memory`):
    `held_bytes_per_step` (what the segments' recompute allocates and keeps), `largest_segment_bytes`,
    `peak_bytes` (the trace's), `device_bytes`, `limit_bytes` (the device's less the margin),
    `peak_without_bytes` (the estimate without checkpointing), `segments_that_fit` (of a step's
    segments, how many fit the headroom if no longer checkpointed).
    """

    gpu_ms_per_step: float
    kernels_per_step: float
    segments_per_step: float
    modules: list[str]
    checkpoint_frames: bool
    held_bytes_per_step: int | None
    largest_segment_bytes: int | None
    peak_bytes: int | None
    device_bytes: int | None
    limit_bytes: int | None
    peak_without_bytes: int | None
    segments_that_fit: int | None


def recomputation(
    trace: Trace, work: KernelWork, owners: KernelOwners, peak_bytes: int | None, thresholds: Thresholds
) -> tuple[Recomputation | None, np.ndarray]:
    """The recomputed forward (module docstring) and, per kernel of `work`, whether it is part of it."""
    none = np.zeros(len(work.rows), dtype=bool)
    ops = trace.events["cpu_op"]
    if not len(ops) or ops.sequence is None or ops.fwd_thread is None or not len(owners.op_parent):
        return None, none
    is_backward_node = trace.names_matching(lambda name: name.startswith(BACKWARD_PREFIX))[ops.name]
    forward_op = (ops.sequence >= 0) & (ops.fwd_thread == 0) & ~is_backward_node
    nearest_forward = nearest_marked(owners.op_parent, forward_op)
    parent = owners.op_parent
    above = np.where(nearest_forward >= 0, parent[np.clip(nearest_forward, 0, None)], -1)
    node_above = nearest_marked(parent, is_backward_node)
    node = np.where(above >= 0, node_above[np.clip(above, 0, None)], -1)  # per op: its recompute's node
    op = work.op
    kernel_node = np.where(op >= 0, node[np.clip(op, 0, None)], -1)
    recomputed = kernel_node >= 0
    if not recomputed.any():
        return None, none
    steps = max(work.steps, 1)
    segments = np.unique(kernel_node[recomputed])
    spans = [_span(ops, node, segment) for segment in segments.tolist()]
    held = _held_bytes(trace, spans)
    props = trace.device_properties[0] if trace.device_properties else {}
    device = props.get("totalGlobalMem") if isinstance(props.get("totalGlobalMem"), (int, float)) else None
    limit = int(device * (1.0 - thresholds.recompute_memory_margin_share)) if device else None
    held_step = int(sum(held) / steps) if held is not None else None
    largest = int(max(held)) if held else None
    without = peak_bytes + held_step - largest if held and peak_bytes is not None else None
    fit = None
    if held and peak_bytes is not None and limit is not None:
        count = int(round(len(segments) / steps))
        per_segment = held_step / count if count else 0.0
        if without <= limit or per_segment <= 0:
            fit = count
        else:  # stop checkpointing only as many layers as the headroom holds
            fit = max(0, min(count, int((limit - peak_bytes) // per_segment)))
    record = Recomputation(
        gpu_ms_per_step=round(work.per_step_ms(recomputed), 4),
        kernels_per_step=round(int(recomputed.sum()) / steps, 1),
        segments_per_step=round(len(segments) / steps, 2),
        modules=_recomputed_modules(trace, ops, segments, spans),
        checkpoint_frames=any(CHECKPOINT_FILE in name for name in trace.names),
        held_bytes_per_step=held_step,
        largest_segment_bytes=largest,
        peak_bytes=peak_bytes,
        device_bytes=int(device) if device else None,
        limit_bytes=limit,
        peak_without_bytes=int(without) if without is not None else None,
        segments_that_fit=fit,
    )
    return record, recomputed


def _span(ops, node: np.ndarray, segment: int) -> tuple[int, float, float]:
    """A segment's thread and the span of its recomputed ops."""
    mine = node == segment
    return int(ops.thread[segment]), float(ops.start_us[mine].min()), float(ops.end_us[mine].max())


def _recomputed_modules(trace: Trace, ops, segments: np.ndarray, spans: list) -> list[str]:
    """The module each segment recomputes (the longest `nn.Module` frame inside its backward node that
    overlaps its recomputed ops, without its instance number), most segments first; empty without
    module frames."""
    python = trace.events["python_function"]
    is_module = trace.names_matching(lambda name: name.startswith(MODULE_PREFIX))
    rows = np.flatnonzero(is_module[python.name]) if len(python) else np.zeros(0, dtype=np.int64)
    counts: dict[str, int] = {}
    for segment, (thread, start, end) in zip(segments.tolist(), spans, strict=True):
        inside = rows[(python.thread[rows] == thread) & (python.start_us[rows] >= ops.start_us[segment])
                      & (python.end_us[rows] <= ops.end_us[segment]) & (python.start_us[rows] <= end)
                      & (python.end_us[rows] >= start)]
        if len(inside):
            outer = inside[int(np.argmax(python.dur_us[inside]))]
            name = re.sub(r"_\d+$", "", trace.names[int(python.name[outer])].removeprefix(MODULE_PREFIX))
            counts[name] = counts.get(name, 0) + 1
    return sorted(counts, key=lambda name: -counts[name])


def _held_bytes(trace: Trace, spans: list[tuple[int, float, float]]) -> list[int] | None:
    """Per segment (a backward node's recompute), the bytes allocated on its thread while its
    recomputed ops ran and still held when they ended; None without memory events."""
    memory = trace.memory
    if not len(memory) or memory.block_bytes is None or memory.addr is None:
        return None
    usable = np.isfinite(memory.block_bytes) & np.isfinite(memory.addr) & (memory.block_bytes != 0)
    events = memory.select(usable)
    if not len(events):
        return None
    allocated = events.block_bytes > 0
    free_of, _ = pair_by_address(events.addr, allocated)
    freed_at = np.where(free_of >= 0, events.start_us[np.clip(free_of, 0, None)], np.inf)
    held = []
    for thread, start, end in spans:
        inside = allocated & (events.thread == thread) & (events.start_us >= start) & (events.start_us <= end)
        held.append(int(events.block_bytes[inside & (freed_at > end)].sum()))
    return held
