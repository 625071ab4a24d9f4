"""Question 3: is the step bound by kernel launch overhead (the CPU cannot issue tiny kernels fast enough)?"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from trainprof.analysis.arrays import median
from trainprof.analysis.attribution import attribute_kernels
from trainprof.analysis.causes import Cause
from trainprof.analysis.modules import OwnerCost, OwnerCosts, TinyOp, owner_costs
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.result import Step
from trainprof.analysis.runtime_calls import kind_code
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import LAUNCH_REGIONS_KEPT, Thresholds
from trainprof.analysis.timeline import Timeline
from trainprof.analysis.verdict import Verdict


class StepLaunch(Record, frozen=True):
    """One step's tiny kernels (shorter than their own launch) and graph replays: a part of the step row."""

    tiny_kernel_count: int
    tiny_kernel_pct: float
    """Of the step's kernels."""
    median_kernel_us: float
    graph_replay_kernel_count: int
    """Kernels replayed from CUDA/HIP graphs (no launch of their own)."""
    graph_launch_count: int
    graph_launch_ms: float


class LaunchRegion(Record, frozen=True):
    """An owner of tiny kernels: `function` names it (`GPT2Attention (fwd+bwd)` for a module, the
    function's name otherwise; None for the tiny kernels no owner was found for), `summary` says
    what it launched, `top_ops` its ops by tiny kernels."""

    function: str | None
    module: str | None
    file: str | None
    line: int | None
    tiny_kernels: int
    summary: str | None
    top_ops: list[TinyOp]


class LaunchTotals(Record, frozen=True):
    """Kernel launches over all steps of a trace: tiny, eager and replayed counts, medians, and the
    owners launching the most tiny kernels (`regions`, most first)."""

    tiny_kernel_count: int
    kernel_count: int
    graph_replay_kernel_count: int
    eager_kernel_count: int
    median_launch_us: float | None
    median_kernel_us: float | None
    regions: list[LaunchRegion]
    unowned_tiny_kernel_count: int


def tiny_kernels(timeline: Timeline) -> np.ndarray:
    """Per kernel: ran shorter than its own launch call (see `launch_stats`); never a graph replay or
    a communication kernel."""
    kernels, calls = timeline.kernels, timeline.calls
    matched = (timeline.kernel_call >= 0) & ~timeline.kernel_is_replay
    call_index = np.clip(timeline.kernel_call, 0, None)
    launch_us = np.where(matched, calls.dur_us[call_index] if len(calls) else 0.0, np.nan)
    return matched & (kernels.dur_us < launch_us) & ~timeline.kernel_is_comm


