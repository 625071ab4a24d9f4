"""What report.html draws of one trace beyond the summary: the GPU timeline, the op and kernel
tables and the host-stack flame graph, each from the module that answers it. (Its memory chart is
the analysis' own `TraceInfo.memory`: the series over time and the largest allocations at the peak.)

`analyze(..., views=True)` builds them (`TraceInfo.views`); they are not in the JSON form.
"""

from __future__ import annotations

import msgspec

from trainprof.analysis.attribution import AttributionIndex, KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.host_ops import HostBreakdown, host_breakdown
from trainprof.analysis.idle import IdlePieces
from trainprof.analysis.ops import KernelRow, OpRow, kernel_table, op_table
from trainprof.analysis.stacks import FlameGraph, flame_graph
from trainprof.analysis.syncs import SyncPoint
from trainprof.analysis.timeline import Timeline
from trainprof.analysis.timeline_view import TimelineView, timeline_view


class TraceViews(msgspec.Struct, frozen=True):
    """The drawn views of one trace (module docstring)."""

    timeline: TimelineView
    ops: list[OpRow]
    kernels: list[KernelRow]
    flame: FlameGraph
    host: HostBreakdown | None = None
    """A trace without GPU work: the loop's structure and host time by module (`host_ops`)."""
    recorded_with: dict[str, bool] = {}
    """The profiler options the trace says it was recorded with (`with_stack`, `profile_memory`,
    `record_shapes`; those it does not say are absent): advice never asks for one that was on."""


def trace_views(
    timeline: Timeline,
    owners: KernelOwners,
    idle: IdlePieces | None,
    syncs: list[SyncPoint],
    work: KernelWork | None = None,
    host_index: AttributionIndex | None = None,
) -> TraceViews:
    """Every view of one trace; the arguments are what `analyze` already worked out for it (`work`:
    the kernels' classes, which colour the timeline; None without GPU work; `host_index`, given for a
    trace without GPU work: its host breakdown is drawn instead)."""
    metadata = timeline.trace.metadata
    return TraceViews(
        timeline=timeline_view(timeline, owners, idle, syncs, work),
        ops=op_table(timeline),
        kernels=kernel_table(timeline, owners, work),
        flame=flame_graph(timeline),
        host=host_breakdown(timeline, host_index) if host_index is not None else None,
        recorded_with={option: bool(metadata[option]) for option in RECORDING_OPTIONS
                       if type(metadata.get(option)) in (int, bool)},
    )


RECORDING_OPTIONS = ("with_stack", "profile_memory", "record_shapes")
"""The torch.profiler options a trace file records at its top level (1 or 0)."""
