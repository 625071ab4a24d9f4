"""Question 5b: GPU memory: each step's peak, what the peak is made of, and what would shrink it.

With `profile_memory=True` every allocation and free of the caching allocator is a `[memory]` instant
with the block's `Bytes` (> 0 allocated, < 0 freed), its `Addr` and the `Total Allocated` after it.
An allocation's free is the next event at its address; a free with no allocation before it in the
window released a block allocated before the window. Each allocation is attributed like a kernel
launch (`attribution.attribute_sites`): its op (for a backward allocation, the forward op it belongs
to), its `nn.Module` and its phase; and the phase of its free decides its category:

    allocated in    freed in                     category
    (before)        any time, or never           persistent (parameters, optimizer state, what earlier
                                                 steps left allocated)
    forward         backward, or not in window   activations (held for the backward pass)
    backward        after backward, or never     gradients
    optimizer       after the optimizer          optimizer_state
    any phase       the same phase               temporaries

A tensor family is what the allocation was made for (`FAMILIES`): the logits and the loss (the head's
output, its fp32 upcast, log-softmax and their gradients), the attention scores of unfused attention.
When one family holds at least `memory_family_min_share` of the peak, the `memory_peak` finding names
its fix and the memory it would save: what that family holds at the peak. Activations alone get it
only under memory pressure (the peak at least `memory_pressure_share` of the device's memory): their
fix, recomputing them, costs compute, where the families' fixes cost none. Everything is vectorised
over the events; `MemoryProfile.series` is the allocated total over time by category, decimated to
`MEMORY_SERIES_POINTS` (each slice's lowest and highest point), which report.html draws, with the
allocator's reserved total (`Total Reserved`) beside it: what the device gives the process, the
allocated tensors plus what the allocator caches (`analysis.fragmentation` judges the difference).
The activations alive at the peak are also summed by the `nn.Module` that made them
(`activations_by_module`): what checkpointing a module would give back.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.attribution import BACKWARD, OPTIMIZER, AttributionIndex, attribute_sites
from trainprof.analysis.frames import parse_py_frame
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import (
    ACTIVATION_MODULES_KEPT,
    LARGEST_ALLOCATIONS_KEPT,
    MEMORY_SERIES_POINTS,
    Thresholds,
)
from trainprof.analysis.timeline import Timeline
from trainprof.trace.memory_file import MemoryHistory
from trainprof.trace.model import FRAME_CATEGORIES
from trainprof.user_code import is_user_file

CATEGORIES = ("persistent", "activations", "gradients", "optimizer_state", "temporaries")
"""Memory categories, in the order of the table in the module docstring."""
PERSISTENT, ACTIVATIONS, GRADIENTS, OPTIMIZER_STATE, TEMPORARIES = range(len(CATEGORIES))


class TensorFamily(msgspec.Struct, frozen=True):
    """What a group of allocations is for, how to recognise them, and how to stop holding them.

    An allocation belongs to the family when its `nn.Module`'s class path matches `modules`, or its
    (forward) op matches `ops`; an empty pattern matches nothing.
    """

    key: str
    words: str
    modules: str
    ops: str
    fix: str
    training_only: bool = False
    """The family and its fix exist only when training (an inference forward has no loss to fuse)."""


FAMILIES: tuple[TensorFamily, ...] = (
    TensorFamily(
        "logits_loss",
        "the logits and the loss (the head's vocabulary-wide output, its fp32 upcast, log-softmax and "
        "their gradients)",
        # The language-model head and the loss a Hugging Face model computes in its top module.
        modules=r"(ForCausalLM|LMHeadModel|ForMaskedLM|ForConditionalGeneration)(/Linear)?$",
        ops=r"^aten::(cross_entropy_loss|_?log_softmax|nll_loss\w*)$",
        fix="Use a fused linear cross-entropy, which computes the loss chunk by chunk and never holds "
        "the logits: fused_layers.swap(model) for the Hugging Face causal LMs it knows (GPT-2, Llama, "
        "Mistral, Qwen2/3, Gemma 1-3), or Liger-Kernel's (apply_liger_kernel_to_<model>("
        "fused_linear_cross_entropy=True) or LigerFusedLinearCrossEntropyLoss).",
        training_only=True,
    ),
    TensorFamily(
        "attention_scores",
        "the attention scores of unfused attention ([batch, heads, T, T] scores, softmax and dropout)",
        # Allocated by the attention module itself, not by its projections (child Linear modules).
        modules=r"Attention\w*$",
        ops="",
        fix="Use fused attention, which never holds the [T, T] scores: attn_implementation=\"sdpa\" "
        "(or \"flash_attention_2\") for a Hugging Face model, torch.nn.functional."
        "scaled_dot_product_attention in your own.",
    ),
)
ACTIVATIONS_FIX = (
    "Recompute activations in the backward pass instead of holding them: "
    "model.gradient_checkpointing_enable() for a Hugging Face model, torch.utils.checkpoint around "
    "each block of your own (about a third more compute for the blocks checkpointed)."
)


class LiveAllocation(Record, frozen=True):
    """One allocation alive at the peak: its size, category, family (None: none of `FAMILIES`), the
    op and `nn.Module` class path that made it (a backward allocation: its forward op's), its phase,
    when it was made (ms from the trace's first step), the innermost Python frame outside torch there
    (`file function`) and the user's innermost frame (None without Python stacks)."""

    bytes: int
    category: str
    family: str | None
    op: str | None
    module: str | None
    phase: str | None
    allocated_at_ms: float
    python: str | None
    user: Where | None


class MemorySeries(Record, frozen=True):
    """The allocated total over time (ms from the trace's first step), and by category: persistent is
    what allocations from before the window hold; the points are every event's, or past
    `MEMORY_SERIES_POINTS` events the lowest and highest total of each of half as many equal slices
    of the events, so the peak and the valleys are among them (`_series_points`). `reserved_bytes`:
    the allocator's reserved total at the same points (None when the trace does not record it; a
    point without it repeats the last known)."""

    t_ms: list[float]
    allocated_bytes: list[int]
    by_category: dict[str, list[int]]
    reserved_bytes: list[int] | None = None


class ModuleBytes(Record, frozen=True):
    """Bytes alive at the peak that one `nn.Module` class path made (None: outside any module)."""

    module: str | None
    bytes: int


class MemoryProfile(Record, frozen=True):
    """A trace's peak of allocated GPU memory and what it is made of (module docstring).

    `peak_bytes` at `peak_at_ms` (ms from the trace's first step) in step `peak_step`;
    `by_category` and `by_family`: bytes at the peak; `largest`: the largest allocations alive then;
    `series`: the allocated total over time; `reserved_peak_bytes`: the largest reserved total inside
    the steps (None when the trace does not record it); `activations_by_module`: the activations
    alive at the peak by the module class path that made them, largest first.
    """

    peak_bytes: int
    peak_step: int | None
    peak_at_ms: float
    by_category: dict[str, int]
    by_family: dict[str, int]
    largest: list[LiveAllocation]
    series: MemorySeries
    reserved_peak_bytes: int | None = None
    activations_by_module: list[ModuleBytes] = []


class HistoryView(Record, frozen=True):
    """The allocator's recorded history over a window (`session(memory_history=True)`), as report.html
    draws it: `t_ms` from the first step mark (the host's clock, on which the history is timed), the
    allocated and reserved totals there, where each step began (`step_marks`: step -> ms), when an allocation
    failed (`oom_at_ms`, None if none did), and the pickle PyTorch's memory viewer opens (`file`)."""

    file: str
    t_ms: list[float]
    allocated_bytes: list[int]
    reserved_bytes: list[int]
    step_marks: dict[int, float]
    oom_at_ms: float | None
    entries: int


def history_view(history: MemoryHistory | None) -> HistoryView | None:
    """The history's totals over time from the first step mark (`HistoryView`); None without them."""
    series = history.series if history is not None else None
    if series is None or not series.time_us:
        return None
    origin = history.step_marks[0].time_us if history.step_marks else series.time_us[0]
    n = min(len(series.time_us), len(series.allocated_bytes), len(series.reserved_bytes))
    return HistoryView(
        file=history.file,
        t_ms=[round((t - origin) / 1e3, 3) for t in series.time_us[:n]],
        allocated_bytes=series.allocated_bytes[:n],
        reserved_bytes=series.reserved_bytes[:n],
        step_marks={mark.step: round((mark.time_us - origin) / 1e3, 3) for mark in history.step_marks},
        oom_at_ms=round((series.oom_time_us - origin) / 1e3, 3) if series.oom_time_us is not None else None,
        entries=series.entries,
    )


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


def memory_profile(timeline: Timeline, index: AttributionIndex | None = None) -> MemoryProfile | None:
    """The peak's breakdown (module docstring); None without memory events that carry `Bytes` and
    `Addr` inside the steps. `index`: the trace's, when the caller has it."""
    memory = timeline.trace.memory
    if not len(memory) or memory.block_bytes is None or memory.addr is None:
        return None
    usable = np.isfinite(memory.block_bytes) & np.isfinite(memory.addr) & (memory.block_bytes != 0)
    events = memory.select(usable)
    in_step = timeline.step_of(events.start_us)
    if not len(events) or not (in_step >= 0).any():
        return None
    size = events.block_bytes
    allocated = size > 0
    free_of, alloc_of = pair_by_address(events.addr, allocated)

    trace = timeline.trace
    index = index or AttributionIndex(trace)
    owners = attribute_sites(index, events.thread.astype(np.int64), events.start_us, events.start_us)
    phase = owners.phase.astype(np.int64)
    free_phase = np.where(free_of >= 0, phase[np.maximum(free_of, 0)], -1)
    category = _categories(phase, free_phase, allocated)
    family = _families(owners)

    # The peak: the largest total inside a step; what is alive then.
    total = events.value
    peak = int(np.flatnonzero(in_step >= 0)[np.argmax(total[in_step >= 0])])
    order = np.arange(len(events))
    live = allocated & (order <= peak) & ((free_of < 0) | (free_of > peak))
    live_bytes = np.bincount(category[live], weights=size[live], minlength=len(CATEGORIES))
    by_category = dict(zip(CATEGORIES, live_bytes.round().astype(np.int64).tolist(), strict=True))
    by_category["persistent"] = int(total[peak] - live_bytes.sum())  # held since before the window
    family_bytes = np.bincount(family[live] + 1, weights=size[live], minlength=len(FAMILIES) + 1)[1:]
    by_family = {f.key: int(family_bytes[k]) for k, f in enumerate(FAMILIES) if family_bytes[k] > 0}

    origin = timeline.steps[0].start_us
    largest_rows = np.flatnonzero(live)[np.argsort(-size[live], kind="stable")[:LARGEST_ALLOCATIONS_KEPT]]
    sites = _python_frames(trace, owners.site_thread[largest_rows], owners.site_start_us[largest_rows])
    largest = [
        LiveAllocation(
            bytes=int(size[row]),
            category=CATEGORIES[category[row]],
            family=FAMILIES[family[row]].key if family[row] >= 0 else None,
            op=owners.op_of(row),
            module=ref.class_path if (ref := owners.module_of(row)) is not None else None,
            phase=owners.phase_of(row),
            allocated_at_ms=round(float(events.start_us[row] - origin) / 1e3, 4),
            python=frame,
            user=user,
        )
        for row, (frame, user) in zip(largest_rows.tolist(), sites, strict=True)
    ]
    reserved = events.reserved
    known_reserved = reserved[in_step >= 0] if reserved is not None else np.empty(0)
    known_reserved = known_reserved[np.isfinite(known_reserved)]
    return MemoryProfile(
        peak_bytes=int(total[peak]),
        peak_step=timeline.steps[int(in_step[peak])].number,
        peak_at_ms=round(float(events.start_us[peak] - origin) / 1e3, 4),
        by_category=by_category,
        by_family=by_family,
        largest=largest,
        series=_series(events, category, alloc_of, origin),
        reserved_peak_bytes=int(known_reserved.max()) if len(known_reserved) else None,
        activations_by_module=_by_module(owners, live & (category == ACTIVATIONS), size),
    )


def _by_module(owners, alive: np.ndarray, size: np.ndarray) -> list[ModuleBytes]:
    """The bytes of the `alive` allocations per module class path, largest first
    (`ACTIVATION_MODULES_KEPT` of them)."""
    rows = np.flatnonzero(alive)
    if not len(rows):
        return []
    held: dict[str | None, float] = {}
    for row, block in zip(rows.tolist(), size[rows].tolist(), strict=True):
        ref = owners.module_of(row)
        key = ref.class_path if ref is not None else None
        held[key] = held.get(key, 0.0) + block
    ranked = sorted(held.items(), key=lambda kv: (-kv[1], kv[0] or ""))[:ACTIVATION_MODULES_KEPT]
    return [ModuleBytes(module=module, bytes=int(round(held_bytes))) for module, held_bytes in ranked]


def pair_by_address(addr: np.ndarray, allocated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event (in time order): the index of the free of each allocation (-1: not freed in the
    window), and of the allocation of each free (-1: allocated before the window). Events of one
    address alternate allocation, free, allocation, ...: sorted by (address, time), an allocation's
    free is the next event."""
    n = len(addr)
    order = np.lexsort((np.arange(n), addr))
    same = addr[order][1:] == addr[order][:-1]
    pair = same & allocated[order][:-1] & ~allocated[order][1:]
    free_of = np.full(n, -1, dtype=np.int64)
    alloc_of = np.full(n, -1, dtype=np.int64)
    free_of[order[:-1][pair]] = order[1:][pair]
    alloc_of[order[1:][pair]] = order[:-1][pair]
    return free_of, alloc_of


def _categories(phase: np.ndarray, free_phase: np.ndarray, allocated: np.ndarray) -> np.ndarray:
    """Per event, the category of its block (allocations; a free gets its allocation's below)."""
    forward = (phase != BACKWARD) & (phase != OPTIMIZER)  # the forward pass, or the loop's own code
    category = np.full(len(phase), TEMPORARIES, dtype=np.int64)
    category[forward & ((free_phase == BACKWARD) | (free_phase < 0))] = ACTIVATIONS
    category[(phase == BACKWARD) & (free_phase != BACKWARD)] = GRADIENTS
    category[(phase == OPTIMIZER) & (free_phase != OPTIMIZER)] = OPTIMIZER_STATE
    category[~allocated] = PERSISTENT
    return category


def _families(owners) -> np.ndarray:
    """Per site, the index into `FAMILIES` of its family, -1 for none (first match wins)."""
    family = np.full(len(owners.phase), -1, dtype=np.int64)
    module_paths = [ref.class_path for ref in owners.modules]
    for k, spec in reversed(list(enumerate(FAMILIES))):  # reversed: the first match is written last
        by_module = np.array([bool(spec.modules and re.search(spec.modules, path)) for path in module_paths])
        by_op = np.array([bool(spec.ops and re.search(spec.ops, op)) for op in owners.ops])
        hit = np.zeros(len(family), dtype=bool)
        if by_module.any():
            hit |= (owners.module >= 0) & by_module[np.maximum(owners.module, 0)]
        if by_op.any():
            hit |= (owners.op >= 0) & by_op[np.maximum(owners.op, 0)]
        family[hit] = k
    return family


def _python_frames(trace, thread: np.ndarray, at_us: np.ndarray) -> list[tuple[str | None, Where | None]]:
    """Per site (a few: the largest allocations), the innermost Python frame outside torch there
    (`file function`) and the innermost user frame, each None when there is none."""
    out: list[tuple[str | None, Where | None]] = []
    python_code = FRAME_CATEGORIES.index("python_function")
    for t, at in zip(thread.tolist(), at_us.tolist(), strict=True):
        outside_torch, user = None, None
        frames = trace.frames(int(t)) if t >= 0 else None
        for i in reversed(frames.chain(frames.innermost(at, at))) if frames is not None else ():
            frame = parse_py_frame(trace.names[int(frames.name_ids[i])])
            if frames.category_codes[i] != python_code or frame is None:
                continue
            if outside_torch is None and not frame.file.startswith("torch/"):
                outside_torch = f"{frame.file} {frame.function}"
            if is_user_file(frame.file, trace.code_layout):
                user = Where(file=frame.file, line=frame.line, function=frame.function)
                break
        out.append((outside_torch, user))
    return out


def _series(events, category: np.ndarray, alloc_of: np.ndarray, origin_us: float) -> MemorySeries:
    """The allocated total and the per-category totals after each event, decimated (`MemorySeries`)."""
    size = events.block_bytes
    # A free counts against its allocation's category; a block from before the window is persistent,
    # which is the total less the window's categories.
    freed = np.where(alloc_of >= 0, category[np.maximum(alloc_of, 0)], PERSISTENT)
    owner = np.where(size > 0, category, freed)
    deltas = np.zeros((len(size), len(CATEGORIES)))
    deltas[np.arange(len(size)), owner] = size
    running = np.cumsum(deltas, axis=0)
    total = events.value
    running[:, PERSISTENT] = total - running[:, PERSISTENT + 1:].sum(axis=1)
    picks = _series_points(total)
    return MemorySeries(
        t_ms=np.round((events.start_us[picks] - origin_us) / 1e3, 4).tolist(),
        allocated_bytes=total[picks].astype(np.int64).tolist(),
        by_category={
            name: np.maximum(running[picks, k], 0).round().astype(np.int64).tolist()
            for k, name in enumerate(CATEGORIES)
        },
        reserved_bytes=_carried(events.reserved)[picks].astype(np.int64).tolist()
        if events.reserved is not None and np.isfinite(events.reserved).any() else None,
    )


def _carried(values: np.ndarray) -> np.ndarray:
    """`values` with each NaN replaced by the last number before it (the first number before any)."""
    known = np.isfinite(values)
    last = np.maximum.accumulate(np.where(known, np.arange(len(values)), -1))
    first = int(np.argmax(known))
    return values[np.where(last >= 0, last, first)]


def _series_points(total: np.ndarray) -> np.ndarray:
    """The events a plot keeps, in time order: all of them up to `MEMORY_SERIES_POINTS`, else of
    each of half as many equal slices of the events its lowest and its highest total (the first of
    each), so the plot keeps the peak and the valleys between steps at its resolution."""
    n = len(total)
    if n <= MEMORY_SERIES_POINTS:
        return np.arange(n)
    starts = np.linspace(0, n, MEMORY_SERIES_POINTS // 2 + 1).astype(np.int64)[:-1]  # distinct: n > slices
    slice_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    picks = []
    for extreme in (np.minimum, np.maximum):
        at = np.flatnonzero(total == extreme.reduceat(total, starts)[slice_of])
        slices = slice_of[at]  # ascending, as `at` is
        first = np.ones(len(at), dtype=bool)
        np.not_equal(slices[1:], slices[:-1], out=first[1:])
        picks.append(at[first])  # the first of each slice
    return distinct(np.concatenate(picks))


def memory_finding(
    profile: MemoryProfile | None,
    basis: StepBasis,
    rank: int | None,
    thresholds: Thresholds,
    device_bytes: int | None = None,
    inference: bool = False,
) -> Finding | None:
    """The `memory_peak` finding when one tensor family holds at least `memory_family_min_share` of
    the peak (a training-only family not in an `inference` trace), or the activations do while the
    peak is at least `memory_pressure_share` of `device_bytes`: its fix and the memory it would save,
    when that is at least `memory_min_saving_device_share` of the device's memory (if known)."""
    if profile is None or profile.peak_bytes <= 0:
        return None
    floor = thresholds.memory_family_min_share * profile.peak_bytes
    specs = {f.key: f for f in FAMILIES if not (inference and f.training_only)}
    held = sorted(((k, v) for k, v in profile.by_family.items() if k in specs), key=lambda kv: -kv[1])
    tight = device_bytes is not None and profile.peak_bytes >= thresholds.memory_pressure_share * device_bytes
    if held and held[0][1] >= floor:
        key, saved = held[0]
        words, fix = specs[key].words, specs[key].fix
    elif tight and profile.by_category.get("activations", 0) >= floor:
        key, saved = "activations", profile.by_category["activations"]
        words, fix = "activations held for the backward pass", ACTIVATIONS_FIX
    else:
        return None
    if device_bytes is not None and saved < thresholds.memory_min_saving_device_share * device_bytes:
        return None  # a few percent of the device buys no larger batch
    members = [a for a in profile.largest if a.family == key or (key == "activations" and a.category == key)]
    top = members[0] if members else None
    gib = 1024**3
    return Finding(
        kind="memory_peak",
        title=f"Peak memory {profile.peak_bytes / gib:.2f} GiB (step {profile.peak_step}): "
        f"{saved / gib:.2f} GiB ({100 * saved / profile.peak_bytes:.0f}%) is {words}"
        + (f", the largest {top.bytes / gib:.2f} GiB from {top.op}" if top and top.op else "")
        + (f" in {top.module}" if top and top.module else "")
        + f"; the fix would save about {saved / gib:.2f} GiB",
        # Memory buys a larger batch or model, not GPU time in this step: no time at stake.
        severity=severity_for(0.0, basis.judged_ms, thresholds),
        op=top.op if top else None,
        where=top.user if top and top.user else Where(),
        count=1,
        per_step=1.0,
        cost_ms=0.0,
        fix=fix,
        rank=rank,
        cause=words,
        gpu_ms_per_step=0.0,
        details=MemoryFindingDetails(
            family=key,
            memory_saved_bytes=int(saved),
            peak_bytes=profile.peak_bytes,
            by_category=profile.by_category,
            largest=members,
        ),
    )


class MemoryFindingDetails(Record, frozen=True):
    """The memory finding's evidence: the family (or `activations`), the bytes its fix would save
    (what it holds at the peak), the peak and its categories, and the family's largest allocations
    alive at the peak (the whole profile is the trace's `memory`)."""

    family: str
    memory_saved_bytes: int
    peak_bytes: int
    by_category: dict[str, int]
    largest: list[LiveAllocation]


