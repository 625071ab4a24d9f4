"""Question 8: how much communication the step pays for, and how much compute hides.

Communication is hidden while compute runs beside it (on another stream, or for gloo on another
thread), exposed otherwise. Per step, over the union of each:

    compute   |==k1===|    |===k2=====|           |=k3=|
    comm          |===c1======|   |====c2=====|
    exposed               [--]          [-----]           exposed = |comm ∪ compute| - |compute|
    hidden        [---]        [-][-----]                 hidden  = comm - exposed

Exposed communication is what a step would lose if communication took no time at all; it includes
the wait for a late rank inside a collective (`trainprof.analysis.distributed` separates the two
across ranks). `comm_hidden_pct` is the hidden share of communication time. Compute and
communication spans: `trainprof.analysis.collectives`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.intervals import Coverage
from trainprof.analysis.records import Record

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.timeline import Timeline


class StepComm(Record, frozen=True):
    """One step's communication against its compute: the exposed ms, and the hidden share of the
    communication time in % (None when the step has no communication)."""

    comm_exposed_ms: float
    comm_hidden_pct: float | None


def step_exposure(timeline: Timeline, compute: Coverage) -> list[StepComm]:
    """Per step of `timeline`, its `StepComm` (module docstring); `compute` covers the compute spans."""
    spans = timeline.comm
    a = np.array([s.start_us for s in timeline.steps])
    b = np.array([s.end_us for s in timeline.steps])
    comm_us = Coverage(spans.start_us, spans.end_us).covered(a, b)
    either = Coverage(
        np.concatenate((spans.start_us, compute.starts)), np.concatenate((spans.end_us, compute.ends))
    )
    exposed_us = np.maximum(either.covered(a, b) - compute.covered(a, b), 0.0)
    return [
        StepComm(
            comm_exposed_ms=round(float(exposed_us[i]) / 1e3, 4),
            comm_hidden_pct=round(100 * (1 - float(exposed_us[i]) / float(comm_us[i])), 2)
            if comm_us[i] > 0
            else None,
        )
        for i in range(len(a))
    ]
