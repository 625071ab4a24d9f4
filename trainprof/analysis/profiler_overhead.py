"""How much host time did the profiler add to a trace recorded without un-profiled steps beside it,
and could that have made its verdict?

torch.profiler costs the host time for every op it records (more with shapes, memory and stacks)
and for every Python call it records with stacks; a loop whose host kept just ahead of the GPU
falls behind while recorded and reads `launch-bound` or `host-bound` from its trace alone. A session
times the loop's un-profiled steps and judges on them (`profiler_cost`); a trace recorded elsewhere
has none, so this estimates the added time from what the trace shows it recorded per step:

    added_ms = ops x cost per op (by the options the trace was recorded with)
             + Python calls x cost per call (stacks only)

and, where removing it would leave the GPU busy `gpu_bound_busy_pct` of the step, the headline says
the verdict may be the profiler's, and how to confirm. The costs per event are measured on the H200
machine's host (`benchmarks.profiler_event_cost`, 2026-11-28; BENCHMARKS section 24): tiny ops in a
loop add 2.7 µs each with no option, 3.3 with shapes (and memory), 4.2 with stacks too, and 0.28 µs
per Python call with stacks. Real training loops' ops carry more inputs and allocations: three H200
fixtures whose host bound their recorded steps (`busy/gpt2_attention/sdpa_vocab64`,
`busy/small_mlp/eager`, `stacks/hf_trainer_session`) lost 5.3-6.6 µs per recorded op to the profiler
(stacks, shapes and memory). The model takes 6 µs there and scales the other option sets by the
micro-benchmark's ratios: an estimate for a caveat, never a verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.records import Record

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.thresholds import Thresholds
    from trainprof.analysis.timeline import Timeline
    from trainprof.analysis.verdict import Verdict

OP_US_WITH_STACKS = 6.0
"""Host µs the profiler adds per recorded op with stacks, shapes and memory (module docstring)."""
OP_SHARE_BY_OPTIONS = {"none": 2.7 / 4.2, "shapes": 3.3 / 4.2, "stack": 1.0}
"""Per recorded op, the share of `OP_US_WITH_STACKS` with fewer options (the micro-benchmark's ratios)."""
PYTHON_CALL_US = 0.28
"""Host µs the profiler adds per Python call it records (with stacks)."""
HOST_VERDICTS = frozenset({"launch-bound", "host-bound", "mixed"})
"""Verdicts the profiler's host cost can make: the GPU waits on a host that the profiler slows."""


class ProfilerHostEstimate(Record, frozen=True):
    """The profiler's estimated host cost per recorded step of a trace without un-profiled steps:
    what it recorded per step, the options it was recorded with, the added host ms, and the GPU's
    busy share of the step less that time (`could_be_gpu_bound`: at least `gpu_bound_busy_pct`)."""

    ops_per_step: float
    python_calls_per_step: float
    options: str
    """`stack`, `shapes` (shapes or memory, no stacks) or `none`."""
    added_ms_per_step: float
    gpu_busy_pct_without: float
    could_be_gpu_bound: bool


def profiler_host_estimate(
    timeline: Timeline, verdict: Verdict, thresholds: Thresholds
) -> ProfilerHostEstimate | None:
    """The trace's `ProfilerHostEstimate` (module docstring); None without steps or GPU work."""
    trace = timeline.trace
    if not timeline.steps or verdict.idle is None or verdict.step_ms <= 0:
        return None
    start, end, n = timeline.steps[0].start_us, timeline.steps[-1].end_us, len(timeline.steps)

    def per_step(category: str) -> float:
        starts = trace.events[category].start_us
        return float(np.count_nonzero((starts >= start) & (starts < end))) / n

    ops, calls = per_step("cpu_op"), per_step("python_function")
    ops_table = trace.events["cpu_op"]
    shapes = ops_table.inputs is not None and bool((ops_table.inputs >= 0).any())
    options = "stack" if calls > 0 else "shapes" if shapes or len(trace.memory) else "none"
    added_ms = (ops * OP_US_WITH_STACKS * OP_SHARE_BY_OPTIONS[options] + calls * PYTHON_CALL_US) / 1e3
    busy_ms = verdict.gpu_busy_pct * verdict.step_ms / 100
    without = max(verdict.step_ms - added_ms, busy_ms, 1e-9)
    busy_pct = 100.0 * busy_ms / without
    return ProfilerHostEstimate(
        ops_per_step=round(ops, 1),
        python_calls_per_step=round(calls, 1),
        options=options,
        added_ms_per_step=round(added_ms, 4),
        gpu_busy_pct_without=round(busy_pct, 2),
        could_be_gpu_bound=verdict.label in HOST_VERDICTS and busy_pct >= thresholds.gpu_bound_busy_pct,
    )


def verdict_caveat(estimates: list[ProfilerHostEstimate]) -> str | None:
    """The headline's caveat where an estimate says the profiler could have made the verdict."""
    could = [e for e in estimates if e.could_be_gpu_bound]
    if not could:
        return None
    worst = max(could, key=lambda e: e.added_ms_per_step)
    stacks = " with Python stacks" if worst.options == "stack" else ""
    return (
        f"the profiler may have made this verdict: recording {worst.ops_per_step:,.0f} ops per step{stacks} "
        f"costs the host about {worst.added_ms_per_step:.1f} ms/step, and without it "
        f"the GPU would be busy up to {min(worst.gpu_busy_pct_without, 100.0):.0f}% of the step (GPU-bound). "
        "To confirm, run the loop under trainprof.session (it times un-profiled steps and judges on them), "
        "or record again with with_stack=False and record_shapes=False"
    )
