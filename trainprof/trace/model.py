"""The in-memory model of one torch.profiler trace: events bucketed by category into numpy columns.

A Chrome trace holds ~50k events for a few steps of a small model; analyses ask interval questions
(unions, overlaps, "what encloses this call") over a few categories. Keeping each category as
parallel numpy arrays (`EventTable`) makes those questions vectorised or O(log n) lookups.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from trainprof.user_code import CodeLayout

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.trace.memory_file import MemoryFile

try:
    from trainprof.trace import _forest
except ImportError:  # not built (no C compiler where it was installed): numpy walks the forest
    _forest = None  # type: ignore[assignment]  # the C module, or None where it was not built

# Categories of complete ("X") events kept by the loader. Everything else (flows, metadata) is dropped:
# GPU events carry `args.correlation`, which joins them to their runtime call without the flow events.
CPU_CATEGORIES = ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
# CUPTI's synchronization records (`Stream Sync`, `Event Sync`, ...), drawn on the GPU's stream rows
# but spanning the host's wait: kept apart, since the GPU does no work during them.
SYNC_CATEGORIES = ("cuda_sync",)
KEPT_CATEGORIES = CPU_CATEGORIES + GPU_CATEGORIES + SYNC_CATEGORIES

# Other names Kineto has written for the kept categories -> the name the analyses read. One table:
# PyTorch 1.8-1.9 (torch-tb-profiler's samples) wrote capitalised names; ROCm builds write the CUDA
# names with `hip*` calls inside; XPU and out-of-tree (privateuse1) backends name their runtime.
CATEGORY_ALIASES = {
    "Operator": "cpu_op",  # PyTorch <= 1.9; its ProfilerStep#N ranges too (moved to user_annotation)
    "Runtime": "cuda_runtime",  # PyTorch <= 1.9
    "Kernel": "kernel",  # PyTorch <= 1.9
    "Memcpy": "gpu_memcpy",  # PyTorch <= 1.9
    "Memset": "gpu_memset",  # PyTorch <= 1.9
    "Python function": "python_function",  # PyTorch 1.9 with_stack
    "xpu_runtime": "cuda_runtime",  # Intel GPUs (call names zeXxx / urXxx)
    "xpu_driver": "cuda_driver",
    "privateuse1_runtime": "cuda_runtime",  # out-of-tree accelerators
    "privateuse1_driver": "cuda_driver",
}
# Categories whose events nest by time on a CPU thread and describe "what the code was doing".
FRAME_CATEGORIES = ("python_function", "cpu_op", "user_annotation")
_FRAME_CATEGORY_NAMES = np.array(FRAME_CATEGORIES, dtype=object)  # code -> name, for whole arrays
MAX_TIME_US = 2.0**53
"""The largest start (in magnitude) and duration an event may have: 285 years of microseconds, far
past any clock a trace uses (epoch microseconds are ~1.8e15), and exact in a float64; sums and
differences of such times never overflow."""
MAX_MEMORY_BYTES = 2.0**53
"""The largest memory figure (a `[memory]` event's `Total Allocated` or `Bytes`, in magnitude) an event
may have: 8 PiB, past any device's memory, and exact in a float64 (and in the int64 the memory views
are written as)."""
# Profiler timestamps are rounded to ns: a child may overhang its parent by 1 ns.
NESTING_SLACK_US = 1e-3


@dataclass
class EventTable:
    """Parallel columns for the events of one category, sorted by start time.

    Times are microseconds on the trace's clock. `thread` indexes `Trace.threads`; `name` indexes
    `Trace.names`; `correlation` is -1 when absent; `value` is category specific: bytes for
    `gpu_memcpy`/`gpu_memset`, `Total Allocated` bytes for `memory`, the recorded `flops` for
    `cpu_op` (`with_flops`; NaN when absent), NaN otherwise. The frame categories
    (`FRAME_CATEGORIES`) have no `correlation` (-1); only `cpu_op` of them carries a `value`.
    `sequence` and `fwd_thread` exist for `cpu_op` only (None elsewhere): Kineto's autograd link
    args `Sequence number` and `Fwd thread id`, -1 when absent (see `trainprof.analysis.attribution`).
    `block_bytes`, `addr` and `reserved` exist for `memory` only: each instant's `Bytes` (an
    allocation > 0, a free < 0), the block's `Addr` and the allocator's `Total Reserved` after it,
    NaN when absent (see `trainprof.analysis.memory`).
    `inputs` exists for `cpu_op` only: per op, its slot in `Trace.op_inputs` (the input shapes
    and dtypes `record_shapes` wrote), -1 for ops whose inputs were not kept (views, allocations).
    """

    start_us: np.ndarray
    dur_us: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    correlation: np.ndarray
    value: np.ndarray
    sequence: np.ndarray | None = None
    fwd_thread: np.ndarray | None = None
    block_bytes: np.ndarray | None = None
    addr: np.ndarray | None = None
    inputs: np.ndarray | None = None
    reserved: np.ndarray | None = None

    end_us: np.ndarray = field(init=False, repr=False)
    """End times (start + duration), computed once: analyses read them in loops."""

    def __post_init__(self) -> None:
        self.end_us = self.start_us + self.dur_us

    def __len__(self) -> int:
        return len(self.start_us)

    @classmethod
    def from_columns(
        cls, start, dur, thread, name, correlation, value, sequence=None, fwd_thread=None, block_bytes=None,
        addr=None, inputs=None, reserved=None,
    ) -> EventTable:
        """Build a table from Python lists, sorted by start time (`sequence`/`fwd_thread`, `block_bytes`/
        `addr`, `inputs` optional).

        Events whose start or duration is not a number within `MAX_TIME_US` are left out, and a
        negative duration counts as 0: no real trace has them, and one such event would break every
        interval question (near 1e308, a start plus a duration overflows to inf).
        """
        start_us = _column(start, np.float64)
        dur_us = np.maximum(_column(dur, np.float64), 0.0)
        order = _timed_order(start_us, dur_us)
        return cls(
            start_us=start_us[order],
            dur_us=dur_us[order],
            thread=_column(thread, np.int32)[order],
            name=_column(name, np.int32)[order],
            correlation=_int64_column(correlation)[order],
            value=_column(value, np.float64)[order],
            sequence=None if sequence is None else _int64_column(sequence)[order],
            fwd_thread=None if fwd_thread is None else _int64_column(fwd_thread)[order],
            block_bytes=None if block_bytes is None else _column(block_bytes, np.float64)[order],
            addr=None if addr is None else _column(addr, np.float64)[order],
            inputs=None if inputs is None else _int64_column(inputs)[order],
            reserved=None if reserved is None else _column(reserved, np.float64)[order],
        )

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
            None if self.block_bytes is None else self.block_bytes[mask],
            None if self.addr is None else self.addr[mask],
            None if self.inputs is None else self.inputs[mask],
            None if self.reserved is None else self.reserved[mask],
        )


def _timed_order(start_us: np.ndarray, dur_us: np.ndarray) -> np.ndarray:
    """The rows by start time, less those whose start or duration is not a number within `MAX_TIME_US`."""
    timed = (np.abs(start_us) <= MAX_TIME_US) & (dur_us <= MAX_TIME_US)  # False for NaN
    order = np.argsort(start_us, kind="stable")
    return order if timed.all() else order[timed[order]]


def _column(values, dtype) -> np.ndarray:
    """A list or array as an array of `dtype`. A list goes through `np.fromiter`, which skips
    `np.asarray`'s shape discovery: a quarter fewer instructions per element (the loader's ~50k
    events per column)."""
    if isinstance(values, list):
        return np.fromiter(values, dtype=dtype, count=len(values))
    return np.asarray(values, dtype=dtype)


def _int64_column(values) -> np.ndarray:
    """An id column (-1 = absent) as int64; an id outside int64 (e.g. 2**80) becomes -1."""
    try:
        return _column(values, np.int64)
    except OverflowError:  # rare: only then pay for a Python pass
        return np.asarray([v if -(2**63) <= v < 2**63 else -1 for v in values], dtype=np.int64)


def nesting_order(starts: np.ndarray, ends: np.ndarray, thread: np.ndarray | None = None) -> np.ndarray:
    """The order that nests ranges: by thread (when given), then start, then longest first, ties in
    input order; `np.lexsort((starts - ends, starts[, thread]))`, faster.

    Why: the ranges come from tables sorted by start, so a stable argsort by start (timsort over a
    few sorted runs) costs 0.03 ms for 7.7k frames where the lexsort cost 1.3 ms; only the runs of
    equal (thread, start) are then sorted by duration.
    """
    order = np.argsort(starts, kind="stable")
    if thread is not None:
        order = order[np.argsort(thread[order], kind="stable")]
    same = starts[order][1:] == starts[order][:-1]
    if thread is not None:
        same &= thread[order][1:] == thread[order][:-1]
    if same.any():
        tied = np.zeros(len(order), dtype=bool)
        tied[1:] = same
        tied[:-1] |= same
        at = np.flatnonzero(tied)  # the slots of runs of equal (thread, start), each run contiguous
        run = np.cumsum(np.concatenate(([True], ~same)))[at]
        rows = order[at]
        order[at] = rows[np.lexsort((starts[rows] - ends[rows], run))]
    return order


def enclosing_parents(ends: np.ndarray, group_first: np.ndarray | None = None) -> np.ndarray:
    """Per range, the index of its parent (-1 for none), for ranges sorted by (start, -duration).

    The parent of range i is the last range j < i that is still open at i's end: the largest j with
    `ends[j] + NESTING_SLACK_US >= ends[i]` (and, with `group_first`, `j >= group_first[i]`: ranges
    of one thread each, in consecutive groups, where `group_first[i]` is the first index of i's group).
    That is exactly what a stack pass finds (pop while the top ends before i, then the top is the
    parent): `_forest.enclosing_parents` makes it in C where the module is built, else
    `_climbed_parents` with numpy.
    """
    parent = np.full(len(ends), -1, dtype=np.int64)
    walked = _forest is not None and _forest.enclosing_parents(  # False where an end is NaN
        np.ascontiguousarray(ends, dtype=np.float64), NESTING_SLACK_US, parent
    )
    if len(ends) and not walked:
        parent = _climbed_parents(ends)
    return np.where(parent >= group_first, parent, -1) if group_first is not None else parent


def _climbed_parents(ends: np.ndarray) -> np.ndarray:
    """`enclosing_parents` without groups, vectorised: a Python stack pass cost 11 ms on
    gpt2_pathologies' 23k-frame thread, this under 2 ms.

    How: most ranges sit directly inside the one before them. For the others, `maxima[k][q]` is the
    largest reach (`ends + slack`) of the aligned block [q * 2^k, (q + 1) * 2^k). Each query climbs
    from its own position leftwards over whole aligned blocks that hold no candidate (level 0, 1,
    2, ...) until one does; then it descends into that block, keeping the right half whenever the
    right half holds a candidate. All queries move at once, at most two steps per level:
    O(n log n) time, 2n memory.
    """
    n = len(ends)
    parent = np.full(n, -1, dtype=np.int64)
    reach = np.full(1 << (n - 1).bit_length(), -np.inf)  # padded to a power of two
    reach[:n] = ends + NESTING_SLACK_US
    maxima = [reach]
    while len(maxima[-1]) > 1:
        maxima.append(np.maximum(maxima[-1][0::2], maxima[-1][1::2]))
    inside_previous = np.zeros(n, dtype=bool)
    inside_previous[1:] = reach[: n - 1] >= ends[1:]
    parent[1:][inside_previous[1:]] = np.flatnonzero(inside_previous[1:])

    # Climb. Query i looks for its answer below `bound` (exclusive), first i itself; `bound` is a
    # multiple of 2^k at level k, and when an odd multiple the aligned block just left of it,
    # [bound - 2^k, bound), is tested: skipped when it holds no candidate, else the climb ends.
    query = np.flatnonzero(~inside_previous)
    bound, target = query.copy(), ends[query]
    found: list[tuple[np.ndarray, ...]] = []  # (query, bound, target, level) of the ended climbs
    for k, level in enumerate(maxima):
        if not query.size:
            break
        odd = ((bound >> k) & 1) == 1
        holds = odd & (level[(bound >> k) - 1] >= target)
        found.append((query[holds], bound[holds], target[holds], np.full(int(holds.sum()), k)))
        bound = bound - ((odd & ~holds) << k)
        query, bound, target = query[~holds], bound[~holds], target[~holds]
    if not found:
        return parent
    # Descend, deepest blocks first: queries sorted by level, descending, so those still inside a
    # block of 2^k are a prefix. Keep the right half [bound - 2^(k-1), bound) if it holds a
    # candidate, else move to the left half.
    query, bound, target, level = (np.concatenate(column[::-1]) for column in zip(*found, strict=True))
    for k in range(int(level[0]) if len(level) else 0, 0, -1):
        deep = int(np.searchsorted(-level, -k, side="right"))  # queries with level >= k
        right = maxima[k - 1][(bound[:deep] >> (k - 1)) - 1] >= target[:deep]
        bound[:deep] -= (~right) << (k - 1)
    parent[query] = bound - 1
    return parent


def nearest_marked(parents: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Per node of a forest (`parents[i]`, -1 at roots), the nearest marked node among itself and
    its ancestors, or -1.

    `_forest.nearest_marked` walks up once per node in C where the module is built. Else pointer
    doubling: every node jumps to its pointer's pointer until each points at a marked node or at -1
    (log2(depth) vectorised passes).
    """
    n = len(parents)
    if not marked.any():  # e.g. named Python frames in a trace without stacks: nothing to climb to
        return np.full(n, -1, dtype=np.int64)
    if _forest is not None:
        nearest = np.empty(n, dtype=np.int64)
        _forest.nearest_marked(
            np.ascontiguousarray(parents, dtype=np.int64), np.ascontiguousarray(marked, dtype=bool), nearest
        )
        return nearest
    # One extra node at the end stands for -1: it points at itself and counts as marked.
    pointer = np.append(np.where(marked, np.arange(n), parents), n)
    pointer[pointer < 0] = n
    done = np.append(marked, True)
    while True:
        pending = np.flatnonzero(~done[pointer])
        if not pending.size:
            break
        pointer[pending] = pointer[pointer[pending]]
    return np.where(pointer[:n] == n, -1, pointer[:n])


class ThreadFrames:
    """The frame events (python_function, cpu_op, user_annotation) of one CPU thread, nested.

    Built once per thread: events sorted by (start, -duration) and each one's parent (`enclosing_parents`),
    so "which events enclose [t0, t1]" is a bisect plus a walk up the parents.
    """

    def __init__(
        self,
        categories: np.ndarray,
        names: list[str],
        starts: np.ndarray,
        ends: np.ndarray,
        name_ids: np.ndarray,
    ):
        """`categories`: per event, its index into `FRAME_CATEGORIES`."""
        order = nesting_order(starts, ends)
        self.category_codes = categories[order]
        self.categories: list[str] = _FRAME_CATEGORY_NAMES[self.category_codes].tolist()
        self.name_ids = name_ids[order]
        self.names = names
        self.starts = starts[order]
        self.ends = ends[order]
        self._starts_list = self.starts.tolist()
        self._ends_list = self.ends.tolist()
        self.parents = enclosing_parents(self.ends)
        self.parent: list[int] = self.parents.tolist()
        self._op_ancestor: np.ndarray | None = None
        self._top_op: np.ndarray | None = None

    def innermost(self, start_us: float, end_us: float) -> int:
        """Index of the innermost frame enclosing [start_us, end_us], or -1."""
        i = bisect_right(self._starts_list, start_us) - 1
        ends = self._ends_list
        while i >= 0 and ends[i] < end_us - NESTING_SLACK_US:
            i = self.parent[i]
        return i

    def innermost_of(self, start_us: np.ndarray, end_us: np.ndarray) -> np.ndarray:
        """`innermost` of many spans at once (a vectorised walk up the parents, one step per level)."""
        at = np.searchsorted(self.starts, start_us, side="right") - 1
        limit = np.asarray(end_us) - NESTING_SLACK_US
        while True:
            walking = np.flatnonzero(at >= 0)
            walking = walking[self.ends[at[walking]] < limit[walking]]
            if not walking.size:
                return at
            at[walking] = self.parents[at[walking]]

    def enclosing_op(self, index: np.ndarray) -> np.ndarray:
        """Per frame index (-1: none), the innermost cpu_op among the frame and its parents, or -1."""
        if self._op_ancestor is None:
            is_op = self.category_codes == FRAME_CATEGORIES.index("cpu_op")
            self._op_ancestor = nearest_marked(self.parents, is_op)
        return self._at(self._op_ancestor, index)

    def outermost_op(self, index: np.ndarray) -> np.ndarray:
        """Per frame index (-1: none), the outermost cpu_op among the frame and its parents, or -1."""
        if self._top_op is None:
            # A chain's top op is an op with no op above it; the nearest top op above a frame is the
            # outermost op of its chain.
            is_op = self.category_codes == FRAME_CATEGORIES.index("cpu_op")
            above = self.enclosing_op(self.parents)
            self._top_op = nearest_marked(self.parents, is_op & (above < 0))
        return self._at(self._top_op, index)

    def name_ids_at(self, index: np.ndarray) -> np.ndarray:
        """Per frame index (-1: none), the frame's name id, or -1."""
        return self._at(self.name_ids, index)

    def nearest_marked(self, index: np.ndarray, marked: np.ndarray) -> np.ndarray:
        """Per frame index (-1: none), the innermost marked frame among the frame and its parents, or -1."""
        return self._at(nearest_marked(self.parents, marked), index)

    @staticmethod
    def _at(per_frame: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.where(index >= 0, per_frame[np.maximum(index, 0)], -1) if len(per_frame) else index

    def chain(self, index: int) -> list[int]:
        """Indices from the outermost frame down to `index`."""
        out = []
        while index >= 0:
            out.append(index)
            index = self.parent[index]
        out.reverse()
        return out


class OpInputs:
    """The `Input Dims`, `Input type` and `Concrete Inputs` args of a trace's cpu_ops
    (`record_shapes`), kept as their JSON text and decoded on demand.

    A trace has ~10^4 ops and an analysis reads the shapes of the few thousand that launched kernels:
    the text costs ~20 bytes an op and no parsing at load (decoding every op's lists into Python
    objects would cost more than the rest of the loading). `dims_text[slot]` and `types_text[slot]`
    hold one op's JSON lists (empty bytes when it recorded none); slots are `EventTable.inputs`.
    `Concrete Inputs` holds the scalar arguments' values as strings (`"True"`, `"0.1"`, a dtype's
    number), "" for a tensor.
    """

    def __init__(self, dims_text: list, types_text: list, concrete_text: list | None = None):
        """`dims_text`, `types_text`, `concrete_text`: per slot, the raw JSON of the op's lists
        (bytes-like)."""
        self._dims_blob, self._dims_at = _pack(dims_text)
        self._types_blob, self._types_at = _pack(types_text)
        self._concrete_blob, self._concrete_at = _pack(concrete_text or [b""] * len(dims_text))

    def __len__(self) -> int:
        return len(self._dims_at) - 1

    def decode(self, slots: np.ndarray) -> tuple[list, list]:
        """Per slot, (its `Input Dims` list, its `Input type` list); None where the op recorded none,
        wrote something other than a JSON list, or has no slot (-1). One JSON decode for all."""
        return _decode_lists(self._dims_blob, self._dims_at, slots), _decode_lists(
            self._types_blob, self._types_at, slots
        )

    def concrete(self, slots: np.ndarray) -> list:
        """Per slot, its `Concrete Inputs` list (None where the op recorded none)."""
        return _decode_lists(self._concrete_blob, self._concrete_at, slots)

    def keys(self, slots: list[int]) -> list[bytes]:
        """Per slot, its (dims, types) JSON text as one key: equal keys are equal recorded inputs (for
        grouping ops by shape before decoding)."""
        dims, dims_at, types, types_at = self._dims_blob, self._dims_at, self._types_blob, self._types_at
        return [
            dims[dims_at[s] : dims_at[s + 1]] + b"|" + types[types_at[s] : types_at[s + 1]] if s >= 0 else b""
            for s in slots
        ]


def _pack(texts: list) -> tuple[bytes, list[int]]:
    """Texts as one blob and the offsets of each (n + 1 of them)."""
    offsets = [0]
    offsets.extend(itertools.accumulate(map(len, texts)))
    return b"".join(texts), offsets


def _decode_lists(blob: bytes, offsets: list[int], slots: np.ndarray) -> list:
    pieces = [
        (blob[offsets[s] : offsets[s + 1]] if s >= 0 else b"") or b"null" for s in np.asarray(slots).tolist()
    ]
    if not pieces:
        return []
    try:
        values = msgspec.json.decode(b"[" + b",".join(pieces) + b"]")
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # a malformed arg: one by one
        values = [_decode_one(piece) for piece in pieces]
    return [value if isinstance(value, list) else None for value in values]


def _decode_one(text: bytes):
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # read as not recorded
        return None


@dataclass
class CollectiveCalls:
    """The host's record of each collective call: Kineto's `record_param_comms` ops with their args.

    Per call, sorted by start: its span and thread (a collective's kernel launch nests inside it),
    the collective's name as c10d writes it (`allreduce`, `_allgather_base`,
    `reduce_scatter_tensor_coalesced`, ...), the message's input and output element counts and
    element type (`Float`, `BFloat16`, ...), and the process group's size. -1 / None: not recorded.
    """

    start_us: np.ndarray
    end_us: np.ndarray
    thread: np.ndarray
    collective: list[str]
    in_nelems: np.ndarray
    out_nelems: np.ndarray
    dtype: list[str | None]
    group_size: np.ndarray

    def __len__(self) -> int:
        return len(self.start_us)

    @classmethod
    def from_columns(
        cls, start, dur, thread, collective, in_nelems, out_nelems, dtype, group_size
    ) -> CollectiveCalls:
        """Build the table from Python lists (each value checked once: the args are the trace's); calls
        timed beyond `MAX_TIME_US` are left out, as `EventTable.from_columns` leaves such events out."""
        start_us = _column(start, np.float64)
        dur_us = np.maximum(_column(dur, np.float64), 0.0)
        order = _timed_order(start_us, dur_us)
        rows = order.tolist()
        return cls(
            start_us=start_us[order],
            end_us=start_us[order] + dur_us[order],
            thread=_column(thread, np.int32)[order],
            collective=[collective[i] for i in rows],
            in_nelems=_int64_column(in_nelems)[order],
            out_nelems=_int64_column(out_nelems)[order],
            dtype=[dtype[i] for i in rows],
            group_size=_int64_column(group_size)[order],
        )


@dataclass
class Trace:
    """One loaded trace file: one profiling window of one process (rank / worker).

    `events` maps each kept category (`KEPT_CATEGORIES`) to its `EventTable`; `memory` holds the
    `[memory]` instant events (`value` = Total Allocated bytes). `sync_sites` is the `sites` list of
    the `<worker>.syncsites.json` found beside the file (see `trainprof.trace.load`), or None.
    A process that profiles several windows (`schedule(repeat=2)`) writes one file per window:
    those traces share `worker` and `rank` (hence `process`) and differ in `window`.
    """

    path: Path
    worker: str
    rank: int | None
    names: list[str]
    threads: list[tuple[Any, Any]]
    events: dict[str, EventTable]
    memory: EventTable
    collective_calls: CollectiveCalls | None = None
    """The collectives' host-side records with their message sizes (None: the trace has none)."""
    device_properties: list[dict] = field(default_factory=list)
    distributed_info: dict | None = None
    metadata: dict = field(default_factory=dict)
    sync_sites: list[dict] | None = None
    sync_sites_path: Path | None = None
    code_layout: CodeLayout | None = None
    """Where the run's library code lived (`trainprof.user_code.CodeLayout`), from the sync sites file."""
    compile_counters: dict | None = None
    """Dynamo's counters the session read when the window ended (`graph_breaks`: the count,
    `graph_break`: reason -> count), from the sync sites file; None when not captured."""
    op_inputs: OpInputs | None = None
    """The cpu_ops' recorded input shapes and dtypes (slots: `events["cpu_op"].inputs`)."""
    device_peaks: dict | None = None
    """The device's peaks measured by the session (`<worker>.peaks.json` beside the file), or None."""
    unprofiled_step_ms: list[float] | None = None
    """Ms of the steps its session ran without the profiler, from the sync sites file (the
    session's module docstring); None when not recorded."""
    unprofiled_timing: str | None = None
    """How they were timed: `cuda_events`, `host`, or None (not said)."""
    unprofiled_pre_forward_ms: list[float] | None = None
    """Per un-profiled step, the ms from its start to its first module forward (as the GPU ran
    them, else on the host), from the sync sites file; None when not recorded."""
    memory_file: MemoryFile | None = None
    """The allocator's state the session captured (`<worker>.memory.json` beside the file,
    `trainprof.trace.memory_file`), or None."""
    window: int = 0
    """Which of its process's profiling windows this file is: 0, 1, ... by start time (`load_traces`)."""
    _frames: dict[int, ThreadFrames] = field(default_factory=dict, repr=False)
    _frame_rows: _FrameRows | None = field(default=None, repr=False)
    _name_ids: dict[str, int] | None = field(default=None, repr=False)

    def name_id(self, name: str) -> int:
        """The index of `name` in `names`, or -1 if no event has that name."""
        if self._name_ids is None:
            self._name_ids = {n: i for i, n in enumerate(self.names)}
        return self._name_ids.get(name, -1)

    def names_matching(self, predicate, among: np.ndarray | None = None) -> np.ndarray:
        """A boolean array over `names`: which names satisfy `predicate(name)`.

        `among` (name ids, repeats allowed): only those names are tried, the others are False (a
        kernel-name regex then searches gpt2_clean's 74 kernel names, not all 591 of its names).
        """
        if among is None:
            return np.fromiter(map(predicate, self.names), dtype=bool, count=len(self.names))  # truthiness
        found = np.zeros(len(self.names), dtype=bool)
        found[among] = True
        tried = np.flatnonzero(found)
        found[tried] = [bool(predicate(self.names[i])) for i in tried.tolist()]
        return found

    def frames(self, thread: int) -> ThreadFrames:
        """The nested frame events of one CPU thread (built on first use)."""
        frames = self._frames.get(thread)
        if frames is None:
            if self._frame_rows is None:
                self._frame_rows = _FrameRows(self.events)
            frames = self._frame_rows.of_thread(thread, self.names)
            self._frames[thread] = frames
        return frames

    @property
    def process(self) -> int | str:
        """The process that recorded the trace: its rank when known, else its worker name.

        The windows of one process share it, so a `repeat=2` run is one process, not two ranks.
        """
        return self.rank if self.rank is not None else self.worker

    @property
    def label(self) -> str:
        """A short name for reports: `rank N` when known, else the worker name."""
        return f"rank {self.rank}" if self.rank is not None else self.worker


class _FrameRows:
    """The frame events of every thread, grouped by thread once.

    Selecting one thread's events with a mask over all events would cost O(threads x events) for a
    trace with many threads (150k threads: minutes); slicing these groups keeps it linear.
    """

    def __init__(self, events: dict[str, EventTable]):
        tables = [events[category] for category in FRAME_CATEGORIES]
        category = np.concatenate([np.full(len(t), i, dtype=np.int8) for i, t in enumerate(tables)])
        thread = np.concatenate([t.thread for t in tables])
        order = np.argsort(thread, kind="stable")  # stable: categories keep FRAME_CATEGORIES order
        self.thread = thread[order]
        self.category = category[order]
        self.starts = np.concatenate([t.start_us for t in tables])[order]
        self.ends = np.concatenate([t.end_us for t in tables])[order]
        self.name_ids = np.concatenate([t.name for t in tables])[order]

    def of_thread(self, thread: int, names: list[str]) -> ThreadFrames:
        """The nested frames of one thread."""
        lo = int(np.searchsorted(self.thread, thread, side="left"))
        hi = int(np.searchsorted(self.thread, thread, side="right"))
        return ThreadFrames(
            self.category[lo:hi],
            names,
            self.starts[lo:hi],
            self.ends[lo:hi],
            self.name_ids[lo:hi],
        )
