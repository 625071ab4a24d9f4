"""Question 5e: the loop ran out of GPU memory: what filled the device, how the failing step differed
from the profiled ones, and what would make it fit.

PyTorch's message names the allocation that failed, not the tensors that filled the device. The
session records the error (`<worker>.memory.json`, `trainprof.trace.memory_file.OutOfMemory`): the
message's figures, the traceback's user line, call and module, the failing step's input tensors,
the optimizer's parameters, gradients and state on the device, and the allocator's state at that
moment. Joined to the window recorded before it (its peak's breakdown, `headroom`, `tokens`), the
`out_of_memory` finding says:

- what held the memory at the error (`held`): parameters, gradients and optimizer state (measured on
  the optimizer's tensors), activations and temporaries (the rest of what PyTorch had allocated; of
  which each tensor family by its share at the profiled peak), reserved but unallocated (the
  allocator's cache), outside PyTorch (the CUDA context, workspaces) and other processes;
- how the failing step differed: its token ids against the profiled step's, and the peak the
  profiled step's breakdown predicts for it (`headroom.Headroom.peak_at`) against the usable memory;
- the fixes, each with the memory it would save at the failing step (`FIXES`, largest saving first).

Scaled to the failing step: by its tokens over the profiled step's where both are known (batch
times sequence length; the attention scores by batch times the square of the sequence length), else
by its activations and temporaries at the error over the profiled peak's. The finding is always
`high` and first (`severity.FIRST_KINDS`): the run ended.
"""

from __future__ import annotations

import math
import os

from trainprof.analysis.fragmentation import FIX as EXPANDABLE_FIX
from trainprof.analysis.fragmentation import Fragmentation
from trainprof.analysis.headroom import Headroom
from trainprof.analysis.memory import ACTIVATIONS_FIX, FAMILIES, MemoryProfile, ModuleBytes
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.thresholds import OPTIMIZER_SHARDS_QUOTED
from trainprof.analysis.tokens import StepTokens
from trainprof.trace.memory_file import AllocatorStats, CodeLine, OutOfMemory, SegmentSummary, TensorInput

GIB = 1024**3
TOKEN_IDS = ("input_ids", "idx", "tokens", "ids")
"""Names of the failing step's token-id argument, first match wins (else its first 2-D integer tensor)."""
_INTEGER_DTYPES = ("int64", "int32", "long", "int")

FIXES: dict[str, str] = {
    "smaller_micro_batch": (
        "Lower the micro-batch and accumulate gradients over more micro-batches for the same "
        "effective batch (gradient_accumulation_steps for a Hugging Face Trainer; call "
        "loss.backward() per micro-batch and optimizer.step() every N)."
    ),
    "fused_linear_cross_entropy": next(f.fix for f in FAMILIES if f.key == "logits_loss"),
    "fused_attention": next(f.fix for f in FAMILIES if f.key == "attention_scores"),
    "activation_checkpointing": ACTIVATIONS_FIX,
    "shard_optimizer_state": (
        "Shard the optimizer state across the data-parallel ranks: FSDP2 (fully_shard), "
        "torch.distributed.optim.ZeroRedundancyOptimizer, or DeepSpeed ZeRO stage 1-2; or keep it in "
        "8 bits (bitsandbytes' AdamW8bit)."
    ),
    "expandable_segments": EXPANDABLE_FIX,
}
"""The fixes an out-of-memory finding weighs, each in words (`MemoryFix.fix` is the key)."""


class HeldAtError(Record, frozen=True):
    """One holder of the device's memory at the error: `category` (`parameters`, `gradients`,
    `optimizer_state`, `activations_and_temporaries`, a tensor family's key within them,
    `reserved_unallocated`, `outside_pytorch`, `other_processes`), its `bytes`, and `how` it is known
    (`measured`, or `estimated` from the profiled peak's shares)."""

    category: str
    bytes: int
    how: str


class MemoryFix(Record, frozen=True):
    """One fix (`FIXES` key and words) and the memory it would save at the failing step
    (`saves_bytes`), with what that figure rests on (`basis`)."""

    fix: str
    words: str
    saves_bytes: int
    basis: str


