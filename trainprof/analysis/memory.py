"""Question 5b: peak GPU memory allocated per step, from the `[memory]` events (`profile_memory=True`)."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.timeline import Timeline


def peak_memory_per_step(timeline: Timeline) -> list[int | None]:
    """Max `Total Allocated` bytes inside each step window; None when memory was not recorded."""
    memory = timeline.trace.memory
    if len(memory) == 0:
        return [None] * len(timeline.steps)
    peaks: list[int | None] = []
    for window in timeline.steps:
        lo = np.searchsorted(memory.start_us, window.start_us, side="left")
        hi = np.searchsorted(memory.start_us, window.end_us, side="right")
        peaks.append(int(memory.value[lo:hi].max()) if hi > lo else None)
    return peaks
