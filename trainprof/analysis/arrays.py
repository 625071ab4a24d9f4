"""Small numpy helpers shared by the analyses."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array without NaN: `np.unique(values)`, by a sort.

    Why not `np.unique`: without `return_*` flags numpy 2's `unique` calls `np.ma.is_masked`, and the
    first such call imports `numpy.ma` (11 ms of a fresh process, measured 2026-11-23).
    """
    ordered = np.sort(values, axis=None)
    keep = np.empty(len(ordered), dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