class OutOfMemoryDetails(Record, frozen=True):
    """The out-of-memory finding's evidence (module docstring): the failing step and whether it was
    recorded, the exception and message, the failing allocation and the device's figures, where it
    was raised (`call`: the innermost frame; `module`: the `nn.Module` path), what held the memory
    (`held`, largest first), the failing step's inputs and tokens against the profiled step's
    (`tokens_ratio`: failing over profiled), the peak predicted for it and the usable memory, the
    largest batch that fits at its sequence length, the profiled peak's activations by module, the
    fixes (largest saving first), the allocator's statistics and segments at the error, and whether
    the allocator's callback read them at the failing allocation itself (`observed`)."""

    failing_step: int
    recording: bool
    exception: str
    message: str
    requested_bytes: int | None
    device_total_bytes: int | None
    device_free_bytes: int | None
    call: Where | None
    module: str | None
    held: list[HeldAtError]
    failing_inputs: list[TensorInput]
    failing_tokens: int | None
    profiled_tokens: StepTokens | None
    tokens_ratio: float | None
    predicted_peak_bytes: int | None
    usable_bytes: int | None
    largest_batch: int | None
    activations_by_module: list[ModuleBytes]
    fixes: list[MemoryFix]
    allocator: AllocatorStats | None
    segments: SegmentSummary | None
    observed: bool


def out_of_memory_finding(
    error: OutOfMemory,
    profile: MemoryProfile | None,
    room: Headroom | None,
    tokens: StepTokens | None,
    facts: Fragmentation | None,
    rank: int | None,
    world_size: int | None = None,
) -> Finding:
    """The `out_of_memory` finding (module docstring)."""
    device_total = error.device_total_bytes or (room.device_bytes if room is not None else None)
    failing = _failing_tokens(error.inputs)
    batch_ratio, seq_ratio = _ratios(failing, tokens)
    held = _held(error, profile, device_total)
    scaling_at_error = next((h.bytes for h in held if h.category == "activations_and_temporaries"), None)
    growth = None
    if batch_ratio is not None:
        growth = batch_ratio * seq_ratio
    elif profile is not None and scaling_at_error is not None:
        scaling = profile.by_category.get("activations", 0) + profile.by_category.get("temporaries", 0)
        growth = scaling_at_error / scaling if scaling > 0 else None
    predicted = None
    if room is not None and batch_ratio is not None:
        predicted = int(room.peak_at(batch_ratio, seq_ratio))
    largest = None
    if room is not None and failing is not None and failing[1] is not None:
        largest = room.largest_batch_at(failing[1])
    fixes = _fixes(error, profile, room, growth, batch_ratio, seq_ratio, failing, largest, facts, world_size)
    call = _where(error.call)
    where = _where(error.where) or Where()
    details = OutOfMemoryDetails(
        failing_step=error.steps_ended,
        recording=error.recording,
        exception=error.exception,
        message=error.message,
        requested_bytes=error.requested_bytes,
        device_total_bytes=device_total,
        device_free_bytes=error.device_free_bytes,
        call=call,
        module=error.module,
        held=held,
        failing_inputs=error.inputs,
        failing_tokens=failing[0] if failing is not None else None,
        profiled_tokens=tokens,
        tokens_ratio=round(growth, 3) if growth is not None and batch_ratio is not None else None,
        predicted_peak_bytes=predicted,
        usable_bytes=room.usable_bytes if room is not None else None,
        largest_batch=largest,
        activations_by_module=profile.activations_by_module if profile is not None else [],
        fixes=fixes,
        allocator=error.state.stats if error.state is not None else None,
        segments=error.state.segments if error.state is not None else None,
        observed=error.observed,
    )
    return Finding(
        kind="out_of_memory",
        title=_title(details, tokens, room),
        severity="high",  # the run ended: first whatever else was found (`severity.FIRST_KINDS`)
        op=_call_name(call),
        where=where,
        count=1,
        per_step=0.0,
        cost_ms=0.0,
        fix=_fix_text(fixes),
        rank=rank,
        cause="held at the error: " + ", ".join(map(_held_words, held)),
        gpu_ms_per_step=None,
        details=details,
    )


def _failing_tokens(inputs: list[TensorInput]) -> tuple[int, int | None, int | None] | None:
    """(tokens, seq_len, batch) of the failing step's token ids (`TOKEN_IDS`), None when not found."""
    integer = [i for i in inputs if any(word in i.dtype for word in _INTEGER_DTYPES) and i.shape]
    ids = next((i for name in TOKEN_IDS for i in integer if i.name == name), None)
    ids = ids or next((i for i in integer if len(i.shape) == 2), None)
    if ids is None:
        return None
    two_d = len(ids.shape) == 2
    return math.prod(ids.shape), ids.shape[1] if two_d else None, ids.shape[0] if two_d else None


