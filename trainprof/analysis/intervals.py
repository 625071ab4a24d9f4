"""Interval arithmetic on numpy arrays: unions of busy intervals and how much of a window they cover."""

from __future__ import annotations

import numpy as np


class Coverage:
    """The union of a set of [start, end) intervals, answering "how much of [a, b) is covered" in O(log n).

    Built by sorting once; queries are vectorised `searchsorted` lookups on the merged intervals.
    """

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        starts = np.asarray(starts, dtype=np.float64)
        ends = np.asarray(ends, dtype=np.float64)
        if len(starts) == 0:
            self.starts = self.ends = self._cum = np.zeros(0)
            return
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        running_end = np.maximum.accumulate(ends)
        # A new merged interval begins where an interval starts after every earlier one has ended.
        new = np.empty(len(starts), dtype=bool)
        new[0] = True
        new[1:] = starts[1:] > running_end[:-1]
        self.starts = starts[new]
        self.ends = np.maximum.reduceat(running_end, np.flatnonzero(new))
        lengths = self.ends - self.starts
        self._cum = np.concatenate(([0.0], np.cumsum(lengths)))

    def _covered_before(self, t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.starts, t, side="right") - 1
        kc = np.clip(k, 0, None)
        partial = np.clip(t - self.starts[kc], 0, self.ends[kc] - self.starts[kc])
        return np.where(k >= 0, self._cum[kc] + partial, 0.0)

    def covered(self, a, b) -> np.ndarray:
        """Covered time within each window [a, b) (same units as the inputs; arrays or scalars)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if len(self.starts) == 0:
            return np.zeros(np.broadcast(a, b).shape)
        return self._covered_before(b) - self._covered_before(a)

    def gaps(self, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
        """The uncovered sub-intervals of [a, b): (gap starts, gap ends)."""
        lo = np.searchsorted(self.ends, a, side="right")
        hi = np.searchsorted(self.starts, b, side="left")
        s, e = self.starts[lo:hi], self.ends[lo:hi]
        gap_starts = np.concatenate(([a], e))
        gap_ends = np.concatenate((s, [b]))
        gap_starts = np.clip(gap_starts, a, b)
        gap_ends = np.clip(gap_ends, a, b)
        keep = gap_ends > gap_starts
        return gap_starts[keep], gap_ends[keep]

    def next_busy_after(self, t: float) -> float | None:
        """0 if `t` lies in a covered interval, else the time from `t` to the next one (None if none)."""
        k = int(np.searchsorted(self.starts, t, side="right")) - 1
        if k >= 0 and self.ends[k] > t:
            return 0.0
        if k + 1 < len(self.starts):
            return float(self.starts[k + 1] - t)
        return None
