"""Small numpy helpers shared by the analyses."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def median(values: Iterable[float]) -> float:
    """The median as `statistics.median` gives it: the middle value, or the mean of the two middle
    values for an even count; ValueError for none.

    Why not `statistics`: it imports `random` and `fractions` (1.7 ms of `trainprof analyze`'s start on
    the 2-core development machine, 2026-11-25); nor `np.median`, which imports `numpy.ma`.
    """
    ordered = sorted(values)
    count = len(ordered)
    if count == 0:
        raise ValueError("no median of no values")
    middle = count // 2
    return ordered[middle] if count % 2 else (ordered[middle - 1] + ordered[middle]) / 2


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


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for non-negative integer codes.

    Codes that span a range of at most a few times their count (group keys built from small tables)
    are ranked through a table of that range, in O(n): `np.unique` sorts them, 14M of the 60k-piece
    grouping of gpt2_pathologies' idle analysis against 0.5M. Wider codes are sorted as before.
    """
    values = np.asarray(values)
    span = int(values.max()) + 1 if len(values) else 0
    if not len(values) or values.min() < 0 or span > 4 * len(values) + 4096:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.reshape(-1)
    present = np.zeros(span, dtype=bool)
    present[values] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(values.dtype), rank[values]


def numpy_round(value: float, digits: int) -> float:
    """`value` rounded as numpy rounds a float64 (scaled by 10**digits, rounded half to even, scaled
    back), as a Python float.

    The figures derived from the steps' durations and GPU times (per-step means, shares of the step)
    are rounded this way, as in every summary.json since schema 1. Python's `round` rounds the exact
    binary value instead, and the two differ in the last digit at times (`round(21.13075, 4)` is
    21.1307, numpy's 21.1308).
    """
    return float(np.round(value, digits))


class StringTable:
    """Strings numbered in order of first use: a view's table of names, each stored once."""

    def __init__(self, first: tuple[str, ...] = ()) -> None:
        self._index: dict[str, int] = {}
        for text in first:
            self.id(text)

    def id(self, text: str) -> int:
        """The number of `text`, given it now if it has none."""
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self._index)
        return found

    def ids(self, texts: list[str | None]) -> np.ndarray:
        """Per text, its number (-1 for None)."""
        return np.array([-1 if text is None else self.id(text) for text in texts], dtype=np.int64)

    def coded(self, codes: np.ndarray, text: Callable[[int], str | None]) -> np.ndarray:
        """Per code (an int standing for one text, `text(code)`; None gives -1), its text's number,
        as `ids` numbers them; each distinct code's text is looked up and numbered once."""
        distinct_codes, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        numbers = np.empty(len(distinct_codes), dtype=np.int64)
        for at in np.argsort(first, kind="stable").tolist():  # in order of first use, as `ids` goes
            found = text(int(distinct_codes[at]))
            numbers[at] = -1 if found is None else self.id(found)
        return numbers[inverse.reshape(-1)]

    @property
    def strings(self) -> list[str]:
        """Every string, by number."""
        return list(self._index)