def _ratios(failing, tokens: StepTokens | None) -> tuple[float | None, float]:
    """(batch ratio, sequence ratio) of the failing step over the profiled one; (tokens ratio, 1)
    when either is not 2-D; (None, 1) when either is unknown."""
    if failing is None or tokens is None or tokens.tokens <= 0:
        return None, 1.0
    count, seq_len, batch = failing
    if seq_len is not None and batch is not None and tokens.seq_len and tokens.batch:
        return batch / tokens.batch, seq_len / tokens.seq_len
    return count / tokens.tokens, 1.0


def _held(error: OutOfMemory, profile: MemoryProfile | None, device_total: int | None) -> list[HeldAtError]:
    """What held the device's memory at the error (module docstring), largest first."""
    stats = error.state.stats if error.state is not None else None
    allocated = error.allocated_bytes if error.allocated_bytes is not None else (
        stats.allocated_bytes if stats is not None else None)
    cached = error.reserved_unallocated_bytes if error.reserved_unallocated_bytes is not None else (
        stats.reserved_bytes - stats.allocated_bytes if stats is not None else None)
    rows: list[HeldAtError] = []
    training = 0
    if error.held is not None:
        held = error.held
        by_optimizer = (("parameters", held.parameters_bytes), ("gradients", held.gradients_bytes),
                        ("optimizer_state", held.optimizer_state_bytes))
        for name, value in by_optimizer:
            rows.append(HeldAtError(name, value, "measured"))
            training += value
    if allocated is not None and (error.held is not None or not rows):
        scaling = max(allocated - training, 0)
        name = "activations_and_temporaries" if error.held is not None else "allocated_by_pytorch"
        rows.append(HeldAtError(name, scaling, "measured"))
        if profile is not None and error.held is not None:
            profiled = profile.by_category.get("activations", 0) + profile.by_category.get("temporaries", 0)
            for family, family_bytes in sorted(profile.by_family.items(), key=lambda kv: -kv[1]):
                if profiled > 0 and family_bytes > 0:
                    share = min(family_bytes / profiled, 1.0)
                    rows.append(HeldAtError(family, int(share * scaling), "estimated"))
    if cached is not None:
        rows.append(HeldAtError("reserved_unallocated", max(cached, 0), "measured"))
    if error.process_bytes is not None and allocated is not None and cached is not None:
        outside = max(error.process_bytes - allocated - cached, 0)
        rows.append(HeldAtError("outside_pytorch", outside, "measured"))
    if error.process_bytes is not None and device_total is not None and error.device_free_bytes is not None:
        others = device_total - error.device_free_bytes - error.process_bytes
        if others > 0:
            rows.append(HeldAtError("other_processes", others, "measured"))
    return sorted(rows, key=lambda h: -h.bytes)