def launch_stats(
    timeline: Timeline, costs: OwnerCosts | None = None
) -> tuple[list[StepLaunch], LaunchTotals]:
    """Per step: tiny-kernel and graph-replay counts; and, over all steps, the owners (`nn.Module`s or
    user functions, forward and backward together: `trainprof.analysis.modules`) and ops launching
    tiny kernels. `costs`: the trace's owner table when the caller has it (built here otherwise).

    A kernel is tiny when it runs shorter than the CPU call that launched it: the GPU finishes it
    before the CPU can issue the next one, so the GPU waits on the CPU. A kernel replayed from a
    CUDA/HIP graph has no launch of its own (one graph launch issues all of them): it is counted as
    a replay, never as tiny.
    """
    kernels, calls = timeline.kernels, timeline.calls
    replay = timeline.kernel_is_replay
    matched = (timeline.kernel_call >= 0) & ~replay
    call_index = np.clip(timeline.kernel_call, 0, None)
    launch_us = np.where(matched, calls.dur_us[call_index] if len(calls) else 0.0, np.nan)
    tiny = tiny_kernels(timeline)
    graph_launch = timeline.call_kind == kind_code("graph_launch")
    graph_launch_step = timeline.step_of(calls.start_us[graph_launch]) if graph_launch.any() else np.zeros(0)
    graph_launch_us = calls.dur_us[graph_launch]
    # Kernels and graph launches grouped by step once (a mask per step would cost steps x kernels:
    # 200k steps, hours).
    n_steps = len(timeline.steps)
    kernel_step = timeline.kernel_step
    kernel_count = np.bincount(kernel_step[kernel_step >= 0], minlength=n_steps)
    tiny_count = np.bincount(kernel_step[(kernel_step >= 0) & tiny], minlength=n_steps)
    replay_count = np.bincount(kernel_step[(kernel_step >= 0) & replay], minlength=n_steps)
    kernel_us = _by_step(kernel_step, kernels.dur_us, n_steps)
    graph_launch_step = np.asarray(graph_launch_step, dtype=np.int64)
    graph_us = _by_step(graph_launch_step, graph_launch_us, n_steps)
    per_step = []
    for i in range(n_steps):
        count, tiny_here = int(kernel_count[i]), int(tiny_count[i])
        launched_us = graph_us.get(i, np.zeros(0))
        per_step.append(
            StepLaunch(
                tiny_kernel_count=tiny_here,
                tiny_kernel_pct=round(100.0 * tiny_here / count, 2) if count else 0.0,
                median_kernel_us=round(median(kernel_us[i].tolist()), 3) if count else 0.0,
                graph_replay_kernel_count=int(replay_count[i]),
                graph_launch_count=len(launched_us),
                graph_launch_ms=round(float(launched_us.sum()) / 1e3, 4),
            )
        )

    if costs is None:
        costs = owner_costs(timeline, attribute_kernels(timeline), tiny)
    region_list = [_region(row, costs.steps) for row in costs.rows if row.tiny_kernels]
    if costs.unowned_tiny_kernels:  # e.g. every tiny kernel of a trace without Python stacks
        region_list.append(
            LaunchRegion(
                function=None,
                module=None,
                file=None,
                line=None,
                tiny_kernels=costs.unowned_tiny_kernels,
                summary=None,
                top_ops=costs.unowned_tiny_ops,
            )
        )
    region_list = sorted(region_list, key=lambda region: -region.tiny_kernels)[:LAUNCH_REGIONS_KEPT]
    tiny_in_steps = np.flatnonzero(tiny & (timeline.kernel_step >= 0))
    in_steps = timeline.kernel_step >= 0
    totals = LaunchTotals(
        tiny_kernel_count=int(tiny_in_steps.size),
        kernel_count=int(in_steps.sum()),
        graph_replay_kernel_count=int((replay & in_steps).sum()),
        eager_kernel_count=int((~replay & in_steps).sum()),
        median_launch_us=round(median(launch_us[matched].tolist()), 3) if matched.any() else None,
        median_kernel_us=round(median(kernels.dur_us.tolist()), 3) if len(kernels) else None,
        regions=region_list,
        unowned_tiny_kernel_count=costs.unowned_tiny_kernels,
    )
    return per_step, totals


def _by_step(step: np.ndarray, values: np.ndarray, n_steps: int) -> dict[int, np.ndarray]:
    """Per step that has any, its `values` (rows with `step` in 0..n_steps-1), in row order."""
    rows = np.flatnonzero((step >= 0) & (step < n_steps))
    rows = rows[np.argsort(step[rows], kind="stable")]
    present, first = np.unique(step[rows], return_index=True)
    if not len(rows):
        return {}
    return dict(zip(present.tolist(), np.split(values[rows], first[1:]), strict=True))


def _region(row: OwnerCost, steps: int) -> LaunchRegion:
    """One owner of tiny kernels for the finding."""
    return LaunchRegion(
        function=f"{row.label} ({row.phases})" if row.module_path else row.function,
        module=row.module_path,
        file=row.file,
        line=row.line,
        tiny_kernels=row.tiny_kernels,
        summary=row.sentence(steps),
        top_ops=row.tiny_ops,
    )


