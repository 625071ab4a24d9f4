"""What report.html draws of one trace beyond the summary: the GPU timeline, the op and kernel
tables and the host-stack flame graph, each from the module that answers it. (Its memory chart is
the analysis' own `TraceInfo.memory`: the series over time and the largest allocations at the peak.)

`analyze(..., views=True)` builds them (`TraceInfo.views`); they are not in the JSON form.
"""

from __future__ import annotations

import msgspec

from trainprof.analysis.attribution import KernelOwners
from trainprof.analysis.busy import KernelWork
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


def trace_views(
    timeline: Timeline,
    owners: KernelOwners,
    idle: IdlePieces | None,
    syncs: list[SyncPoint],
    work: KernelWork | None = None,
) -> TraceViews:
    """Every view of one trace; the arguments are what `analyze` already worked out for it (`work`:
    the kernels' classes, which colour the timeline; None without GPU work)."""
    return TraceViews(
        timeline=timeline_view(timeline, owners, idle, syncs, work),
        ops=op_table(timeline),
        kernels=kernel_table(timeline, owners, work),
        flame=flame_graph(timeline),
    )
