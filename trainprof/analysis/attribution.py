"""Who launched each kernel: its forward op, its `nn.Module`, and its phase (forward, backward, optimizer).

A forward kernel is launched inside the op that asked for it, on the training loop's thread, under
the `nn.Module: Name_i` frames that a `with_stack` trace records around every module call. A backward
kernel is launched on one of autograd's threads, under `autograd::engine::evaluate_function: XBackward0`,
with no Python stack at all. Kineto links the two: every op recorded with autograd on carries
`Sequence number` (the autograd counter when it ran) and `Fwd thread id` (0 on a forward op; on a
backward op, the profiler's number of the thread whose forward op created the node). The link, as
Kineto's own `fwdbwd` flow events draw it (checked against them on the shared GPT-2 and MI300 traces):
a backward op with (`Fwd thread id` k, `Sequence number` n) belongs to the last-starting forward op with
sequence number n on thread k. The forward op's frames then give the backward kernel its module.

Rules, exactly (per kernel, from the runtime call that launched it):
- backward: an enclosing cpu_op has `Fwd thread id` > 0 or is an `autograd::engine::evaluate_function:`;
  op and module are those of the linked forward op (unlinked: the backward node's name, no module);
- optimizer: launched inside an `Optimizer.step#...` / `Optimizer.zero_grad#...` range;
- forward: launched inside an `nn.Module` frame, or inside an op whose autograd node some backward op ran;
- otherwise no phase (e.g. a metric computed in the user's loop).
- The op of a forward kernel is the innermost enclosing op recorded with a sequence number (the one
  that created the autograd node: `aten::addmm` under `aten::linear`), else the innermost op.
- The module is the innermost `nn.Module` frame enclosing the launch (or the linked forward op):
  a kernel counts for that module alone, not for its parents.

Everything is vectorised per category (`enclosing_parents` nests the cpu_ops), so attributing
every kernel of a trace costs about as much as loading its cpu_ops.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct, unique_inverse
from trainprof.analysis.frames import PyFrame, parse_py_frame
from trainprof.analysis.timeline import Timeline
from trainprof.trace import Trace
from trainprof.trace.model import NESTING_SLACK_US, enclosing_parents, nearest_marked, nesting_order
from trainprof.user_code import is_user_file

PHASES = (None, "forward", "backward", "optimizer")
"""Phase codes of `KernelOwners.phase`: index 0 is "no phase" (None)."""
FORWARD, BACKWARD, OPTIMIZER = 1, 2, 3

MODULE_PREFIX = "nn.Module: "
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")
_INSTANCE = re.compile(r"_\d+$")  # the profiler numbers module instances per class: GPT2Block_3
_SEQ_BITS = 40  # (thread, sequence number) packed into one int64 key; sequence numbers stay far below 2^40


class ModuleRef(msgspec.Struct, frozen=True):
    """One `nn.Module` instance as the trace names it.

    `path`: the enclosing module frames' names, outermost first (`GPT2LMHeadModel_0/GPT2Model_0/GPT2Block_3/
    GPT2Attention_3`); `class_path`: the same without instance numbers (`GPT2LMHeadModel/.../GPT2Attention`);
    `name`: the module's class (`GPT2Attention`); `thread`, `start_us`, `end_us`: one call of it (the first),
    whose Python frames hold the module's source file.
    """

    path: str
    class_path: str
    name: str
    thread: int
    start_us: float
    end_us: float


class KernelOwners(msgspec.Struct):
    """Who launched each kernel of `timeline.kernels` (every array is parallel to it).

    `phase`: codes into `PHASES`; `op`: index into `ops` (-1 unknown), the forward op that created
    the kernel's work, also for its backward kernels; `module`: index into `modules` (-1 none);
    `linked`: a backward kernel whose forward op was found; `site_thread`/`site_start_us`/`site_end_us`:
    the CPU span whose enclosing frames own the kernel (the launch call, or the linked forward op of
    a backward kernel; thread -1 when the kernel has no launch call), for looking up user frames.
    `launch_op`: the row in `trace.events["cpu_op"]` of the innermost op around the kernel's launch
    (-1 none), whose recorded inputs are the kernel's work; `op_parent`: per cpu_op row, the row of
    the op it runs inside (-1 none).
    """

    phase: np.ndarray
    op: np.ndarray
    module: np.ndarray
    linked: np.ndarray
    site_thread: np.ndarray
    site_start_us: np.ndarray
    site_end_us: np.ndarray
    ops: list[str]
    modules: list[ModuleRef]
    launch_op: np.ndarray
    op_parent: np.ndarray

    def phase_of(self, kernel: int) -> str | None:
        """`"forward"`, `"backward"`, `"optimizer"` or None for one kernel."""
        return PHASES[int(self.phase[kernel])]

    def op_of(self, kernel: int) -> str | None:
        """The forward op of one kernel (`aten::addmm`), or None."""
        index = int(self.op[kernel])
        return self.ops[index] if index >= 0 else None

    def module_of(self, kernel: int) -> ModuleRef | None:
        """The innermost `nn.Module` of one kernel, or None."""
        index = int(self.module[kernel])
        return self.modules[index] if index >= 0 else None


class AttributionIndex:
    """A trace's cpu_ops, `nn.Module` frames and optimizer ranges, nested once, for attributing many
    sites (kernel launches, allocations) to their op, module and phase."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.ops = _OpIndex(trace) if len(trace.events["cpu_op"]) else None
        self._modules: _ModuleIndex | None = None
        self._optimizer: _Nesting | None = None

    @property
    def modules(self) -> _ModuleIndex:
        """The `nn.Module` frames (built on first use)."""
        if self._modules is None:
            self._modules = _ModuleIndex(self.trace)
        return self._modules

    @property
    def optimizer(self) -> _Nesting:
        """The optimizer's step and zero_grad ranges (built on first use)."""
        if self._optimizer is None:
            self._optimizer = _optimizer_nesting(self.trace)
        return self._optimizer


def attribute_kernels(timeline: Timeline, index: AttributionIndex | None = None) -> KernelOwners:
    """The forward op, `nn.Module` and phase of every kernel of `timeline` (see the module docstring).
    `index`: the trace's `AttributionIndex` when the caller has it (built here otherwise)."""
    kernels, calls = timeline.kernels, timeline.calls
    n = len(kernels)
    has_call = timeline.kernel_call >= 0
    call = np.clip(timeline.kernel_call, 0, None)
    if not len(calls):
        launch_thread = np.full(n, -1, dtype=np.int64)
        launch_start = launch_end = np.zeros(n)
    else:
        launch_thread = np.where(has_call, calls.thread[call], -1).astype(np.int64)
        launch_start = np.where(has_call, calls.start_us[call], 0.0)
        launch_end = np.where(has_call, calls.end_us[call], 0.0)
    return attribute_sites(index or AttributionIndex(timeline.trace), launch_thread, launch_start, launch_end)


def attribute_sites(
    index: AttributionIndex, thread: np.ndarray, start_us: np.ndarray, end_us: np.ndarray
) -> KernelOwners:
    """The forward op, `nn.Module` and phase of the work done at each CPU site ([start_us, end_us] on
    `thread`, -1: no site): a kernel's launch call, an allocation's instant. The rules of the module
    docstring, read with "the site" for "the launch"."""
    trace = index.trace
    n = len(thread)
    launch_thread, launch_start, launch_end = thread, start_us, end_us
    cpu_ops = trace.events["cpu_op"]
    if index.ops is None:  # launches but no ops recorded: nothing can own a kernel
        unknown = np.full(n, -1, dtype=np.int64)
        return KernelOwners(
            phase=np.zeros(n, dtype=np.int8), op=unknown, module=unknown.copy(),
            linked=np.zeros(n, dtype=bool), site_thread=launch_thread, site_start_us=launch_start,
            site_end_us=launch_end, ops=[], modules=[], launch_op=unknown.copy(),
            op_parent=np.zeros(0, dtype=np.int64),
        )
    ops = index.ops
    op_of_kernel = ops.nesting.innermost(launch_thread, launch_start, launch_end)

    phase = np.zeros(n, dtype=np.int8)
    op = np.full(n, -1, dtype=np.int64)  # a cpu_op row for now; turned into an index into `ops` below
    site_thread = launch_thread.copy()
    site_start, site_end = launch_start.copy(), launch_end.copy()
    linked = np.zeros(n, dtype=bool)
    backward_node = np.full(n, -1, dtype=np.int64)

    inside = op_of_kernel >= 0
    within = np.clip(op_of_kernel, 0, None)
    backward_op = np.where(inside, ops.backward_ancestor[within], -1)
    is_backward = backward_op >= 0
    forward_row = np.where(is_backward, ops.link[np.clip(backward_op, 0, None)], -1)
    linked = forward_row >= 0
    row = np.clip(forward_row, 0, None)
    phase[is_backward] = BACKWARD
    op[linked] = forward_row[linked]
    backward_node[is_backward & ~linked] = backward_op[is_backward & ~linked]
    # An unlinked backward kernel (`AccumulateGrad` has no forward op) is owned by whatever the loop's
    # thread was doing meanwhile: it waits inside the user's `loss.backward()` call.
    site_thread[is_backward] = np.where(linked, cpu_ops.thread[row], ops.forward_thread)[is_backward]
    site_start[linked] = cpu_ops.start_us[row][linked]
    site_end[linked] = cpu_ops.end_us[row][linked]

    forward = inside & ~is_backward
    creator = np.where(forward, ops.creator_ancestor[within], -1)
    op[forward] = np.where(creator >= 0, creator, op_of_kernel)[forward]

    modules = index.modules
    module = modules.nesting.innermost(site_thread, site_start, site_end)
    optimizer = index.optimizer.innermost(launch_thread, launch_start, launch_end) >= 0
    phase[~is_backward & optimizer] = OPTIMIZER
    feeds_backward = forward & (ops.link_target_ancestor[within] >= 0)
    phase[~is_backward & ~optimizer & ((module >= 0) | feeds_backward)] = FORWARD

    # Op names: a forward op's own name; an unlinked backward op's node (`AccumulateGrad`, `XBackward0`).
    names: list[str] = []
    name_index: dict[str, int] = {}
    op_index = np.full(n, -1, dtype=np.int64)
    for source, is_node in ((op, False), (backward_node, True)):
        has = source >= 0
        name_ids, inverse = unique_inverse(cpu_ops.name[source[has]])
        index_of = []
        for name_id in name_ids.tolist():
            name = _node_name(trace.names[name_id]) if is_node else trace.names[name_id]
            index_of.append(name_index.setdefault(name, len(name_index)))
            if len(names) < len(name_index):
                names.append(name)
        op_index[has] = np.asarray(index_of, dtype=np.int64)[inverse]
    module_index, refs = modules.refs(module)
    return KernelOwners(
        phase=phase,
        op=op_index,
        module=module_index,
        linked=linked,
        site_thread=site_thread,
        site_start_us=site_start,
        site_end_us=site_end,
        ops=names,
        modules=refs,
        launch_op=op_of_kernel,
        op_parent=ops.nesting.parent,
    )


def _node_name(name: str) -> str:
    """`AddmmBackward0` for `autograd::engine::evaluate_function: AddmmBackward0`; `torch::autograd::`
    dropped (`AccumulateGrad`)."""
    return name.removeprefix(BACKWARD_PREFIX).removeprefix("torch::autograd::")


class _Nesting:
    """Properly nested CPU ranges of several threads, answering "innermost range enclosing [s, e] on
    thread t" for many queries at once (a bisect, then a vectorised walk up the parents).

    Built from parallel arrays; indices in and out are rows of those arrays.
    """

    def __init__(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray):
        order = nesting_order(start, end, thread)  # by thread, start, longest first
        self.order = order
        self.thread = thread[order].astype(np.int64)
        self.start = start[order]
        self.end = end[order]
        # Each thread's ranges in one group: the first row of each row's thread bounds its parent.
        self.sorted_parent = enclosing_parents(self.end, np.searchsorted(self.thread, self.thread))
        # Parents as rows of the input arrays (for callers that walk the tree in input order).
        self.parent = np.full(len(order), -1, dtype=np.int64)
        has = self.sorted_parent >= 0
        self.parent[order[has]] = order[self.sorted_parent[has]]

    def innermost(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per query, the row of the innermost range on `thread` enclosing [start, end], or -1."""
        found = np.full(len(thread), -1, dtype=np.int64)
        if not len(self.order) or not len(thread):
            return found
        # Queries grouped by thread once (a mask per thread would cost threads x queries).
        by_thread = np.argsort(thread, kind="stable")
        present, first = np.unique(thread[by_thread], return_index=True)
        for t, asked in zip(present.tolist(), np.split(by_thread, first[1:]), strict=True):
            if t < 0:
                continue
            lo, hi = np.searchsorted(self.thread, [t, t + 1])
            if lo == hi:
                continue
            at = lo + np.searchsorted(self.start[lo:hi], start[asked], side="right") - 1
            at[at < lo] = -1
            query_end = end[asked] - NESTING_SLACK_US
            while True:
                short = (at >= 0) & (self.end[np.clip(at, 0, None)] < query_end)
                if not short.any():
                    break
                at[short] = self.sorted_parent[at[short]]
            found[asked] = np.where(at >= 0, self.order[np.clip(at, 0, None)], -1)
        return found

    def nearest_marked(self, marked: np.ndarray) -> np.ndarray:
        """Per row, the innermost marked row among itself and its ancestors (-1 if none)."""
        return nearest_marked(self.parent, marked)


class _OpIndex:
    """The cpu_ops nested per thread, with each op's innermost backward op, node-creating op and
    link-target ancestors, and the forward op every backward op links to."""

    def __init__(self, trace: Trace):
        cpu_ops = trace.events["cpu_op"]
        count = len(cpu_ops)
        self.nesting = _Nesting(cpu_ops.thread, cpu_ops.start_us, cpu_ops.end_us)
        sequence = cpu_ops.sequence if cpu_ops.sequence is not None else np.full(count, -1)
        fwd_thread = cpu_ops.fwd_thread if cpu_ops.fwd_thread is not None else np.full(count, -1)
        is_evaluate = trace.names_matching(lambda name: name.startswith(BACKWARD_PREFIX))[cpu_ops.name]
        is_forward = (sequence >= 0) & (fwd_thread <= 0)
        is_backward = ((sequence >= 0) & (fwd_thread > 0)) | is_evaluate
        self.link = _link_backward_ops(cpu_ops.thread, cpu_ops.start_us, sequence, fwd_thread, is_forward)
        target = np.zeros(count, dtype=bool)
        target[self.link[self.link >= 0]] = True
        target_threads = cpu_ops.thread[target]
        self.forward_thread = int(np.bincount(target_threads).argmax()) if len(target_threads) else -1
        """The thread whose forward ops most backward ops link to (the training loop's), -1 if none."""
        self.backward_ancestor = self.nesting.nearest_marked(is_backward)
        self.creator_ancestor = self.nesting.nearest_marked(is_forward)
        self.link_target_ancestor = self.nesting.nearest_marked(target)


def _link_backward_ops(
    thread: np.ndarray,
    start: np.ndarray,
    sequence: np.ndarray,
    fwd_thread: np.ndarray,
    is_forward: np.ndarray,
) -> np.ndarray:
    """Per cpu_op, the row of the forward op its backward op belongs to (-1 for forward ops and unlinked).

    `Fwd thread id` is the profiler's own thread number, not the trace's `tid`: each number is mapped
    to the trace thread whose forward ops share the most sequence numbers with its backward ops.
    """
    link = np.full(len(thread), -1, dtype=np.int64)
    is_backward = (sequence >= 0) & (fwd_thread > 0) & (sequence < (1 << _SEQ_BITS))
    forward_rows = np.flatnonzero(is_forward & (sequence < (1 << _SEQ_BITS)))
    if not is_backward.any() or not len(forward_rows):
        return link
    forward_threads, forward_counts = np.unique(thread[forward_rows], return_counts=True)
    candidates = forward_threads[np.argsort(-forward_counts, kind="stable")[:16]]  # loop threads, few
    sequences_of = {int(t): distinct(sequence[forward_rows[thread[forward_rows] == t]]) for t in candidates}
    trace_thread = np.full(len(thread), -1, dtype=np.int64)
    for number in distinct(fwd_thread[is_backward]).tolist():
        rows = is_backward & (fwd_thread == number)
        wanted = distinct(sequence[rows])
        matches = {
            t: int(np.isin(wanted, seqs, assume_unique=True).sum()) for t, seqs in sequences_of.items()
        }
        best = max(matches, key=matches.__getitem__)
        if matches[best]:
            trace_thread[rows] = best

    # The last-starting forward op of each (thread, sequence number): the op that created the node.
    keys = (thread[forward_rows].astype(np.int64) << _SEQ_BITS) | sequence[forward_rows]
    order = np.lexsort((start[forward_rows], keys))
    keys, rows_by_key = keys[order], forward_rows[order]
    last = np.ones(len(keys), dtype=bool)
    last[:-1] = keys[1:] != keys[:-1]
    keys, rows_by_key = keys[last], rows_by_key[last]

    backward_rows = np.flatnonzero(is_backward & (trace_thread >= 0))
    wanted = (trace_thread[backward_rows] << _SEQ_BITS) | sequence[backward_rows]
    at = np.clip(np.searchsorted(keys, wanted), 0, len(keys) - 1)
    hit = keys[at] == wanted
    link[backward_rows[hit]] = rows_by_key[at[hit]]
    return link


class _ModuleIndex:
    """The `nn.Module: Name_i` frames of a `with_stack` trace, nested per thread, with their paths."""

    def __init__(self, trace: Trace):
        python = trace.events["python_function"]
        is_module = trace.names_matching(lambda name: name.startswith(MODULE_PREFIX))
        self.rows = np.flatnonzero(is_module[python.name]) if len(python) else np.zeros(0, dtype=np.int64)
        thread = python.thread[self.rows]
        start, end = python.start_us[self.rows], python.end_us[self.rows]
        self.nesting = _Nesting(thread, start, end)
        self.thread, self.start, self.end = thread, start, end
        self.frame_names = [
            trace.names[i].removeprefix(MODULE_PREFIX) for i in python.name[self.rows].tolist()
        ]

    def refs(self, frame: np.ndarray) -> tuple[np.ndarray, list[ModuleRef]]:
        """Module frames (rows of this index, -1 none) as indices into `ModuleRef`s, one per path."""
        parent = self.nesting.parent.tolist()
        paths: dict[int, str] = {}

        def path_of(i: int) -> str:
            if i not in paths:
                chain = []
                j = i
                while j >= 0 and j not in paths:
                    chain.append(j)
                    j = parent[j]
                prefix = paths[j] + "/" if j >= 0 else ""
                for k in reversed(chain):
                    paths[k] = prefix + self.frame_names[k]
                    prefix = paths[k] + "/"
            return paths[i]

        ref_of_frame = np.full(len(self.rows) + 1, -1, dtype=np.int64)  # the last slot answers frame -1
        refs: list[ModuleRef] = []
        by_path: dict[str, int] = {}
        # The earliest call of each module names its ModuleRef: walk frames in time order.
        used = distinct(frame[frame >= 0])
        for i in used[np.argsort(self.start[used], kind="stable")].tolist():
            path = path_of(i)
            ref = by_path.get(path)
            if ref is None:
                ref = by_path[path] = len(refs)
                class_path = "/".join(_INSTANCE.sub("", part) for part in path.split("/"))
                refs.append(
                    ModuleRef(
                        path=path,
                        class_path=class_path,
                        name=class_path.rsplit("/", 1)[-1],
                        thread=int(self.thread[i]),
                        start_us=float(self.start[i]),
                        end_us=float(self.end[i]),
                    )
                )
            ref_of_frame[i] = ref
        return ref_of_frame[frame], refs


class UserFrames:
    """The user's own `python_function` frames (`trainprof.user_code.is_user_file`), nested per thread.

    Answers "the innermost user frame around each of these CPU spans" at once; each distinct frame
    name is parsed once, and only user frames are nested (a `with_stack` trace holds ~10^5 library
    frames, which nesting all frames would walk).
    """

    def __init__(self, trace: Trace):
        python = trace.events["python_function"]
        self._frames: dict[int, PyFrame] = {}
        for name_id in distinct(python.name).tolist() if len(python) else []:
            frame = parse_py_frame(trace.names[name_id])
            if frame is not None and is_user_file(frame.file, trace.code_layout):
                self._frames[name_id] = frame
        is_user = np.zeros(len(trace.names), dtype=bool)
        is_user[list(self._frames)] = True
        self._rows = np.flatnonzero(is_user[python.name]) if len(python) else np.zeros(0, dtype=np.int64)
        self._name = python.name[self._rows]
        rows = self._rows
        self._nesting = _Nesting(python.thread[rows], python.start_us[rows], python.end_us[rows])

    def innermost(self, thread: np.ndarray, start_us: np.ndarray, end_us: np.ndarray) -> list[PyFrame | None]:
        """Per span (`thread` -1: none), the innermost user frame enclosing it, or None."""
        found = self._nesting.innermost(thread, start_us, end_us)
        return [self._frames[int(self._name[i])] if i >= 0 else None for i in found.tolist()]


def _optimizer_nesting(trace: Trace) -> _Nesting:
    """The `Optimizer.step#...` / `Optimizer.zero_grad#...` ranges (user_annotation; cpu_op in old traces)."""
    is_optimizer = trace.names_matching(lambda name: name.startswith(OPTIMIZER_PREFIXES))
    parts = [trace.events[category] for category in ("user_annotation", "cpu_op")]
    masks = [is_optimizer[table.name] for table in parts]
    return _Nesting(
        np.concatenate([t.thread[m] for t, m in zip(parts, masks, strict=True)]),
        np.concatenate([t.start_us[m] for t, m in zip(parts, masks, strict=True)]),
        np.concatenate([t.end_us[m] for t, m in zip(parts, masks, strict=True)]),
    )
