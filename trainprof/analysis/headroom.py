"""Question 5c: how far can the step grow before it no longer fits in the GPU's memory?

The memory peak (`memory.MemoryProfile`) splits into what does not grow with the step's tokens and
what does:

    fixed   = persistent + gradients + optimizer_state      (parameters, their gradients, Adam's
                                                             moments: the model's, not the batch's)
    scaling = activations + temporaries                     (held for the backward pass, or made and
                                                             dropped inside one phase: the batch's)
    usable  = device memory x (1 - headroom_reserve_share)  (less the CUDA context, workspaces and
                                                             the allocator's rounding at the limit)

Growing the batch by a factor k makes the step's peak `fixed + k x scaling`, so

    fits_times    = (usable - fixed) / scaling              (how many times the step's tokens fit)
    largest_batch = floor(batch x fits_times)               (at the same sequence length)

Unfused attention's scores (`memory.FAMILIES`: `attention_scores`) grow with the square of the
sequence length, the rest linearly, so a sequence k times longer needs

    fixed + k x (scaling - scores) + k^2 x scores  <=  usable

which `longest_seq_len` solves for k. The batch and sequence length come from the step's token ids
(`tokens.step_tokens`, at the peak's step); without them `fits_times` still holds. The prediction is
checked on the device by running the batch it names (`benchmarks/memory_checks.py`).
"""

from __future__ import annotations

import math

from trainprof.analysis.memory import MemoryProfile
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.tokens import StepTokens

FIXED_CATEGORIES = ("persistent", "gradients", "optimizer_state")
"""The peak's categories that do not grow with the step's tokens (`memory.CATEGORIES`)."""
SCALING_CATEGORIES = ("activations", "temporaries")
"""Those that grow with them."""


class Headroom(Record, frozen=True):
    """How far the step can grow (module docstring): the device's memory and what of it is usable,
    the peak's `fixed_bytes` and `scaling_bytes` (of which `attention_bytes` grow with the square of
    the sequence length), the step's `tokens` (None: no token ids recorded), `bytes_per_token`
    (scaling bytes per token), `fits_times` (how many times the step's tokens fit, batch grown),
    `largest_batch` (at the same sequence length) and `longest_seq_len` (at the same batch)."""

    device_bytes: int
    usable_bytes: int
    fixed_bytes: int
    scaling_bytes: int
    attention_bytes: int
    tokens: StepTokens | None
    bytes_per_token: float | None
    fits_times: float
    largest_batch: int | None
    longest_seq_len: int | None

    def peak_at(self, batch_ratio: float, seq_ratio: float = 1.0) -> float:
        """The peak predicted for a step of `batch_ratio` x the batch and `seq_ratio` x the sequence
        length (module docstring)."""
        linear = self.scaling_bytes - self.attention_bytes
        return self.fixed_bytes + batch_ratio * seq_ratio * (linear + seq_ratio * self.attention_bytes)

    def largest_batch_at(self, seq_len: int) -> int | None:
        """The largest batch that fits at sequence length `seq_len` (None without a batch)."""
        tokens = self.tokens
        if tokens is None or tokens.batch is None or tokens.seq_len is None:
            return None
        per_sequence = self.peak_at(1.0 / tokens.batch, seq_len / tokens.seq_len) - self.fixed_bytes
        if per_sequence <= 0:
            return None
        return max(int((self.usable_bytes - self.fixed_bytes) // per_sequence), 0)


def headroom(
    profile: MemoryProfile | None, device_bytes: int | None, tokens: StepTokens | None, thresholds: Thresholds
) -> Headroom | None:
    """The step's headroom (module docstring); None without the peak's breakdown, the device's
    memory, or any activations or temporaries at the peak."""
    if profile is None or not device_bytes or device_bytes <= 0:
        return None
    fixed = sum(profile.by_category.get(name, 0) for name in FIXED_CATEGORIES)
    scaling = sum(profile.by_category.get(name, 0) for name in SCALING_CATEGORIES)
    if scaling <= 0:
        return None
    attention = min(profile.by_family.get("attention_scores", 0), scaling)
    usable = int(device_bytes * (1.0 - thresholds.headroom_reserve_share))
    room = usable - fixed
    fits = room / scaling
    batch = tokens.batch if tokens is not None else None
    seq_len = tokens.seq_len if tokens is not None else None
    return Headroom(
        device_bytes=int(device_bytes),
        usable_bytes=usable,
        fixed_bytes=int(fixed),
        scaling_bytes=int(scaling),
        attention_bytes=int(attention),
        tokens=tokens,
        bytes_per_token=round(scaling / tokens.tokens, 1) if tokens is not None and tokens.tokens else None,
        fits_times=round(fits, 3),
        largest_batch=max(math.floor(batch * fits), 0) if batch is not None else None,
        longest_seq_len=max(math.floor(seq_len * _longest(scaling - attention, attention, room)), 0)
        if seq_len is not None else None,
    )


def _longest(linear: float, quadratic: float, room: float) -> float:
    """The largest k with `k x linear + k^2 x quadratic <= room` (0 when there is no room)."""
    if room <= 0:
        return 0.0
    if quadratic <= 0:
        return room / linear
    return (-linear + math.sqrt(linear * linear + 4.0 * quadratic * room)) / (2.0 * quadratic)
