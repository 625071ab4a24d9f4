"""FSDP2's own host time: its hooks around every unit's forward and backward (`FSDP::pre_forward`,
`FSDP::pre_backward`, `FSDP::post_backward_reduce`, ...: record_function ranges torch writes with or
without stacks), and the GPU-idle time they hold.

FSDP2 (`fully_shard`) runs Python before and after each unit's forward and backward: it copies the
unit's sharded parameters into one buffer and all-gathers them, copies them out as DTensors,
reduce-scatters the gradients, reshards. On a host the profiler slows, or a model of many small
units, that host work can leave the GPU idle. Measured (Llama 1.1B, 22 decoder layers, 2026-11-28/29,
`benchmarks/rank_checks_on_gpu.sh`, BENCHMARKS sections 25-26): on one H200 the hooks held the host
59-77 ms a step whether the model was one unit, 7 or 23; on two H200s 186 ms at 23 units and 82 ms at
7, the step 312-363 ms against 244-246. `reshard_after_forward=False` removed `pre_backward`'s
all-gathers (18.5 ms of hook time a step to 1.5 on one H200).

`fsdp_hooks` measures (per hook kind: host ms and GPU idle ms per step); `fsdp_host_finding` judges:
the GPU-idle time held by the `pre_backward` hooks is what `reshard_after_forward=False` would win
back, traded for the gathered parameters held from forward to backward.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.intervals import Coverage
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.trace.model import NESTING_SLACK_US

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.collectives import Collective
    from trainprof.analysis.thresholds import Thresholds
    from trainprof.analysis.timeline import Timeline

_HOOK = re.compile(r"^FSDP::(\w*)")
_UNIT = re.compile(r"^FSDP::pre_forward \((.+)\)$")


class HookTime(Record, frozen=True):
    """One FSDP2 hook kind (`pre_forward`, `pre_backward`, `post_backward_reduce`, ...): its host
    ms per step (its outermost ranges, every thread), the GPU-idle ms per step inside them, and the
    GPU ms per step of the kernels launched from them (copy-in, all-gather, copy-out, ...)."""

    hook: str
    host_ms_per_step: float
    gpu_idle_ms_per_step: float
    kernel_ms_per_step: float


class FsdpHostDetails(Record, frozen=True):
    """The FSDP2 host finding's evidence: units, the hooks' host and GPU-idle ms per step in all and
    by kind (most idle first), the bytes the forward all-gathers per step, and the step it is judged
    against."""

    units: int
    host_ms_per_step: float
    gpu_idle_ms_per_step: float
    hooks: list[HookTime]
    all_gather_bytes_per_step: float | None
    """Bytes the forward's all-gathers bring in per step (those launched before the step's first
    `pre_backward` hook): what `reshard_after_forward=False` keeps gathered into the backward."""
    step_ms: float


def fsdp_hooks(timeline: Timeline) -> tuple[list[HookTime], int]:
    """Per hook kind, its host and GPU-idle ms per step, most GPU idle first; and the units (distinct
    modules with a `pre_forward` hook; the root's carries no name). Empty without FSDP2's ranges."""
    trace = timeline.trace
    marks = trace.events["user_annotation"]
    if not len(marks) or not timeline.steps:
        return [], 0
    is_hook = trace.names_matching(lambda name: name.startswith("FSDP::"))[marks.name]
    rows = np.flatnonzero(is_hook & (timeline.step_of(marks.start_us) >= 0))
    if not rows.size:
        return [], 0
    spans: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    units = set()
    for row in rows.tolist():
        name = trace.names[int(marks.name[row])]
        match = _HOOK.match(name)  # every row's name starts with FSDP:: (`is_hook`)
        hook = match.group(1) if match is not None else ""
        spans[hook][0].append(float(marks.start_us[row]))
        spans[hook][1].append(float(marks.end_us[row]))
        if hook == "pre_forward":  # the root's carries no module name
            unit = _UNIT.match(name)
            units.add(unit.group(1) if unit else "")
    n = len(timeline.steps)
    kernels, launches = timeline.kernels, timeline.kernel_call
    launched = launches >= 0
    launch_at = np.where(launched, timeline.calls.start_us[np.maximum(launches, 0)], np.nan)
    out = []
    for hook, (starts, ends) in spans.items():
        held = Coverage(np.asarray(starts), np.asarray(ends))
        host_us = float((held.ends - held.starts).sum())
        busy_us = float(timeline.gpu_busy.covered(held.starts, held.ends).sum())
        inside = launched & (held.covered(launch_at, launch_at + NESTING_SLACK_US) > 0)
        kernel_us = float(kernels.dur_us[inside].sum())
        out.append(HookTime(hook, round(host_us / 1e3 / n, 4), round((host_us - busy_us) / 1e3 / n, 4),
                            round(kernel_us / 1e3 / n, 4)))
    out.sort(key=lambda row: -row.gpu_idle_ms_per_step)
    return out, len(units)


def fsdp_host_finding(
    timeline: Timeline,
    calls: list[Collective],
    basis: StepBasis,
    rank: int | None,
    thresholds: Thresholds,
) -> Finding | None:
    """A finding where FSDP2's hooks hold `fsdp_host_min_share` of the host's step window in GPU-idle
    time (module docstring); its gain is what `reshard_after_forward=False` wins back: the
    `pre_backward` hooks' GPU-idle time (as much of it as an un-profiled step keeps), judged against
    the trace's judged step (`basis`)."""
    step_ms = basis.window_ms
    hooks, units = fsdp_hooks(timeline)
    if not hooks or step_ms <= 0:
        return None
    trace = timeline.trace
    marks = trace.events["user_annotation"]
    is_hook = trace.names_matching(lambda name: name.startswith("FSDP::"))[marks.name]
    all_hooks = Coverage(marks.start_us[is_hook], marks.end_us[is_hook])
    n = len(timeline.steps)
    a = np.array([w.start_us for w in timeline.steps])
    b = np.array([w.end_us for w in timeline.steps])
    host_ms = float(all_hooks.covered(a, b).sum()) / 1e3 / n
    spans_us = float((all_hooks.ends - all_hooks.starts).sum())
    idle_ms = (spans_us - float(timeline.gpu_busy.covered(all_hooks.starts, all_hooks.ends).sum())) / 1e3 / n
    if idle_ms < thresholds.fsdp_host_min_share * step_ms:
        return None
    by_hook = {row.hook: row for row in hooks}
    backward = by_hook.get("pre_backward")
    # Without the backward's all-gathers their hook's GPU-idle time and their kernels both go.
    recorded_ms = backward.gpu_idle_ms_per_step + backward.kernel_ms_per_step if backward is not None else 0.0
    won_ms = basis.idle_gain(recorded_ms)
    # A backward that still gathers: its hooks hold a share of the step worth a fix of its own.
    gathers_in_backward = recorded_ms >= thresholds.fsdp_reshard_min_share * step_ms
    gathered = _forward_gathered_bytes(timeline, calls)
    listed = ", ".join(f"{row.hook} {row.gpu_idle_ms_per_step:.1f}" for row in hooks[:3])
    held = (
        f" (the units' gathered parameters, held from forward to backward: the forward's all-gathers "
        f"move {gathered / 2**30:.2f} GiB a step on this rank)"
        if gathered else " (the units' gathered parameters, held from forward to backward)"
    )
    return Finding(
        kind="fsdp_host",
        title=(
            f"FSDP2's hooks hold the host {host_ms:.1f} ms/step over {units} unit(s), the GPU idle "
            f"{idle_ms:.1f} ms/step meanwhile ({listed} ms/step by hook); part of the GPU-idle time the "
            "launch and host findings hold" + basis.idle_note(recorded_ms)
        ),
        severity=severity_for(won_ms, basis.judged_ms, thresholds),
        op="FSDP::pre_backward" if backward is not None else None,
        where=Where(),
        count=n,
        per_step=1.0,
        cost_ms=round(idle_ms * n, 4),
        fix=(
            (f"`reshard_after_forward=False` on the units whose parameters fit removes the backward's "
             f"all-gathers and their hook work (`pre_backward`), at the cost of memory{held}. "
             if gathers_in_backward
             else "The backward gathers next to nothing already (`reshard_after_forward=False`). ")
            + "Fewer, larger units (`fully_shard` over several blocks) run fewer hooks: on two H200s a unit "
            "per 4 of a Llama 1.1B's 22 layers took them from 186 to 82 ms of host time a step and the "
            "step from 312-363 to 244-246 ms (on one H200, no change): a larger unit gathers more "
            "parameters at once and hides less of its first all-gather. torch.compile (compiled autograd "
            "with FSDP2) and larger micro-batches spread the hooks over more work."
        ),
        rank=rank,
        cause="FSDP2's per-unit hooks (copy-in, all-gather, copy-out, reduce-scatter) on the host",
        gpu_ms_per_step=round(won_ms, 4),
        details=FsdpHostDetails(
            units=units,
            host_ms_per_step=round(host_ms, 4),
            gpu_idle_ms_per_step=round(idle_ms, 4),
            hooks=hooks,
            all_gather_bytes_per_step=gathered,
            step_ms=round(step_ms, 4),
        ),
    )


def _forward_gathered_bytes(timeline: Timeline, calls: list[Collective]) -> float | None:
    """Bytes per step of the all-gathers launched before each step's first `pre_backward` hook (all of
    them where a step has none); None without all-gathers of known size."""
    trace = timeline.trace
    marks = trace.events["user_annotation"]
    backward = trace.names_matching(lambda name: name.startswith("FSDP::pre_backward"))[marks.name]
    first: dict[int, float] = {}
    for row in np.flatnonzero(backward).tolist():
        step = int(timeline.step_of(marks.start_us[row : row + 1])[0])
        if step >= 0:
            window = timeline.steps[step]
            offset = float(marks.start_us[row]) - window.start_us
            first[window.number] = min(first.get(window.number, offset), offset)
    forward = [
        c.bytes for c in calls
        if c.op == "all_gather" and c.bytes and c.launch_offset_us < first.get(c.step, float("inf"))
    ]
    return round(sum(forward) / len(timeline.steps), 1) if forward else None