class LaunchDetails(Record, frozen=True):
    """The launch-overhead finding's evidence: the fixes in order, the figures behind the title,
    the owners of tiny kernels, and the trace's verdict."""

    fixes: list[str]
    tiny_kernel_pct: float
    """Of the eagerly launched kernels (graph replays have no launch of their own)."""
    kernels_per_step: float
    graph_replay_kernels_per_step: float
    graph_launch_ms_per_step: float
    launch_ms_per_step: float
    median_launch_us: float | None
    median_kernel_us: float | None
    gpu_idle_while_launching_ms_per_step: float
    regions: list[LaunchRegion]
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; the verdict in its own JSON form."""
        return {**msgspec.to_builtins(self), "verdict": self.verdict.to_dict()}


_NO_REGION = LaunchRegion(None, None, None, None, 0, None, [])


def launch_finding(
    verdict: Verdict,
    totals: LaunchTotals,
    steps: list[Step],
    rank: int | None,
    basis: StepBasis,
    thresholds: Thresholds | None = None,
    recompiling: bool = False,
    inference: bool = False,
) -> Finding | None:
    """The launch-overhead finding, when the verdict or the tiny-kernel share says launches limit the step.

    The tiny-kernel share counts eagerly launched kernels only (graph replays have no launch of their
    own). Where part of the work already replays from graphs, the finding says so and does not advise
    graphs for it, only for the eager kernels that remain. A step that recompiles every time
    (`recompiling`) gets no CUDA-graph advice: a graph recorded for one shape does not replay for the
    next; its recompile finding comes first. An inference loop (`inference`: no backward, no optimizer
    step) gets no optimizer advice. Its gain and severity: the GPU idle while launching, as much of
    it as an un-profiled step keeps, against the trace's judged step (`basis`).
    """
    limits = thresholds or Thresholds()
    n = max(len(steps), 1)
    tiny_pct = 100.0 * totals.tiny_kernel_count / max(totals.eager_kernel_count, 1)
    if verdict.label == "cpu-only":
        return None
    launch_bound = verdict.label == "launch-bound"
    many_tiny = tiny_pct >= limits.tiny_kernel_pct and verdict.gpu_busy_pct < limits.tiny_kernel_busy_pct
    if not launch_bound and not (many_tiny and totals.tiny_kernel_count > 0):
        return None
    # The owner (module or user function) of the most tiny kernels; the unowned rest only when no owner.
    regions = totals.regions
    region = next((r for r in regions if r.function), regions[0] if regions else _NO_REGION)
    # One op, the one behind most of the owner's tiny kernels (the rest are in details.regions).
    top_op = region.top_ops[0].op if region.top_ops else None
    loop_owner = region.function if not region.module else None
    replays = totals.graph_replay_kernel_count
    graph_fix = (
        f"{replays / n:.0f} kernels/step already replay from CUDA/HIP graphs; capture the eagerly launched "
        "rest too (torch.compile(mode='reduce-overhead') or torch.cuda.graph around the region that "
        "launches the tiny kernels)."
        if replays
        else "Capture the step with CUDA graphs or torch.compile(mode='reduce-overhead') so one launch "
        "replays hundreds of kernels."
    )
    optimizer_fix = (
        "Use a foreach/fused optimizer (torch.optim.AdamW(..., fused=True) or foreach=True) and "
        "clip_grad_norm_(foreach=True)."
    )
    fixes = [
        *([] if recompiling else [graph_fix]),
        *([] if inference else [optimizer_fix]),
        "Replace Python loops over parameters/tensors with one batched op (torch._foreach_norm, "
        "torch.stack + one reduction)" + (f" in {loop_owner}" if loop_owner else "") + ".",
        "Give each kernel more work: a larger batch or sequence per step (or fewer, larger ops).",
    ]
    idle_launch_ms = sum(s.idle.costs[Cause.LAUNCH] if s.idle is not None else 0.0 for s in steps)
    where_fn = region.function
    return Finding(
        kind="launch_overhead",
        title=(
            f"{'Launch-bound' if launch_bound else 'Many tiny kernels'}: "
            f"{totals.kernel_count / n:.0f} kernels/step"
            + (f" ({replays / n:.0f} replayed from graphs)" if replays else "")
            + f", {tiny_pct:.0f}% of those launched eagerly shorter than their launch; "
            f"GPU busy {verdict.gpu_busy_pct:.0f}%"
            + (f"; most tiny kernels from {region.summary or where_fn}" if where_fn else "")
            + basis.idle_note(idle_launch_ms / n)
        ),
        severity=severity_for(basis.idle_gain(idle_launch_ms / n), basis.judged_ms, limits),
        op=top_op,
        where=Where(file=region.file, line=region.line, function=where_fn),
        count=totals.tiny_kernel_count,
        per_step=round(totals.tiny_kernel_count / n, 2),
        cost_ms=round(idle_launch_ms, 4),
        rank=rank,
        fix=" ".join(f"{i}) {f}" for i, f in enumerate(fixes, 1)),
        gpu_ms_per_step=round(basis.idle_gain(idle_launch_ms / n), 4),
        details=LaunchDetails(
            fixes=fixes,
            tiny_kernel_pct=round(tiny_pct, 2),
            kernels_per_step=round(totals.kernel_count / n, 1),
            graph_replay_kernels_per_step=round(replays / n, 1),
            graph_launch_ms_per_step=round(sum(s.launch.graph_launch_ms for s in steps) / n, 4),
            launch_ms_per_step=round(sum(s.times.launch_ms for s in steps) / n, 4),
            median_launch_us=totals.median_launch_us,
            median_kernel_us=totals.median_kernel_us,
            gpu_idle_while_launching_ms_per_step=round(idle_launch_ms / n, 4),
            regions=totals.regions,
            verdict=verdict,
        ),
    )
