"""Question 4: while the GPU sat idle inside a step, what was the host doing? And the step's verdict.

Every GPU-idle interval inside a step (no kernel, copy or memset running) is cut into pieces at
every host event boundary, and each piece gets the cause read from the host events covering it,
innermost first:

1. A CUDA/HIP runtime call on the loop's thread decides by its kind (`runtime_calls`, table
   `CALL_CAUSES`): a launch is `launch`, a synchronize is `sync` (only while the host is inside the
   call: what follows it is classified on its own), an allocation, free, context or stream creation
   or a blocking copy is `blocking`. A launch longer than `long_launch_us` is the kernel's first use
   loading its code (`warmup`). Inside a library warm-up region every call but a context creation
   counts as `warmup` (cuDNN's algorithm search frees and allocates as part of the search).
2. Else the innermost frame (cpu_op, python_function, user_annotation) and its enclosing frames,
   innermost first, by the name rules of `FRAME_RULES` (`profiler`, `input`, `comm`, `warmup`) and
   one rule on op instances (a cuDNN/cuBLAS/MIOpen op call that is its op's first or an outlier and
   lasts at least `warmup_call_min_ms`: `warmup`). A cpu_op chain that launches GPU work is
   `launch` (the host is in ATen's dispatch on the way to a launch); Python frames below it are
   not. A `profiler` frame (trainprof's or torch.profiler's own code) holds only its own code and
   what that calls in the standard library: user or library code it calls (the original a wrapper
   calls through to, a user's callback) is classified as if the profiler's frame were not there.
3. Else, inside any other frame: `host`, named by the innermost Python function (file, function,
   user or library code), else the innermost op or annotation.
4. No frame on the loop's thread: `unknown`.

The loop's thread decides first. Where it is in `host`, `unknown` or `profiler` (e.g. waiting in
`loss.backward()` while autograd's thread launches the backward kernels), another thread that is
in a runtime call or a launching op decides instead.

One-off costs (`warmup`, and context creation among `blocking`) and `profiler` time (the
profiler's own cost, which an un-profiled run does not pay) are reported as such and left out of
the steady-state verdict. The verdict is the cause group with the most steady-state idle time, if
it has `dominant_cause_margin` times the runner-up's; else `mixed`. Numbers: `thresholds.py`.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trainprof.analysis.arrays import distinct, unique_inverse
from trainprof.analysis.frames import PROFILER_FILES, PyFrame, parse_py_frame
from trainprof.analysis.result import Finding
from trainprof.analysis.runtime_calls import KINDS, blocking_copies
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import FRAME_CATEGORIES, nearest_marked
from trainprof.user_code import CodeLayout, current_layout, is_user_file, library_of


@dataclass(frozen=True)
class IdleCause:
    """One cause of GPU idle time: what it means, the verdict it names, how to remove it."""

    name: str
    verdict: str | None  # None: never the verdict (the profiler's own cost, not the training's)
    meaning: str
    fix: str
    one_off: bool = False  # a cost paid once (first use), never the steady-state verdict


CAUSES: tuple[IdleCause, ...] = (
    IdleCause(
        "launch",
        "launch-bound",
        "the host is issuing short kernel launches (ATen dispatch and the launch calls) and the GPU "
        "finishes each kernel before the next arrives",
        "Fewer, larger launches: capture the step with CUDA graphs or torch.compile(mode="
        "'reduce-overhead'), use fused/foreach optimizers, and replace Python loops over tensors with "
        "one batched op.",
    ),
    IdleCause(
        "sync",
        "sync-bound",
        "the host is inside a synchronize call, waiting for the device",
        "Remove the host-device syncs from the step (see the sync findings): keep values on the GPU "
        "and read them every N steps; use pinned memory and non_blocking copies.",
    ),
    IdleCause(
        "blocking",
        "blocking-call-bound",
        "the host is inside a runtime call that blocks: allocation or free, context or stream "
        "creation, a synchronous copy",
        "Keep blocking runtime calls out of the loop: let the caching allocator stay warm (no "
        "torch.cuda.empty_cache(), stable shapes, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
        "create streams and events once, and copy from pinned memory with non_blocking=True.",
    ),
    IdleCause(
        "warmup",
        "warm-up-bound",
        "a library warms up: cuDNN/cuBLAS algorithm search or handle creation, a kernel's first "
        "launch loading its module, torch.compile or Triton compilation, CUDA graph capture",
        "Warm up before profiling: start the profiler after a few steps (schedule(wait=..., "
        "warmup=...) or skip_first); with cudnn.benchmark keep input shapes fixed so the search runs "
        "once; avoid recompilation (torch._dynamo.explain, mark_dynamic).",
        one_off=True,
    ),
    IdleCause(
        "input",
        "input-bound",
        "the loop waits for its next batch (DataLoader __next__) or prepares it on the training thread",
        "Feed the GPU faster: DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, "
        "prefetch_factor=...), move decoding and augmentation off the training thread or onto the "
        "GPU, and prefetch the next batch while the current step runs.",
    ),
    IdleCause(
        "host",
        "host-bound",
        "the host runs other Python (named below) with no GPU work queued",
        "Make the named host code cheaper or move it out of the step: cache what is recomputed every "
        "step, drop per-step module walks, logging and introspection, or run it every N steps.",
    ),
    IdleCause(
        "comm",
        "communication-bound",
        "the host is inside a collective or barrier, waiting for other ranks",
        "Overlap communication with compute (DDP bucket_cap_mb, FSDP prefetch), keep host-side "
        "collectives (barrier, *_object collectives, gloo) out of the step, and balance work between "
        "ranks.",
    ),
    IdleCause(
        "unknown",
        "host-bound",
        "the host is in code the trace does not record (no python_function or op event on any thread)",
        "Profile with with_stack=True (or py-spy) to name the host code; common culprits are "
        "time.sleep, Python without stacks, C extensions and the GIL.",
    ),
    IdleCause(
        "profiler",
        None,
        "the host runs the profiler's own code while it records: trainprof's hooks (sync call-site "
        "capture, step detection) or torch.profiler's",
        "Nothing to change in the training code: an un-profiled run does not pay this. To shrink it "
        "while profiling, record fewer steps (a smaller `active`) or turn off what is not needed: "
        "capture_syncs=False drops the sync call-site capture, with_stack=False the Python stacks "
        "(and with them the names of host code).",
    ),
)
CAUSE_NAMES = tuple(c.name for c in CAUSES)
_CODE = {name: i for i, name in enumerate(CAUSE_NAMES)}
_NONE = -1
LAUNCH, SYNC, BLOCKING, WARMUP, INPUT, HOST, COMM, UNKNOWN, PROFILER = (_CODE[n] for n in CAUSE_NAMES)
# Causes another thread may lend the loop's thread when that one is only in `host`/`unknown`/`profiler`,
# strongest first (the GPU waits on what that thread is doing).
_LENT_BY_OTHER_THREADS = (SYNC, BLOCKING, WARMUP, COMM, LAUNCH)


@dataclass(frozen=True)
class FrameRule:
    """A frame name pattern that sets the cause of the time spent inside that frame."""

    cause: str
    pattern: str
    reason: str
    # The thread only waits here while another thread works: what another thread does decides
    # first (as for `host`/`unknown` time), and `cause` holds only where no other thread is busy.
    waits_on_other_threads: bool = False


# Frame names: python_function `file(line): function`, cpu_op `aten::x`, annotations as recorded.
# First match wins. These hold for everything nested inside the frame unless something more inner
# (a runtime call, a launching op, an inner rule) decides; `profiler` frames hold only their own
# code and the standard library they call (`_through_profiler`).
FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule(
        "profiler",
        r"(^|/)trainprof/(?!demo\.py\()[\w/]+\.py\(\d+\): ",
        "trainprof's own code inside a recorded step: sync call-site capture, step detection, its "
        "wrappers (not trainprof/demo.py, the demo's training loop, which is the user's code there)",
    ),
    FrameRule(
        "profiler",
        r"(^|/)(" + "|".join(re.escape(file) for file in PROFILER_FILES) + ")",
        "torch.profiler's own code: its step, record_function's enter and exit (`frames.PROFILER_FILES`)",
    ),
    FrameRule("input", r"^enumerate\(DataLoader\)#", "torch.profiler's range around DataLoader.__next__"),
    FrameRule(
        "input",
        r"torch/utils/data/dataloader\.py\(\d+\): (__next__|_next_data|_get_data|_try_get_data)$",
        "the DataLoader fetching the next batch (waiting on workers when num_workers>0)",
    ),
    FrameRule(
        "input",
        r"torch/utils/data/_utils/(collate|fetch|pin_memory)\.py\(",
        "collation, in-process fetching (num_workers=0) and pinning of a batch",
    ),
    FrameRule("input", r"(^|/)datasets/(arrow_dataset|formatting/)", "a Hugging Face dataset's __getitem__"),
    FrameRule("input", r"transformers/data/data_collator\.py\(", "a transformers data collator"),
    FrameRule(
        "input",
        r"transformers/tokenization_utils\w*\.py\(\d+\): (__call__|_call_one|batch_encode_plus|"
        r"_batch_encode_plus|encode_plus|_encode_plus|pad)$",
        "tokenizing inputs on the training thread",
    ),
    FrameRule(
        "input", r"(^|/)(torchvision/transforms|torchvision/io|PIL)/", "image decoding and augmentation"
    ),
    FrameRule(
        "input",
        r"\): (get_batch|next_batch|load_batch|prepare_batch|make_batch|collate\w*|preprocess\w*)$",
        "a function named for preparing data (the user's data preparation)",
    ),
    FrameRule(
        "launch",
        r"torch/autograd/graph\.py\(\d+\): _engine_run_backward$",
        "the loop's thread waits while autograd's engine issues the backward ops on its own thread; "
        "between the engine's ops (its scheduling, no op recorded) the host is issuing backward work",
        waits_on_other_threads=True,
    ),
    FrameRule("comm", r"^gloo:", "a gloo collective runs on the host: it waits for the other ranks"),
    FrameRule("comm", r"^c10d::(barrier|monitored_barrier)", "a barrier: the host waits for every rank"),
    FrameRule(
        "comm",
        r"^(c10d::wait|aten::wait|_?c10d_functional::wait_tensor)",
        "the host waits for an asynchronous collective",
    ),
    FrameRule(
        "comm",
        r"torch/distributed/distributed_c10d\.py\(\d+\): (barrier|monitored_barrier|all_gather_object|"
        r"gather_object|broadcast_object_list|scatter_object_list|send|recv|wait)$",
        "a host-side collective or point-to-point call",
    ),
    FrameRule(
        "comm",
        r"^(record_param_comms|nccl:|c10d::)",
        "the host inside a collective's enqueue (process-group bookkeeping around the NCCL launch)",
    ),
    FrameRule(
        "warmup",
        r"torch/_dynamo/(convert_frame|symbolic_convert|output_graph)\.py\(",
        "torch.compile tracing a frame (Dynamo)",
    ),
    FrameRule(
        "warmup",
        r"torch/_inductor/(compile_fx|codecache|async_compile|graph|codegen/\w+)\.py\(",
        "torch.compile generating and compiling code (Inductor)",
    ),
    FrameRule("warmup", r"torch/_functorch/aot_autograd\.py\(", "torch.compile building the joint graph"),
    FrameRule("warmup", r"(^|/)triton/compiler/", "Triton compiling a kernel"),
    FrameRule(
        "warmup",
        r"torch/cuda/graphs\.py\(\d+\): "
        r"(capture_begin|capture_end|__enter__|__exit__|make_graphed_callables)$",
        "CUDA graph capture",
    ),
    FrameRule(
        "warmup",
        r"torch/_inductor/cudagraph_trees\.py\(\d+\): (record_function|run_eager|_record)$",
        "torch.compile's CUDA graph trees recording or warming up a graph",
    ),
)
# Internal code of a `waits_on_other_threads` rule's time until other threads are consulted.
_WAITING = len(CAUSE_NAMES)
_FRAME_RULE_CODES = tuple(_WAITING if r.waits_on_other_threads else _CODE[r.cause] for r in FRAME_RULES)
_WAITING_CAUSE = next(_CODE[r.cause] for r in FRAME_RULES if r.waits_on_other_threads)

# cpu_ops whose first (or an outlier) call is library warm-up when it lasts `warmup_call_min_ms`:
# cuDNN/MIOpen algorithm search, cuBLAS/cuBLASLt handle and workspace creation, attention backends.
WARMUP_OPS = re.compile(
    r"^aten::(_?cudnn_\w+|_?miopen_\w+|mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|"
    r"_?convolution\w*|conv\w+|_scaled_dot_product_\w+|_flash_attention_\w+|_efficient_attention_\w+)$"
)
# Runtime calls that belong to graph capture (warm-up), whatever their kind.
_CAPTURE_CALLS = re.compile(
    r"^(cuda|hip|cu)(StreamBeginCapture|StreamEndCapture|GraphInstantiate|GraphUpload)"
)
# Runtime call kind -> cause (on the loop's thread). Launch-like bookkeeping (event records, queries,
# attribute reads) is the host on its way to a launch.
CALL_CAUSES: dict[str, int] = {
    "launch": LAUNCH,
    "graph_launch": LAUNCH,
    "sync": SYNC,
    "copy": LAUNCH,  # asynchronous copies; blocking ones (is_blocking_copy) are BLOCKING
    "memset": LAUNCH,
    "alloc": BLOCKING,
    "free": BLOCKING,
    "context": BLOCKING,
    "stream_create": BLOCKING,
    "event": LAUNCH,
    "query": LAUNCH,
    "other": LAUNCH,
}
# Call kinds another thread's calls can lend (its event queries and attribute reads are bookkeeping,
# e.g. NCCL's watchdog polling events, not what the GPU waits for).
_LENDING_KINDS = frozenset(
    {"launch", "graph_launch", "sync", "copy", "memset", "alloc", "free", "context", "stream_create"}
)
# The same two sets as lookup tables over call kind codes (np.isin per thread costs 100x more).
_GPU_WORK_KIND = np.array([k in ("launch", "graph_launch", "copy", "memset") for k in KINDS])
_LENDING_KIND = np.array([k in _LENDING_KINDS for k in KINDS])
_STEP_ANNOTATION = re.compile(r"^ProfilerStep#\d+$")


# Leading anchors of frame patterns -> their form in `_name_rules`' text, where a newline starts
# each name: re's search then only tries the positions of the newlines (a literal prefix), or of the
# newlines and slashes (a first-character set), not every position of the text.
_JOINED_ANCHORS = (("^", "\n"), ("(^|/)", "[\n/]"))


def _joined_form(source: str) -> tuple[re.Pattern, int]:
    """A frame pattern for `_name_rules`' text of newline-separated names, `$` matching at each
    line's end; with a leading anchor of `_JOINED_ANCHORS` rewritten (1: its matches start one
    character before the name or path part they anchor) when the anchor covers the whole pattern."""
    for anchor, joined in _JOINED_ANCHORS:
        rest = source[len(anchor):]
        if source.startswith(anchor) and "^" not in rest and not _alternates_at_top(rest):
            return re.compile(joined + rest, re.MULTILINE), 1
    return re.compile(source, re.MULTILINE), 0


def _alternates_at_top(source: str) -> bool:
    """Whether a pattern has a `|` outside every group (`^a|b`: the anchor holds for `a` only)."""
    depth, escaped, in_set = 0, False, False
    for char in source:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_set:
            in_set = char != "]"
        elif char == "[":
            in_set = True
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            return True
    return False


# Compiled once, as the plain patterns were (the plain ones serve names holding a newline).
_FRAME_RULES_JOINED = tuple(_joined_form(r.pattern) for r in FRAME_RULES)
_WARMUP_OPS_JOINED = _joined_form(WARMUP_OPS.pattern)
_STEP_ANNOTATION_JOINED = _joined_form(_STEP_ANNOTATION.pattern)


@dataclass
class _ThreadLabels:
    """A thread's host activity as a step function of time: per segment, a cause and who decided it."""

    times: np.ndarray  # segment starts, sorted; segment k is [times[k], times[k+1])
    cause: np.ndarray  # cause code per segment (_NONE: nothing recorded)
    key: np.ndarray  # per segment: name id * 2 + (1 if a runtime call decided, 0 if a frame)


