"""The host stacks as a flame graph: where the host's time went, and which code launched the GPU time.

Every frame a thread recorded (Python functions with `with_stack`, ops, annotations) is one node of a
tree per thread, merged by path: two calls of `train_step -> forward -> aten::linear` are one node.
A node's `host_us` is the time its calls lasted inside the profiled steps (with their callees, as a
flame graph draws it); its `gpu_us` the GPU time of the kernels, copies and memsets launched beneath
it (what `export_stacks` weighs by `self_cuda_time_total`). `ProfilerStep#N` annotations are left out
of the paths, so the steps' stacks merge.

    all threads
    |- thread 1 (the loop)             host 300 ms  gpu 250 ms
    |  |- train.py(10): main           host 300 ms  gpu 250 ms
    |  |  |- nn.Module: GPT2Model_0    host 120 ms  gpu  90 ms
    |  |  |- ...
    |- thread 2 (autograd)             host 160 ms  gpu 160 ms

At most `FLAME_GRAPH_NODES` nodes are kept, the largest by host or GPU time: a node is never larger
than its parent, so the kept nodes form a tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct, unique_inverse
from trainprof.analysis.thresholds import FLAME_GRAPH_NODES
from trainprof.analysis.timeline import Timeline, _join_correlation
from trainprof.trace.model import FRAME_CATEGORIES, nearest_marked

_STEP_PREFIX = "ProfilerStep#"


class FlameGraph(msgspec.Struct, frozen=True):
    """The merged host stacks of one trace (parallel arrays over nodes, parents before children).

    `parent` is -1 at the root (all threads); `name` indexes `strings`; `host_us` and `gpu_us` are
    inclusive (module docstring).
    """

    strings: list[str]
    parent: np.ndarray
    name: np.ndarray
    host_us: np.ndarray
    gpu_us: np.ndarray


def flame_graph(timeline: Timeline) -> FlameGraph:
    """The flame graph of every thread with frames in the profiled steps (module docstring)."""
    trace = timeline.trace
    tree = _Tree(trace.names)
    launches = _launches(timeline)
    frame_threads = distinct(np.concatenate([trace.events[c].thread for c in FRAME_CATEGORIES])).tolist()
    for thread in sorted(frame_threads, key=lambda t: (t != timeline.main_thread, t)):
        loop = " (the loop)" if thread == timeline.main_thread else ""
        tree.add_thread(timeline, int(thread), f"thread {trace.threads[thread][1]}{loop}", launches)
    return tree.pruned()


class _Tree:
    """The merged tree being built, thread by thread: per node its parent, name, depth, own host
    time (inclusive already: a frame's duration holds its callees') and own GPU time.

    A node's name is a number: a trace name's id, or past them one of `labels` (the root, threads).
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.labels = ["all threads"]
        root_name = len(names)
        self.parent, self.name, self.depth = [np.array([-1])], [np.array([root_name])], [np.array([0])]
        self.host_us, self.gpu_us = [np.zeros(1)], [np.zeros(1)]
        self.count = 1

    def add_thread(self, timeline: Timeline, thread: int, label: str, launches: _Launches) -> None:
        """One thread's frames inside the steps, as a subtree under a node named `label`."""
        trace = timeline.trace
        frames = trace.frames(thread)
        lo, hi = timeline.steps[0].start_us, timeline.steps[-1].end_us
        host = np.clip(frames.ends, lo, hi) - np.clip(frames.starts, lo, hi)
        steps = [i for i in distinct(frames.name_ids).tolist() if trace.names[i].startswith(_STEP_PREFIX)]
        keep = (host > 0) & ~np.isin(frames.name_ids, steps)
        if not keep.any():
            return
        # A frame's parent is its nearest kept ancestor: step annotations are see-through.
        nearest_kept = nearest_marked(frames.parents, keep)
        parent = np.where(frames.parents >= 0, nearest_kept[np.maximum(frames.parents, 0)], -1)
        depth = _depths(parent)

        root = self.count
        node = np.full(len(parent), root, dtype=np.int64)  # per frame, its node
        self.labels.append(label)
        label_name = len(self.names) + len(self.labels) - 1
        parents, names, depths = [np.array([0])], [np.array([label_name])], [np.array([1])]
        self.count += 1
        width = len(trace.names) + 1  # (parent node, name) packed into one key
        # Frames of one depth at a time, merged by (parent node, name): parents get their node first.
        kept = np.flatnonzero(keep)
        order, bounds = _levels(depth[kept])
        by_depth = kept[order]
        # Per frame in depth order: its parent frame (-1 at the top, read as the thread's node) and
        # its name; each level then only slices these.
        parent_by_depth = parent[by_depth]
        top = parent_by_depth < 0
        parent_by_depth[top] = 0
        name_by_depth = frames.name_ids[by_depth]
        for level, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            if lo == hi:
                continue
            above = node[parent_by_depth[lo:hi]]
            above[top[lo:hi]] = root
            key, inverse = np.unique(above * width + name_by_depth[lo:hi], return_inverse=True)
            node[by_depth[lo:hi]] = self.count + inverse.reshape(-1)
            parents.append(key // width)
            names.append(key % width)
            depths.append(np.full(len(key), level + 2))
            self.count += len(key)
        self.parent += parents
        self.name += names
        self.depth += depths
        size = self.count - root
        host_us = np.bincount(node[kept] - root, weights=host[kept], minlength=size)
        host_us[0] = host_us[np.concatenate(parents) == root].sum()  # the thread: its top frames
        self.host_us.append(host_us)
        # GPU time to the innermost kept frame around each launch on this thread.
        on = launches.thread == thread
        inner = frames.innermost_of(launches.start_us[on], launches.end_us[on])
        inner = np.where(inner >= 0, nearest_kept[np.maximum(inner, 0)], -1)
        owner = np.where(inner >= 0, node[np.maximum(inner, 0)], root)
        self.gpu_us.append(np.bincount(owner - root, weights=launches.gpu_us[on], minlength=size))

    def pruned(self) -> FlameGraph:
        """The tree with inclusive GPU time, cut to the `FLAME_GRAPH_NODES` largest nodes."""
        parent = np.concatenate(self.parent).astype(np.int64)
        host_us = np.concatenate(self.host_us)
        host_us[0] = host_us[parent == 0].sum()
        gpu_us = _inclusive(parent, np.concatenate(self.depth), np.concatenate(self.gpu_us))
        name = np.concatenate(self.name).astype(np.int64)
        return _pruned(self._text, parent, name, host_us, gpu_us)

    def _text(self, name: int) -> str:
        return self.names[name] if name < len(self.names) else self.labels[name - len(self.names)]


class _Launches(NamedTuple):
    """Per GPU event launched inside a step: its launch call's thread, start and end, and its GPU µs."""

    thread: np.ndarray
    start_us: np.ndarray
    end_us: np.ndarray
    gpu_us: np.ndarray


def _launches(timeline: Timeline) -> _Launches:
    """The GPU events (kernels, copies, memsets) launched inside the steps (`_Launches`)."""
    trace, calls = timeline.trace, timeline.calls
    parts = []
    for category in ("kernel", "gpu_memcpy", "gpu_memset"):
        table = trace.events[category]
        if not len(table) or not len(calls):
            continue
        call = timeline.kernel_call if category == "kernel" else _join_correlation(
            table.correlation, calls.correlation
        )
        launched = np.flatnonzero(call >= 0)
        launched = launched[timeline.step_of(calls.start_us[call[launched]]) >= 0]
        rows = call[launched]
        parts.append((calls.thread[rows], calls.start_us[rows], calls.end_us[rows], table.dur_us[launched]))
    if not parts:
        return _Launches(np.zeros(0, np.int32), np.zeros(0), np.zeros(0), np.zeros(0))
    return _Launches(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _depths(parent: np.ndarray) -> np.ndarray:
    """Per node of a forest (`parent[i]`, -1 at roots), its depth (roots 0), by pointer doubling:
    `depth[i]` counts the edges from i up to `pointer[i]`, and each pass doubles the reach."""
    depth = (parent >= 0).astype(np.int64)
    pointer = parent.copy()
    while True:
        at = np.flatnonzero(pointer >= 0)
        if not len(at):
            return depth
        depth[at], pointer[at] = depth[at] + depth[pointer[at]], pointer[pointer[at]]


def _levels(depth: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Positions into `depth` in depth order (stable), and where each depth starts in them: depth d
    holds positions `order[bounds[d]:bounds[d + 1]]`."""
    order = np.argsort(depth, kind="stable")
    return order, np.searchsorted(depth[order], np.arange(int(depth.max()) + 2)).tolist()


def _inclusive(parent: np.ndarray, depth: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per node, its own value plus all its descendants': deepest level first, each adds into its parent."""
    total = own.astype(np.float64).copy()
    by_depth, bounds = _levels(depth)
    for level in range(len(bounds) - 2, 0, -1):
        at = by_depth[bounds[level]:bounds[level + 1]]
        np.add.at(total, parent[at], total[at])
    return total


def _pruned(
    text: Callable[[int], str], parent: np.ndarray, name: np.ndarray, host_us: np.ndarray, gpu_us: np.ndarray
) -> FlameGraph:
    """The `FLAME_GRAPH_NODES` largest nodes (by their larger share of host or GPU time), renumbered;
    `text(name)` is a node name's string."""
    share = np.maximum(host_us / max(host_us[0], 1e-9), gpu_us / max(gpu_us[0], 1e-9))
    keep = np.zeros(len(parent), dtype=bool)
    keep[np.argsort(-share, kind="stable")[:FLAME_GRAPH_NODES]] = True
    keep[0] = True
    keep &= (parent < 0) | keep[np.maximum(parent, 0)]  # a kept node's parent is as large: kept too
    rows = np.flatnonzero(keep)
    renumber = np.full(len(parent), -1, dtype=np.int64)
    renumber[rows] = np.arange(len(rows))
    used, names = unique_inverse(name[rows])
    return FlameGraph(
        strings=[text(i) for i in used.tolist()],
        parent=np.where(parent[rows] >= 0, renumber[np.maximum(parent[rows], 0)], -1),
        name=names,
        host_us=host_us[rows],
        gpu_us=gpu_us[rows],
    )