def _fixes(
    error: OutOfMemory,
    profile: MemoryProfile | None,
    room: Headroom | None,
    growth: float | None,
    batch_ratio: float | None,
    seq_ratio: float,
    failing,
    largest: int | None,
    facts: Fragmentation | None,
    world_size: int | None,
) -> list[MemoryFix]:
    """Each fix of `FIXES` that would save memory at the failing step, with how much (module docstring)."""
    fixes: list[MemoryFix] = []
    scaled = "the profiled peak's, scaled to the failing step's tokens" if batch_ratio is not None else (
        "the profiled peak's share of the activations and temporaries at the error")

    def add(key: str, saves: float, basis: str, words: str | None = None) -> None:
        if saves > 0:
            fixes.append(MemoryFix(fix=key, words=words or FIXES[key], saves_bytes=int(saves), basis=basis))

    if room is not None and batch_ratio is not None and failing is not None and failing[2] and largest:
        batch = failing[2]
        fitting = min(largest, batch - 1)
        if fitting >= 1:
            steps = math.ceil(batch / fitting)
            smaller = room.peak_at(batch_ratio * fitting / batch, seq_ratio)
            add("smaller_micro_batch", room.peak_at(batch_ratio, seq_ratio) - smaller,
                "the profiled peak's breakdown at the two batches",
                f"Lower the micro-batch from {batch} to {fitting} (the largest that fits at this sequence "
                f"length) and accumulate gradients over {steps} micro-batches: "
                + FIXES["smaller_micro_batch"])
    if profile is not None and growth is not None:
        add("fused_linear_cross_entropy", profile.by_family.get("logits_loss", 0) * growth, scaled)
        attention = profile.by_family.get("attention_scores", 0)
        quadratic = growth * seq_ratio if batch_ratio is not None else growth  # scores: batch x T^2
        add("fused_attention", attention * quadratic, scaled)
        in_families = sum(profile.by_family.values())
        activations = max(profile.by_category.get("activations", 0) - in_families, 0)
        top = profile.activations_by_module[0].module if profile.activations_by_module else None
        words = ACTIVATIONS_FIX + (f" The most activations at the profiled peak came from {top}."
                                   if top else "")
        add("activation_checkpointing", activations * growth, "at most the activations held for the backward "
            "pass outside the logits and attention scores, " + scaled, words)
    if error.held is not None and error.held.optimizer_state_bytes > 0:
        ranks = world_size if world_size and world_size > 1 else OPTIMIZER_SHARDS_QUOTED
        add("shard_optimizer_state", error.held.optimizer_state_bytes * (ranks - 1) / ranks,
            f"the optimizer state measured at the error, sharded over {ranks} ranks")
    cached = error.reserved_unallocated_bytes
    fragmented = facts is not None and not facts.expandable_segments and facts.cached_bytes > 0
    enough = error.requested_bytes is not None and cached is not None and cached >= error.requested_bytes
    if cached is not None and (fragmented or enough):
        add("expandable_segments", cached, "the allocator's cache held by no tensor at the error, at most")
    return sorted(fixes, key=lambda f: -f.saves_bytes)


def _title(details: OutOfMemoryDetails, tokens: StepTokens | None, room: Headroom | None) -> str:
    parts = [f"Out of GPU memory in step {details.failing_step}"]
    if details.requested_bytes is not None:
        parts.append(f": a {details.requested_bytes / GIB:.2f} GiB allocation failed")
    if details.module:
        parts.append(f" in {details.module.rsplit('/', 1)[-1]}")
    if details.device_free_bytes is not None and details.device_total_bytes:
        free, total = details.device_free_bytes / GIB, details.device_total_bytes / GIB
        parts.append(f" with {free:.2f} of {total:.2f} GiB free")
    top = next((h for h in details.held if h.how == "measured"), None)
    if top is not None:
        parts.append(f"; {top.category.replace('_', ' ')} held the most ({top.bytes / GIB:.2f} GiB)")
    if details.tokens_ratio is not None and tokens is not None and details.failing_tokens is not None:
        parts.append(f"; the step had {details.failing_tokens:,} tokens, {details.tokens_ratio:g}x the "
                     f"profiled {tokens.tokens:,}")
        if details.predicted_peak_bytes is not None and details.usable_bytes:
            parts.append(f", for a predicted peak of {details.predicted_peak_bytes / GIB:.1f} GiB against "
                         f"{details.usable_bytes / GIB:.1f} GiB usable")
            if details.predicted_peak_bytes <= details.usable_bytes:
                parts.append(" (that fits: what grew is not the batch; see what held the memory)")
    if details.largest_batch is not None:
        largest = details.largest_batch
        parts.append(f"; a batch of {largest} fits at its sequence length" if largest
                     else "; not even one sequence of its length fits")
    elif room is not None and details.tokens_ratio is None:
        parts.append(f"; the profiled step fits {room.fits_times:.1f}x over")
    return "".join(parts)


def _fix_text(fixes: list[MemoryFix]) -> str:
    if not fixes:
        return ("Lower the micro-batch (accumulating gradients for the same effective batch), or record a "
                "window before the failing step (trainprof.session's wait/active) so that the report can "
                "size each fix.")
    return " ".join(f"({n}) saves about {fix.saves_bytes / GIB:.2f} GiB: {fix.words}"
                    for n, fix in enumerate(fixes, 1))


def _held_words(held: HeldAtError) -> str:
    estimated = "" if held.how == "measured" else " (est.)"
    return f"{held.category.replace('_', ' ')} {held.bytes / GIB:.2f} GiB{estimated}"


def _where(line: CodeLine | None) -> Where | None:
    return Where(file=line.file, line=line.line, function=line.function) if line is not None else None


def _call_name(call: Where | None) -> str | None:
    if call is None or not call.function:
        return None
    file = os.path.basename(call.file) if call.file else "?"
    return f"{call.function} ({file}:{call.line})" if call.line is not None else f"{call.function} ({file})"
