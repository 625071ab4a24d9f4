"""The in-memory model of one torch.profiler trace: events bucketed by category into numpy columns.

A Chrome trace holds ~50k events for a few steps of a small model; analyses ask interval questions
(unions, overlaps, "what encloses this call") over a few categories. Keeping each category as
parallel numpy arrays (`EventTable`) makes those questions vectorised or O(log n) lookups.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainprof.user_code import CodeLayout

# Categories of complete ("X") events kept by the loader. Everything else (flows, metadata) is dropped:
# GPU events carry `args.correlation`, which joins them to their runtime call without the flow events.
CPU_CATEGORIES = ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
KEPT_CATEGORIES = CPU_CATEGORIES + GPU_CATEGORIES
# Categories whose events nest by time on a CPU thread and describe "what the code was doing".
FRAME_CATEGORIES = ("python_function", "cpu_op", "user_annotation")


@dataclass
class EventTable:
    """Parallel columns for the events of one category, sorted by start time.

    Times are microseconds on the trace's clock. `thread` indexes `Trace.threads`; `name` indexes
    `Trace.names`; `correlation` is -1 when absent; `value` is category specific: bytes for
    `gpu_memcpy`/`gpu_memset`, `Total Allocated` bytes for `memory`, NaN otherwise.
    `sequence` and `fwd_thread` exist for `cpu_op` only (None elsewhere): Kineto's autograd link
    args `Sequence number` and `Fwd thread id`, -1 when absent (see `trainprof.analysis.attribution`).
    """

    start_us: np.ndarray
    dur_us: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    correlation: np.ndarray
    value: np.ndarray
    sequence: np.ndarray | None = None
    fwd_thread: np.ndarray | None = None

    end_us: np.ndarray = field(init=False, repr=False)
    """End times (start + duration), computed once: analyses read them in loops."""

    def __post_init__(self) -> None:
        self.end_us = self.start_us + self.dur_us

    def __len__(self) -> int:
        return len(self.start_us)

    @classmethod
    def from_columns(
        cls, start, dur, thread, name, correlation, value, sequence=None, fwd_thread=None
    ) -> EventTable:
        """Build a table from Python lists, sorted by start time (`sequence`/`fwd_thread` optional)."""
        start_us = np.asarray(start, dtype=np.float64)
        order = np.argsort(start_us, kind="stable")
        return cls(
            start_us=start_us[order],
            dur_us=np.asarray(dur, dtype=np.float64)[order],
            thread=np.asarray(thread, dtype=np.int32)[order],
            name=np.asarray(name, dtype=np.int32)[order],
            correlation=np.asarray(correlation, dtype=np.int64)[order],
            value=np.asarray(value, dtype=np.float64)[order],
            sequence=None if sequence is None else np.asarray(sequence, dtype=np.int64)[order],
            fwd_thread=None if fwd_thread is None else np.asarray(fwd_thread, dtype=np.int64)[order],
        )

    @classmethod
    def empty(cls) -> EventTable:
        """A table with no events."""
        return cls.from_columns([], [], [], [], [], [])

    def select(self, mask: np.ndarray) -> EventTable:
        """The events where `mask` is true (order kept)."""
        return EventTable(
            self.start_us[mask],
            self.dur_us[mask],
            self.thread[mask],
            self.name[mask],
            self.correlation[mask],
            self.value[mask],
            None if self.sequence is None else self.sequence[mask],
            None if self.fwd_thread is None else self.fwd_thread[mask],
        )


@dataclass
class Frame:
    """One enclosing event of a CPU call: its category, name and time span (µs)."""

    category: str
    name: str
    start_us: float
    end_us: float


class ThreadFrames:
    """The frame events (python_function, cpu_op, user_annotation) of one CPU thread, nested.

    Built once per thread: events sorted by (start, -duration) and a parent index from one stack pass,
    so "which events enclose [t0, t1]" is a bisect plus a walk up the parents.
    """

    def __init__(
        self,
        categories: list[str],
        names: list[str],
        starts: np.ndarray,
        ends: np.ndarray,
        name_ids: np.ndarray,
    ):
        order = np.lexsort((-(ends - starts), starts))
        self.categories = [categories[i] for i in order]
        self.name_ids = name_ids[order]
        self.names = names
        self.starts = starts[order]
        self.ends = ends[order]
        self._starts_list = self.starts.tolist()
        ends_list = self.ends.tolist()
        parent = [-1] * len(order)
        stack: list[int] = []
        # Profiler timestamps are rounded to ns: allow a child to overhang its parent by 1 ns.
        for i, end in enumerate(ends_list):
            while stack and end > ends_list[stack[-1]] + 1e-3:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        self.parent = parent
        self._ends_list = ends_list

    def innermost(self, start_us: float, end_us: float) -> int:
        """Index of the innermost frame enclosing [start_us, end_us], or -1."""
        i = bisect_right(self._starts_list, start_us) - 1
        ends = self._ends_list
        while i >= 0 and ends[i] < end_us - 1e-3:
            i = self.parent[i]
        return i

    def chain(self, index: int) -> list[int]:
        """Indices from the outermost frame down to `index`."""
        out = []
        while index >= 0:
            out.append(index)
            index = self.parent[index]
        out.reverse()
        return out

    def frame(self, index: int) -> Frame:
        """The frame at `index`."""
        return Frame(
            self.categories[index],
            self.names[self.name_ids[index]],
            float(self.starts[index]),
            float(self.ends[index]),
        )


@dataclass
class Trace:
    """One loaded trace file (one rank / worker).

    `events` maps each kept category (`KEPT_CATEGORIES`) to its `EventTable`; `memory` holds the
    `[memory]` instant events (`value` = Total Allocated bytes). `sync_sites` is the `sites` list of
    the `<worker>.syncsites.json` found beside the file (see `trainprof.trace.load`), or None.
    """

    path: Path
    worker: str
    rank: int | None
    names: list[str]
    threads: list[tuple[Any, Any]]
    events: dict[str, EventTable]
    memory: EventTable
    device_properties: list[dict] = field(default_factory=list)
    distributed_info: dict | None = None
    metadata: dict = field(default_factory=dict)
    sync_sites: list[dict] | None = None
    sync_sites_path: Path | None = None
    code_layout: CodeLayout | None = None
    """Where the run's library code lived (`trainprof.user_code.CodeLayout`), from the sync sites file."""
    _frames: dict[int, ThreadFrames] = field(default_factory=dict, repr=False)
    _name_ids: dict[str, int] | None = field(default=None, repr=False)

    def name_id(self, name: str) -> int:
        """The index of `name` in `names`, or -1 if no event has that name."""
        if self._name_ids is None:
            self._name_ids = {n: i for i, n in enumerate(self.names)}
        return self._name_ids.get(name, -1)

    def names_matching(self, predicate) -> np.ndarray:
        """A boolean array over `names`: which names satisfy `predicate(name)`."""
        return np.fromiter((bool(predicate(n)) for n in self.names), dtype=bool, count=len(self.names))

    def frames(self, thread: int) -> ThreadFrames:
        """The nested frame events of one CPU thread (built on first use)."""
        frames = self._frames.get(thread)
        if frames is None:
            cats: list[str] = []
            starts, ends, name_ids = [], [], []
            for category in FRAME_CATEGORIES:
                table = self.events[category]
                mask = table.thread == thread
                cats.extend([category] * int(mask.sum()))
                starts.append(table.start_us[mask])
                ends.append(table.end_us[mask])
                name_ids.append(table.name[mask])
            frames = ThreadFrames(
                cats, self.names, np.concatenate(starts), np.concatenate(ends), np.concatenate(name_ids)
            )
            self._frames[thread] = frames
        return frames

    @property
    def label(self) -> str:
        """A short name for reports: `rank N` when known, else the worker name."""
        return f"rank {self.rank}" if self.rank is not None else self.worker