@dataclass
class IdleBreakdown:
    """What `idle_breakdown` returns: per-step idle ms by cause, and who held the host for each cause."""

    per_step: list[dict]
    holders: list[dict]  # the biggest (cause, event) holders of GPU-idle time, largest first
    host_functions: list[dict]  # `host` time by innermost Python function (file, function, user)
    one_off: list[dict]  # one-off holders (context creation, warm-up) with the step they happened in


def idle_breakdown(timeline: Timeline, thresholds: Thresholds) -> IdleBreakdown:
    """Classify every GPU-idle piece of every step by cause (see the module docstring)."""
    trace = timeline.trace
    n_steps = len(timeline.steps)
    gap_s, gap_e, gap_step = _gaps(timeline)
    threads = _threads(timeline)
    main = timeline.main_thread
    facts = _NameFacts(trace)
    # Grouped and classified once for all threads: per thread, a mask over every call would cost
    # O(threads x calls) (150k threads: minutes).
    calls_of = _rows_by_thread(timeline.calls.thread)
    call_cause = _call_causes(timeline, thresholds)
    no_calls = np.zeros(0, dtype=np.int64)
    labels = {
        t: _thread_labels(timeline, t, calls_of.get(t, no_calls), call_cause, thresholds, t != main, facts)
        for t in threads
    }

    # Cut the gaps at every boundary of every thread's step function.
    inside = _inside([lab.times for lab in labels.values()], gap_s, gap_e)
    edges = distinct(np.concatenate((gap_s, gap_e, inside)))
    mids = (edges[:-1] + edges[1:]) / 2 if len(edges) > 1 else np.zeros(0)
    g = np.searchsorted(gap_s, mids, side="right") - 1
    in_gap = (g >= 0) & (mids < gap_e[np.maximum(g, 0)]) if len(gap_s) else np.zeros(len(mids), bool)
    mids, g = mids[in_gap], g[in_gap]
    lengths = (edges[1:] - edges[:-1])[in_gap]

    cause = np.full(len(mids), UNKNOWN, dtype=np.int64)
    key = np.full(len(mids), -1, dtype=np.int64)
    slot = np.full(len(mids), -1, dtype=np.int64)
    if main in labels:
        cause, key = _lookup(labels[main], mids)
        cause = np.where(cause == _NONE, UNKNOWN, cause)
        slot = np.where(key >= 0, threads.index(main), -1)
    # Where the loop's thread is only in `host`/`unknown`, the profiler's code or waiting on other
    # threads, the strongest cause another thread has at that moment decides.
    lendable = (cause == HOST) | (cause == UNKNOWN) | (cause == PROFILER) | (cause == _WAITING)
    piece, lent_cause, lent_key, lent_slot = _lent_by_other_threads(labels, threads, main, mids, lendable)
    cause[piece], key[piece], slot[piece] = lent_cause, lent_key, lent_slot
    cause = np.where(cause == _WAITING, _WAITING_CAUSE, cause)

    # Pieces grouped by (cause, thread, deciding event): the holders of idle time.
    step = gap_step[g] if len(g) else np.zeros(0, dtype=np.int64)
    names_span = 2 * len(trace.names) + 2
    group = (cause * (len(threads) + 1) + (slot + 1)) * names_span + key + 1
    unique, inverse = unique_inverse(group)
    # One-off: warm-up and context creation, when that holder shows in a single step (the same
    # warm-up in several steps, e.g. a search for every new shape, is a steady cost).
    pairs = distinct(inverse * max(n_steps, 1) + step)
    steps_per_group = np.bincount(pairs // max(n_steps, 1), minlength=len(unique))
    decided_by_call = (key >= 0) & (key % 2 == 1)
    context_call = decided_by_call & _context_names(timeline)[np.where(key >= 0, key // 2, 0)]
    one_off = ((cause == WARMUP) | ((cause == BLOCKING) & context_call)) & (steps_per_group[inverse] == 1)

    n_causes = len(CAUSES)
    steady = ~one_off
    by_step = np.bincount(
        step[steady] * n_causes + cause[steady], weights=lengths[steady], minlength=n_steps * n_causes
    ).reshape(n_steps, n_causes)
    one_off_by_step = np.bincount(step[one_off], weights=lengths[one_off], minlength=n_steps)
    gap_count = np.bincount(gap_step, minlength=n_steps)
    per_step = []
    for i in range(n_steps):
        row = {f"idle_{name}_ms": round(float(by_step[i, c]) / 1e3, 4) for c, name in enumerate(CAUSE_NAMES)}
        row["idle_one_off_ms"] = round(float(one_off_by_step[i]) / 1e3, 4)
        row["idle_gap_count"] = int(gap_count[i])
        per_step.append(row)

    holders, one_offs = _holders(timeline, threads, cause, key, slot, pairs, lengths, mids, inverse, one_off)
    host = cause == HOST
    return IdleBreakdown(
        per_step=per_step,
        holders=holders,
        host_functions=_host_functions(
            trace, threads, key[host], slot[host], mids[host], lengths[host], n_steps, facts
        ),
        one_off=one_offs,
    )


def _gaps(timeline: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every GPU-idle interval inside a step: starts, ends, step index (sorted by start).

    `Coverage.gaps` for all steps at once (a call per step costs seconds at 200k steps): step i's
    gaps run from its start and each busy interval's end to each busy interval's start and its end,
    clipped to the step.
    """
    busy = timeline.gpu_busy
    a = np.array([w.start_us for w in timeline.steps], dtype=np.float64)
    b = np.array([w.end_us for w in timeline.steps], dtype=np.float64)
    lo = np.searchsorted(busy.ends, a, side="right")
    hi = np.searchsorted(busy.starts, b, side="left")
    per_step = np.maximum(hi - lo, 0) + 1  # busy intervals inside a step, plus one
    step = np.repeat(np.arange(len(a), dtype=np.int64), per_step)
    j = np.arange(len(step)) - np.repeat(np.cumsum(per_step) - per_step, per_step)  # gap j of its step
    first, last = j == 0, j == per_step[step] - 1
    row = lo[step] + j  # gap j lies between busy intervals row - 1 and row
    n_busy = len(busy.starts)
    gs = np.where(first, a[step], busy.ends[np.maximum(row - 1, 0)] if n_busy else 0.0)
    ge = np.where(last, b[step], busy.starts[np.minimum(row, n_busy - 1)] if n_busy else 0.0)
    gs, ge = np.clip(gs, a[step], b[step]), np.clip(ge, a[step], b[step])
    keep = ge > gs
    gs, ge, step = gs[keep], ge[keep], step[keep]
    order = np.argsort(gs, kind="stable")
    return gs[order], ge[order], step[order]


def _inside(sorted_times: list[np.ndarray], gap_s: np.ndarray, gap_e: np.ndarray) -> np.ndarray:
    """The times that fall inside a gap: before the end of the last gap that starts at or before
    them. Every time is bisected once among the gap starts, all threads together: slicing each
    thread's times gap by gap would cost O(threads x gaps) (16k threads with a gap each: seconds)."""
    if len(gap_s) == 0 or not sorted_times:
        return np.zeros(0)
    stop = np.minimum(gap_e, np.append(gap_s[1:], np.inf))  # a time past the next gap's start is that gap's
    times = np.concatenate(sorted_times)
    last = np.searchsorted(gap_s, times, side="right") - 1
    held = last >= 0
    held[held] = times[held] < stop[last[held]]
    return times[held]


def _threads(timeline: Timeline) -> list[int]:
    """The threads whose activity can explain idle time: the loop's, then those with runtime calls."""
    trace = timeline.trace
    threads = [timeline.main_thread] if timeline.main_thread is not None else []
    active = set(timeline.calls.thread.tolist()) | set(trace.events["cpu_op"].thread.tolist())
    return threads + sorted(t for t in active if t != timeline.main_thread)


def _lent_by_other_threads(
    labels: dict[int, _ThreadLabels],
    threads: list[int],
    main: int | None,
    mids: np.ndarray,
    lendable: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the loop's thread can be lent a cause (`lendable`, per piece at `mids`), what the other
    threads lend: (piece, cause, key, slot). The strongest cause of `_LENT_BY_OTHER_THREADS` wins,
    the earliest thread in `threads` on a tie.

    Only the segments with a lendable cause are matched to the pieces they cover, by bisection over
    all threads at once: looking every piece up in every thread's step function would cost
    O(threads x pieces) (150k threads: hours).
    """
    n_lent = len(_LENT_BY_OTHER_THREADS)
    strength = np.full(len(CAUSE_NAMES) + 2, n_lent, dtype=np.int64)  # _NONE (-1) reads the last entry
    strength[list(_LENT_BY_OTHER_THREADS)] = np.arange(n_lent)
    others = [(s, labels[t]) for s, t in enumerate(threads) if t != main]
    empty = np.zeros(0, dtype=np.int64)
    if not others or not len(mids):
        return empty, empty, empty, empty
    sizes = np.array([len(lab.times) for _, lab in others], dtype=np.int64)
    times = np.concatenate([lab.times for _, lab in others])
    seg_cause = np.concatenate([lab.cause for _, lab in others]).astype(np.int64)
    seg_key = np.concatenate([lab.key for _, lab in others]).astype(np.int64)
    seg_slot = np.repeat(np.array([s for s, _ in others], dtype=np.int64), sizes)
    # Segment k of a thread is [times[k], times[k+1]); its last one never ends. Where each time
    # falls among the pieces, bisected once: a segment ends where the next one starts.
    at = np.append(np.searchsorted(mids, times, side="left"), len(mids))
    at_end = at[1:].copy()
    at_end[np.cumsum(sizes)[sizes > 0] - 1] = len(mids)
    seg = np.flatnonzero(strength[seg_cause] < n_lent)
    lo = at[seg]
    counts = at_end[seg] - lo
    # Every (piece, segment) pair: the pieces lo, lo+1, ... of each segment.
    seg = np.repeat(seg, counts)
    piece = np.repeat(lo, counts) + np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
    take = lendable[piece]
    piece, seg = piece[take], seg[take]
    order = np.lexsort((seg_slot[seg], strength[seg_cause[seg]], piece))
    first = order[np.r_[True, piece[order][1:] != piece[order][:-1]]] if len(order) else order
    seg = seg[first]
    return piece[first], seg_cause[seg], seg_key[seg], seg_slot[seg]


def _rows_by_thread(thread: np.ndarray) -> dict[int, np.ndarray]:
    """Per thread, the rows of a table on it, in table order."""
    order = np.argsort(thread, kind="stable")
    values, first = np.unique(thread[order], return_index=True)
    if not len(order):
        return {}
    return dict(zip(values.tolist(), np.split(order, first[1:]), strict=True))


def _lookup(labels: _ThreadLabels, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (cause, key) of a thread's step function at each time."""
    k = np.searchsorted(labels.times, times, side="right") - 1
    kc = np.maximum(k, 0)
    if len(labels.times) == 0:
        return np.full(len(times), _NONE, dtype=np.int64), np.full(len(times), -1, dtype=np.int64)
    return np.where(k >= 0, labels.cause[kc], _NONE), np.where(k >= 0, labels.key[kc], -1)


class _NameFacts:
    """What the classification needs to know about a frame name, worked out once per name.

    Kept as columns over all names, so a thread's lookup is a few array indexings (with 150k threads
    a per-thread Python pass over its names cost seconds).
    """

    def __init__(self, trace):
        self.names = trace.names
        self._trace = trace
        n = len(self.names)
        self._done = np.zeros(n, dtype=bool)
        self._rule = np.full(n, _NONE, dtype=np.int64)
        self._flags = np.zeros((4, n), dtype=bool)

    @cached_property
    def layout(self) -> CodeLayout:
        """The run's code layout, else this process's: only Python frames need it (working out this
        process's costs ~11M instructions, a trace without stacks skips it)."""
        return getattr(self._trace, "code_layout", None) or current_layout()

    def of(self, name_ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per name id (repeats allowed): rule cause, warm-up op, step annotation, named Python,
        stdlib Python."""
        new = distinct(name_ids[~self._done[name_ids]])
        if new.size:
            names = [self.names[nid] for nid in new.tolist()]
            self._rule[new], self._flags[0, new], self._flags[1, new] = _name_rules(names)
            parsed = [parse_py_frame(name) for name in names]
            self._flags[2, new] = [frame is not None for frame in parsed]
            self._flags[3, new] = [
                frame is not None and library_of(frame.file, self.layout) == "python" for frame in parsed
            ]
            self._done[new] = True
        flags = self._flags[:, name_ids]
        return (self._rule[name_ids], flags[0], flags[1], flags[2], flags[3])


def _name_rules(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame name: its FRAME_RULES cause (the first rule that matches, else _NONE), whether it
    is a warm-up op, and whether it is a step annotation.

    All names at once: each pattern scans the names joined by newlines, one C-level scan instead of
    a `search` call per name and rule (those calls cost 27M of gpt2_pathologies' 1,013M
    instructions). A name holding a newline, or a match that would cross one, is searched alone.
    """
    count = len(names)
    lines = [name if "\n" not in name else "" for name in names]
    alone = [i for i, name in enumerate(names) if "\n" in name]
    text = "\n" + "\n".join(lines)
    line_starts = np.cumsum([1] + [len(line) + 1 for line in lines[:-1]])

    def matches(source: str, joined_form: tuple[re.Pattern, int], anchored: bool) -> np.ndarray:
        joined, at_newline = joined_form
        found = np.zeros(count, dtype=bool)
        for match in joined.finditer(text):
            start = match.start() + at_newline  # a `^` pattern's match starts at the newline before
            line = int(np.searchsorted(line_starts, start, side="right")) - 1
            if "\n" in text[start:match.end()]:
                return np.array([_matches(source, name, anchored) for name in names], dtype=bool)
            if line >= 0 and (not anchored or start == line_starts[line]):  # `match`: at the start
                found[line] = True
        for i in alone:
            found[i] = _matches(source, names[i], anchored)
        return found

    rule = np.full(count, _NONE, dtype=np.int64)
    for code, frame_rule, joined in zip(_FRAME_RULE_CODES, FRAME_RULES, _FRAME_RULES_JOINED, strict=True):
        rule[(rule == _NONE) & matches(frame_rule.pattern, joined, anchored=False)] = code
    return (
        rule,
        matches(WARMUP_OPS.pattern, _WARMUP_OPS_JOINED, anchored=True),
        matches(_STEP_ANNOTATION.pattern, _STEP_ANNOTATION_JOINED, anchored=True),
    )


def _matches(source: str, name: str, anchored: bool) -> bool:
    """One name against a frame pattern, as a `match` (anchored) or a `search`."""
    pattern = re.compile(source)  # rare (a name holding a newline): re's own cache keeps it
    return (pattern.match(name) if anchored else pattern.search(name)) is not None


def _thread_labels(
    timeline: Timeline,
    thread: int,
    on_thread: np.ndarray,
    call_cause: np.ndarray,
    thresholds: Thresholds,
    lend_only: bool,
    facts: _NameFacts,
) -> _ThreadLabels:
    """A thread's cause at every moment: its frames' causes, overlaid with its runtime calls'.

    `on_thread`: the rows of `timeline.calls` on the thread; `call_cause`: `_call_causes` of every call.
    """
    trace = timeline.trace
    frames = trace.frames(thread)
    n = len(frames.parent)
    parent = frames.parents
    name_ids = np.asarray(frames.name_ids, dtype=np.int64)
    is_op = frames.category_codes == FRAME_CATEGORIES.index("cpu_op")
    is_py = frames.category_codes == FRAME_CATEGORIES.index("python_function")
    starts, ends = frames.starts, frames.ends

    calls = timeline.calls
    kinds = timeline.call_kind[on_thread]
    gpu_work = _GPU_WORK_KIND[kinds]
    work_starts = calls.start_us[on_thread[gpu_work]]

    # Per frame, from its name (worked out once per name): its FRAME_RULES cause, whether it is a
    # warm-up op, a step annotation, a named Python frame, a standard-library one.
    own, warm_op, step_frame, named_py, stdlib_py = facts.of(name_ids)
    if lend_only:  # other threads lend only what they do in ops and calls, not their Python
        own = np.where((own == INPUT) | (own == _WAITING) | (own == PROFILER), _NONE, own)

    # Warm-up op calls: first of their op on this thread, or an outlier; and long enough.
    candidates = np.flatnonzero(is_op & warm_op)
    if candidates.size:
        durations = ends[candidates] - starts[candidates]
        cand_names = name_ids[candidates]
        for nid in distinct(cand_names).tolist():
            members = candidates[cand_names == nid]
            member_dur = durations[cand_names == nid]
            first = members[np.argmin(starts[members])]
            median = statistics.median(member_dur.tolist())  # not np.median: it imports numpy.ma
            warm = (member_dur >= thresholds.warmup_call_min_ms * 1e3) & (
                (members == first) | (member_dur >= thresholds.warmup_call_ratio * median)
            )
            own[members[warm & (own[members] == _NONE)]] = WARMUP

    # The nearest enclosing rule holds inside its frame (a `profiler` one over its own code only); a
    # launching op chain is `launch` for its innermost time unless a rule sits inside the chain
    # (innermost first).
    named_code = is_py & named_py & ~stdlib_py  # user or library Python, not the standard library
    region = _through_profiler(parent, own, nearest_marked(parent, own != _NONE), named_code)
    chain_top = nearest_marked(parent, is_op & ~np.concatenate(([False], is_op))[np.maximum(parent + 1, 0)])
    # Whether a chain's top op launched GPU work: asked of the tops only (gpt2_pathologies' main
    # thread: 2,316 of 22,984 frames).
    has_work = np.zeros(n, dtype=bool)
    tops = distinct(chain_top[chain_top >= 0])
    if work_starts.size and tops.size:
        has_work[tops] = np.searchsorted(work_starts, ends[tops], side="right") > np.searchsorted(
            work_starts, starts[tops]
        )
    top = np.maximum(chain_top, 0)
    launching = is_op & (chain_top >= 0) & has_work[top] & ~(region >= chain_top)
    cause = np.where(region >= 0, own[np.maximum(region, 0)], _NONE)
    cause = np.where(launching, LAUNCH, cause)
    unresolved = cause == _NONE
    if not lend_only:  # other threads lend only their calls, rules and launching ops
        cause = np.where(unresolved, np.where(step_frame, UNKNOWN, HOST), cause)
    # Who decided: the rule's frame, the innermost op of a launching chain, or (host time) the
    # innermost named Python frame, else the frame itself.
    # Host time is named by the innermost Python function outside the standard library (the code
    # that called inspect/logging/threading), else the innermost Python function.
    named = nearest_marked(parent, named_code)
    named = np.where(named >= 0, named, nearest_marked(parent, is_py & named_py))
    decider = np.where(
        launching, np.arange(n), np.where(region >= 0, region, np.where(named >= 0, named, np.arange(n)))
    )
    frame_key = name_ids[np.maximum(decider, 0)] * 2 if n else np.zeros(0, dtype=np.int64)
    frame_key = np.where(step_frame & unresolved, -1, frame_key)

    # Step function of the frames: at a frame's start it is innermost; at its end its parent is.
    times = np.concatenate((starts, ends))
    seg_frame = np.concatenate((np.arange(n), parent))
    is_end = np.concatenate((np.zeros(n, dtype=bool), np.ones(n, dtype=bool)))
    # Ties: ends before starts; inner ends (higher index) before outer; outer starts before inner.
    tie = np.concatenate((np.arange(n), -np.arange(n)))
    order = np.lexsort((tie, ~is_end, times))
    times, seg_frame = times[order], seg_frame[order]
    seg_cause = np.where(seg_frame >= 0, cause[np.maximum(seg_frame, 0)] if n else _NONE, _NONE)
    seg_key = np.where(seg_frame >= 0, frame_key[np.maximum(seg_frame, 0)] if n else -1, -1)

    # Runtime calls overlay the frames (innermost), except inside warm-up.
    call_cause = call_cause[on_thread]
    if lend_only:
        lendable = _LENDING_KIND[kinds]
        call_cause = np.where(lendable, call_cause, _NONE)
    cs, ce = calls.start_us[on_thread], calls.end_us[on_thread]
    frame_at_call, frame_key_at_call = _lookup(_ThreadLabels(times, seg_cause, seg_key), (cs + ce) / 2)
    absorbed = (frame_at_call == WARMUP) & (kinds != KINDS.index("context"))
    call_cause = np.where(absorbed & (call_cause != _NONE), WARMUP, call_cause)
    call_key = calls.name[on_thread].astype(np.int64) * 2 + 1
    # A call absorbed by warm-up is held by the warm-up frame (the first cuDNN convolution, ...).
    call_key = np.where(absorbed, frame_key_at_call, call_key)
    keep = call_cause != _NONE
    cs, ce, call_cause, call_key = cs[keep], ce[keep], call_cause[keep], call_key[keep]
    return _overlay(_ThreadLabels(times, seg_cause, seg_key), cs, ce, call_cause, call_key)


def _through_profiler(
    parent: np.ndarray, own: np.ndarray, region: np.ndarray, named_code: np.ndarray
) -> np.ndarray:
    """`region` (per frame, the frame whose rule holds there, or -1) with `profiler` frames holding
    only the profiler's own code: a frame of `named_code` (named Python outside the standard
    library: user or library code) inside a profiler frame, and all inside it, take the rule that
    holds outside the profiler's frames, as without them. A wrapper's call to the original keeps
    its cause; the stdlib, builtins and ops the profiler's code calls stay `profiler`."""
    in_profiler = (region >= 0) & (own[np.maximum(region, 0)] == PROFILER)
    through = in_profiler & (own == _NONE) & named_code
    if not through.any():
        return region
    outside = nearest_marked(parent, (own != _NONE) & (own != PROFILER))
    inner = nearest_marked(parent, (own != _NONE) | through)  # the nearest rule frame or way through
    at = np.maximum(inner, 0)
    return np.where(inner >= 0, np.where(through[at], outside[at], inner), -1)


def _call_causes(timeline: Timeline, thresholds: Thresholds) -> np.ndarray:
    """The cause of each runtime call (`CALL_CAUSES`, blocking copies, long launches, capture)."""
    trace = timeline.trace
    calls = timeline.calls
    kinds = timeline.call_kind
    by_kind = np.array([CALL_CAUSES[k] for k in KINDS], dtype=np.int64)
    cause = by_kind[kinds] if len(kinds) else np.zeros(0, dtype=np.int64)
    names = calls.name
    blocking_copy = blocking_copies(trace.names, timeline.name_kind)  # the kinds already known per name
    capture = trace.names_matching(lambda n: _CAPTURE_CALLS.match(n) is not None)
    cause = np.where(blocking_copy[names], BLOCKING, cause)
    long_launch = (kinds == KINDS.index("launch")) & (calls.dur_us >= thresholds.long_launch_us)
    cause = np.where(long_launch | capture[names], WARMUP, cause)
    return cause


def _overlay(
    labels: _ThreadLabels, cs: np.ndarray, ce: np.ndarray, call_cause: np.ndarray, call_key: np.ndarray
) -> _ThreadLabels:
    """The step function with runtime calls laid over it: inside a call, the call decides.

    In O(n) over the frames' times: a call's boundaries are inserted, not sorted in, and the call
    at each time is counted, not searched for (sorting and bisecting every time cost 1.8x the
    instructions, over the 16 threads of six fixtures).
    """
    if len(cs) == 0:
        return labels
    # The frames' step function at its distinct times: at a repeated time the last entry holds.
    last = np.ones(len(labels.times), dtype=bool)
    last[:-1] = labels.times[1:] != labels.times[:-1]
    times, cause, key = labels.times[last], labels.cause[last], labels.key[last]
    # The call boundaries it lacks, with the frames' values there.
    extra = distinct(np.concatenate((cs, ce)))
    at = np.searchsorted(times, extra)
    lacking = (at == len(times)) | (times[np.minimum(at, len(times) - 1)] != extra) if len(times) else at == 0
    extra, at = extra[lacking], at[lacking]
    extra_cause, extra_key = _lookup(labels, extra)
    times, cause = np.insert(times, at, extra), np.insert(cause, at, extra_cause)
    key = np.insert(key, at, extra_key)
    # The call covering each time: the latest started whose end is after it. With overlapping
    # calls (a driver call inside a runtime call) the latest started one decides. The calls are in
    # start order, so the latest started is the count of starts at or before the time, less one.
    k = np.cumsum(np.bincount(np.searchsorted(times, cs), minlength=len(times))) - 1
    kc = np.maximum(k, 0)
    inside = (k >= 0) & (ce[kc] > times)
    return _ThreadLabels(times, np.where(inside, call_cause[kc], cause), np.where(inside, call_key[kc], key))


def _context_names(timeline: Timeline) -> np.ndarray:
    """Per name: is it a runtime call of kind `context` (context creation, a one-off cost)?"""
    return timeline.name_kind == KINDS.index("context")


def _holders(timeline, threads, cause, key, slot, group_steps, lengths, mids, group, one_off):
    """The largest (cause, event) holders of steady idle time, and the one-off ones with their steps."""
    trace = timeline.trace
    n_steps = max(len(timeline.steps), 1)
    if len(group) == 0:
        return [], []
    total = np.bincount(group, weights=lengths)
    first_of_group = _longest_piece(group, lengths, len(total))  # to describe where it happened
    holders, one_offs = [], []
    for gi in np.argsort(-total)[:40].tolist():
        piece = int(first_of_group[gi])
        c, k, s = int(cause[piece]), int(key[piece]), int(slot[piece])
        thread = threads[s] if s >= 0 else None
        entry = {
            "cause": CAUSE_NAMES[c],
            "event": trace.names[k // 2] if k >= 0 else None,
            "source": ("runtime call" if k % 2 else "frame") if k >= 0 else None,
            "op": _enclosing_op(trace, thread, float(mids[piece])) if thread is not None else None,
            "idle_ms": round(float(total[gi]) / 1e3, 4),
            "idle_ms_per_step": round(float(total[gi]) / 1e3 / n_steps, 4),
        }
        if bool(one_off[piece]):
            # group_steps: the sorted distinct values of group * n_steps + step
            lo, hi = np.searchsorted(group_steps, [gi * n_steps, (gi + 1) * n_steps])
            entry["steps"] = sorted(timeline.steps[x % n_steps].number for x in group_steps[lo:hi].tolist())
            one_offs.append(entry)
        elif len(holders) < 12:
            holders.append(entry)
    return holders, one_offs


def _longest_piece(group: np.ndarray, lengths: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group (0 .. n_groups - 1, each with a piece), its longest piece, the first of equally
    long ones: the group's maximum, then its first piece at that maximum. O(n): a lexsort by group
    and length cost 2-5 ms per trace."""
    longest = np.full(n_groups, -np.inf)
    np.maximum.at(longest, group, lengths)
    at_longest = np.flatnonzero(lengths == longest[group])
    first = np.full(n_groups, len(group), dtype=np.int64)
    np.minimum.at(first, group[at_longest], at_longest)
    return first


def _enclosing_op(trace, thread: int, t: float) -> str | None:
    """The outermost cpu_op enclosing time `t` on `thread`, else the innermost annotation."""
    frames = trace.frames(thread)
    chain = frames.chain(frames.innermost(t, t))
    ops = [i for i in chain if frames.categories[i] == "cpu_op"]
    if ops:
        return trace.names[int(frames.name_ids[ops[0]])]
    notes = [
        trace.names[int(frames.name_ids[i])]
        for i in chain
        if frames.categories[i] == "user_annotation"
        and not _STEP_ANNOTATION.match(trace.names[int(frames.name_ids[i])])
    ]
    return notes[-1] if notes else None


def _host_functions(
    trace, threads, keys, slots, mids, lengths, n_steps: int, facts: _NameFacts
) -> list[dict]:
    """`host` idle time by the innermost named Python function (else op or annotation), largest first.

    Each entry: `file`, `function`, `code` (`user`/`library`), `idle_ms_per_step`, `called_from`
    (the innermost frame outside torch and the standard library that led there, when it is not
    the function itself) and `stack` (up to 6 named frames, innermost first, at its longest gap).
    """
    valid = keys >= 0
    if not valid.any():
        return []
    keys, slots, mids, lengths = keys[valid], slots[valid], mids[valid], lengths[valid]
    unique, inverse = unique_inverse(keys // 2)
    totals = np.bincount(inverse, weights=lengths)
    longest = _longest_piece(inverse, lengths, len(totals))
    out = []
    for u in np.argsort(-totals)[:8].tolist():
        name = trace.names[int(unique[u])]
        parsed = parse_py_frame(name)
        piece = int(longest[u])
        stack = (
            _python_stack(trace, threads[int(slots[piece])], float(mids[piece])) if slots[piece] >= 0 else []
        )
        caller = next(
            (f for f in stack if library_of(f.file, facts.layout) not in ("torch", "python") and f != parsed),
            None,
        )
        out.append(
            {
                "file": parsed.file if parsed else None,
                "function": parsed.function if parsed else name,
                "code": _code_kind(parsed, facts) if parsed else None,
                "idle_ms_per_step": round(float(totals[u]) / 1e3 / max(n_steps, 1), 4),
                "called_from": f"{caller.file} {caller.function}" if caller else None,
                "stack": [f"{f.file} {f.function}" for f in stack[:6]],
            }
        )
    return out


def _code_kind(frame: PyFrame, facts: _NameFacts) -> str:
    return "user" if is_user_file(frame.file, facts.layout) else "library"


def _python_stack(trace, thread: int, t: float) -> list:
    """The named Python frames enclosing time `t` on `thread`, innermost first."""
    frames = trace.frames(thread)
    chain = frames.chain(frames.innermost(t, t))
    parsed = [parse_py_frame(trace.names[int(frames.name_ids[i])]) for i in reversed(chain)]
    return [p for p in parsed if p is not None]


def verdict(steps: list[dict], tiny_kernel_pct: float, thresholds: Thresholds) -> dict:
    """What bounds the steps: `gpu-bound`, `communication-bound`, a GPU-idle cause's verdict
    (`launch-bound`, `sync-bound`, `blocking-call-bound`, `warm-up-bound`, `input-bound`, `host-bound`),
    `mixed` when no cause leads by the margin, or `cpu-only` when the steps launched no GPU work.
    One-off costs and profiler overhead are reported beside it, never as it.

    GPU busy % is time-weighted: the union of GPU busy time over the total step time.
    """
    n = max(len(steps), 1)
    total_ms = sum(s["duration_ms"] for s in steps)
    busy_ms = sum(s["gpu_busy_ms"] for s in steps)

    def per_step(key: str) -> float:
        return sum(s.get(key) or 0.0 for s in steps) / n

    base = {
        "step_ms": round(total_ms / n, 4),
        "comm_ms_per_step": round(per_step("comm_ms"), 4),
        "kernels_per_step": round(per_step("kernel_count"), 1),
        "tiny_kernel_pct": round(tiny_kernel_pct, 2),
    }
    if not any(s["kernel_count"] or s["gpu_busy_ms"] for s in steps):
        # No GPU work to be bound by: the step is all host time, and there is no GPU-idle split.
        return {
            "verdict": "cpu-only",
            "gpu_busy_pct": 0.0,
            "cause": None,
            "why": "no GPU work in the steps",
            **base,
        }
    busy_pct = 100.0 * busy_ms / total_ms if total_ms > 0 else 0.0
    by_cause = {c.name: per_step(f"idle_{c.name}_ms") for c in CAUSES}
    one_off = per_step("idle_one_off_ms")
    # The per-cause fields leave one-off costs out; profiler overhead names no verdict.
    steady = {c.name: by_cause[c.name] for c in CAUSES if c.verdict is not None}
    by_verdict: dict[str, float] = defaultdict(float)
    for c in CAUSES:
        if c.verdict is not None:
            by_verdict[c.verdict] += steady[c.name]
    ranked = sorted(by_verdict.items(), key=lambda kv: -kv[1])
    (top, top_ms), (second, second_ms) = ranked[0], ranked[1]
    if busy_pct >= thresholds.gpu_bound_busy_pct:
        comm_bound = per_step("comm_ms") >= thresholds.comm_bound_share * max(per_step("gpu_busy_ms"), 1e-9)
        label = "communication-bound" if comm_bound else "gpu-bound"
        why = f"the GPU is busy {busy_pct:.0f}% of the step" + (
            f", {100 * per_step('comm_ms') / max(per_step('gpu_busy_ms'), 1e-9):.0f}% of it in collectives"
            if comm_bound
            else ""
        )
        cause = None
    elif top_ms <= 0:
        label, cause = "unknown", None
        profiler = by_cause["profiler"]
        left_out = [w for w, ms in (("one-off cost", one_off), ("profiler overhead", profiler)) if ms > 0]
        why = f"GPU idle time is all {' and '.join(left_out)}" if left_out else "no GPU-idle time to explain"
    elif top_ms >= thresholds.dominant_cause_margin * second_ms:
        label = top
        cause = max((c for c in CAUSES if c.verdict == top), key=lambda c: steady[c.name]).name
        why = (
            f"GPU busy {busy_pct:.0f}%; of {sum(steady.values()):.1f} ms/step steady-state GPU idle, "
            f"{top_ms:.1f} ms is {top.replace('-bound', '')} ({_meaning(cause)})"
            + (f", {top_ms / second_ms:.1f}x the next cause ({second})" if second_ms > 0 else "")
        )
    else:
        label, cause = "mixed", None
        why = (
            f"GPU busy {busy_pct:.0f}%; no cause leads by {thresholds.dominant_cause_margin:g}x: "
            f"{top} {top_ms:.1f} ms/step, {second} {second_ms:.1f} ms/step"
        )
    return {
        "verdict": label,
        "cause": cause,
        "why": why,
        "fix": next((c.fix for c in CAUSES if c.name == cause), None),
        "gpu_busy_pct": round(busy_pct, 2),
        "gpu_idle_ms_per_step": round(per_step("gpu_idle_ms"), 4),
        "idle_ms_per_step": {k: round(v, 4) for k, v in by_cause.items()},
        "idle_one_off_ms_per_step": round(one_off, 4),
        "idle_profiler_ms_per_step": round(by_cause["profiler"], 4),
        "idle_launch_ms_per_step": round(by_cause["launch"], 4),
        "idle_sync_ms_per_step": round(by_cause["sync"], 4),
        "idle_host_ms_per_step": round(by_cause["host"] + by_cause["unknown"], 4),
        "ranked": [{"verdict": v, "idle_ms_per_step": round(ms, 4)} for v, ms in ranked if ms > 0],
        **base,
    }


def _meaning(cause: str | None) -> str:
    return next((c.meaning for c in CAUSES if c.name == cause), "")


def idle_findings(
    verdict_info: dict, breakdown: IdleBreakdown, steps: list[dict], rank: int | None, thresholds: Thresholds
) -> list[Finding]:
    """Findings for the GPU-idle causes that matter: each cause costing at least
    `finding_min_idle_share` of the step time (or naming the verdict) gets one with its fix, profiler
    overhead of at least `profiler_overhead_min_share` a `low` one, and each one-off cost of at least
    `one_off_min_ms` a one-off finding. Launch overhead and sync points have their own modules'
    findings."""
    if verdict_info["verdict"] == "cpu-only" or not steps:
        return []
    n = len(steps)
    step_ms = sum(s["duration_ms"] for s in steps)
    findings = []

    def share(ms: float) -> float:
        return ms / max(step_ms, 1e-9)

    host_ms = sum(s["idle_host_ms"] + s["idle_unknown_ms"] for s in steps)
    if share(host_ms) >= thresholds.finding_min_idle_share or verdict_info["verdict"] == "host-bound":
        findings.append(_host_bound_finding(verdict_info, breakdown, steps, rank, thresholds))
    for cause, kind, title in (
        ("input", "input_bound", "waiting for input (DataLoader / data preparation on the training thread)"),
        (
            "blocking",
            "blocking_runtime_call",
            "inside blocking runtime calls (allocation, free, stream creation, synchronous copies)",
        ),
        ("warmup", "recurring_warmup", "in library warm-up that recurs in several steps"),
        ("comm", "communication_wait", "inside host-side collectives, waiting for other ranks"),
        (
            "profiler",
            "profiler_overhead",
            "in the profiler's own code (trainprof's hooks, torch.profiler), which an un-profiled run "
            "does not pay",
        ),
    ):
        info = next(c for c in CAUSES if c.name == cause)
        overhead = info.verdict is None  # the profiler's cost, not the training's: told, never urgent
        min_share = thresholds.profiler_overhead_min_share if overhead else thresholds.finding_min_idle_share
        ms = sum(s[f"idle_{cause}_ms"] for s in steps)
        verdict_here = verdict_info.get("cause") == cause
        if ms <= 0 or (share(ms) < min_share and not verdict_here):
            continue
        held = [h for h in breakdown.holders if h["cause"] == cause]
        top = held[0] if held else {"event": None, "op": None}
        if overhead:
            severity = "low"
        else:
            severity = "high" if share(ms) >= thresholds.high_severity_idle_share else "medium"
        findings.append(
            Finding(
                kind=kind,
                title=f"GPU idle {ms / n:.1f} ms/step ({100 * share(ms):.0f}% of the step) {title}"
                + (f": mostly {top['event']}" if top["event"] else "")
                + (f" in {top['op']}" if top.get("op") and top["op"] != top["event"] else ""),
                severity=severity,
                op=top.get("op") or top["event"],
                where={"file": None, "line": None, "function": None},
                count=n,
                per_step=1.0,
                cost_ms=round(ms, 4),
                fix=info.fix,
                rank=rank,
                cause=info.meaning,
                details={
                    "idle_ms_per_step": round(ms / n, 4),
                    "idle_pct": round(100 * share(ms), 2),
                    "holders": held[:6],
                    "verdict": verdict_info,
                },
            )
        )
    findings.extend(_one_off_findings(breakdown, rank, thresholds))
    return findings


def _host_bound_finding(
    verdict_info: dict, breakdown: IdleBreakdown, steps: list[dict], rank: int | None, thresholds: Thresholds
) -> Finding:
    """GPU idle while the host runs other code: the functions that held it, ms per step."""
    n = len(steps)
    named_ms = sum(s["idle_host_ms"] for s in steps)
    unnamed_ms = sum(s["idle_unknown_ms"] for s in steps)
    host_ms = named_ms + unnamed_ms
    share = host_ms / max(sum(s["duration_ms"] for s in steps), 1e-9)
    functions = breakdown.host_functions
    top = functions[0] if functions and named_ms >= unnamed_ms else None
    user = next((f for f in functions if f["code"] == "user"), None)
    listed = ", ".join(
        f"{f['function']}"
        + (f" ({f['file']})" if f["file"] else "")
        + (f" from {f['called_from']}" if f.get("called_from") and f["code"] != "user" else "")
        + f" {f['idle_ms_per_step']:.2f} ms"
        for f in functions[:3]
    )
    if top is not None:
        what = f"the host runs Python: {listed} per step"
    else:
        what = "the host runs code the trace does not name (profile with with_stack=True to name it)"
    return Finding(
        kind="host_bound",
        title=f"GPU idle {host_ms / n:.1f} ms/step ({100 * share:.0f}% of the step) with no GPU work "
        f"queued while {what}",
        severity="high" if share >= thresholds.high_severity_idle_share else "medium",
        op=None if top is not None and top["file"] else (top["function"] if top else None),
        where={
            "file": (user or {}).get("file"),
            "line": None,
            "function": (user or {}).get("function"),
        },
        count=n,
        per_step=1.0,
        cost_ms=round(host_ms, 4),
        fix=next(c.fix for c in CAUSES if c.name == ("host" if top is not None else "unknown")),
        rank=rank,
        cause=next(c.meaning for c in CAUSES if c.name == ("host" if top is not None else "unknown")),
        details={
            "idle_host_ms_per_step": round(host_ms / n, 4),
            "idle_named_ms_per_step": round(named_ms / n, 4),
            "idle_unnamed_ms_per_step": round(unnamed_ms / n, 4),
            "idle_host_pct": round(100 * share, 2),
            "functions": functions,
            "verdict": verdict_info,
        },
    )


_ONE_OFF_WORDS = {
    "context": "CUDA context creation (the device's first use)",
    "warmup": "library warm-up",
}


def _one_off_findings(breakdown: IdleBreakdown, rank: int | None, thresholds: Thresholds) -> list[Finding]:
    """One finding per one-off cost (context creation, warm-up) of at least `one_off_min_ms`."""
    merged: dict[tuple, dict] = {}
    for h in breakdown.one_off:
        what = "warmup" if h["cause"] == "warmup" else "context"
        key = (what, h["event"] if what == "context" else h["op"] or h["event"])
        entry = merged.setdefault(key, {**h, "idle_ms": 0.0, "steps": set()})
        entry["idle_ms"] += h["idle_ms"]
        entry["steps"].update(h.get("steps", []))
    findings = []
    for (what, _), h in sorted(merged.items(), key=lambda kv: -kv[1]["idle_ms"]):
        if h["idle_ms"] < thresholds.one_off_min_ms:
            continue
        steps = sorted(h["steps"])
        where = f"{h['event']}" + (f" under {h['op']}" if h["op"] and h["op"] != h["event"] else "")
        seconds = h["idle_ms"] / 1e3
        amount = f"{seconds:.1f} s" if seconds >= 1 else f"{h['idle_ms']:.1f} ms"
        findings.append(
            Finding(
                kind="one_off",
                title=f"Step {steps[0] if steps else '?'} pays {amount} of one-off {_ONE_OFF_WORDS[what]} "
                f"({where}); not a steady-state cost",
                severity="low",
                op=h["op"] or h["event"],
                where={"file": None, "line": None, "function": None},
                count=1,
                per_step=0.0,
                cost_ms=round(h["idle_ms"], 4),
                fix="Start profiling later, after the first steps: torch.profiler.schedule(wait=..., "
                "warmup=...) or skip_first=..., so the profiled steps show the steady state.",
                rank=rank,
                cause=_ONE_OFF_WORDS[what],
                details={
                    "steps": steps,
                    "event": h["event"],
                    "op": h["op"],
                    "idle_ms": round(h["idle_ms"], 4),
                },
            )
        )
    return findings[:4]
