"""The profiling schedule and options of a session, checked once.

Importing this module imports no torch: `trainprof` is imported by the CLI, which never needs it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, fields


@dataclass
class SessionConfig:
    """What a `trainprof.session` records, when, and what it writes.

    A step is one `optimizer.step()` (or one `Session.step()` call). The schedule is torch's:
    after `skip_first` steps, each cycle waits `wait` steps, warms up `warmup` steps (profiling on,
    results dropped) and records `active` steps; `repeat` cycles (0 = until the loop ends).
    """

    log_dir: str | os.PathLike[str] = "log"
    """Folder for all runs; `tensorboard --logdir <log_dir>` shows them."""

    run_name: str | None = None
    """Subfolder of `log_dir` for this run: a plain folder name (no separator, not `.` or `..`).

    Default: under torchrun (or another launcher) the name all ranks of the launch share
    (`trainprof.run_name.shared_run_name`); else `run-YYYYmmdd-HHMMSS` (local time at start), with `-2`,
    `-3`... appended when that folder exists already, so two sessions never share a default folder."""

    wait: int = 1
    """Steps per cycle with the profiler off, before warmup (the first steps are often atypical)."""

    warmup: int = 1
    """Steps per cycle with the profiler on but results dropped (its own start-up cost)."""

    active: int = 3
    """Steps per cycle that are recorded into a trace; at least 1."""

    repeat: int = 1
    """Number of wait/warmup/active cycles; 0 keeps cycling until the loop ends (one trace each)."""

    skip_first: int = 0
    """Steps ignored once at the very start, before the first cycle."""

    record_shapes: bool = True
    """Record operator input shapes (needed to name the op behind a finding)."""

    profile_memory: bool = True
    """Record tensor allocations and frees (peak memory)."""

    with_stack: bool = True
    """Record Python call stacks in the trace (`python_function` events)."""

    capture_syncs: bool = True
    """During recorded steps, capture the exact file and line of every synchronizing call."""

    measure_peaks: bool = True
    """At exit, measure the GPU's matmul and copy rates once per device and torch version (cached
    on disk; ~0.3 s of GPU time the first time) and write them beside the traces: the analysis reads
    achieved throughput and MFU against them (else against its table of known devices)."""

    analyze: bool = True
    """Analyse each trace as it is written, and write summary.json and report.md at exit."""

    console: bool = True
    """Print a short summary of the findings at exit."""

    tensorboard_scalars: bool = True
    """Write per-step scalars (step time, GPU busy, syncs, kernels, MFU, GPU idle by cause) and the findings
    and report as text for TensorBoard, if installed."""

    memory_history: bool = False
    """Record the caching allocator's history (every allocation and free, with its Python stack)
    during the first recorded window, and write it beside the traces as
    `<worker>.memory_history.pickle`, which PyTorch's memory viewer (https://pytorch.org/memory_viz)
    opens; report.html draws it over the window's steps. CUDA only; costs a few µs per allocation
    while it records."""

    memory_history_entries: int = 100_000
    """The most allocator history entries kept (the latest): a Llama-8B step makes ~20,000."""

    gather_timeout_s: float = 120.0
    """Under a process group of several ranks: how long rank 0 waits at exit for the other ranks'
    summaries to write the cross-rank report (`trainprof.gather`; the other ranks never wait); 0
    turns the cross-rank report off."""

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active", "repeat", "skip_first", "memory_history_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"SessionConfig.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"SessionConfig.{name} must be >= 0, got {value}")
        timeout = self.gather_timeout_s
        is_number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if not is_number or not 0 <= timeout < float("inf"):
            raise ValueError(f"SessionConfig.gather_timeout_s must be a number >= 0, got {timeout!r}")
        if self.active < 1:
            raise ValueError(f"SessionConfig.active must be >= 1, got {self.active}")
        if self.memory_history_entries < 1:
            entries = self.memory_history_entries
            raise ValueError(f"SessionConfig.memory_history_entries must be >= 1, got {entries}")
        if self.run_name is not None and not _is_plain_name(self.run_name):
            raise ValueError(f"SessionConfig.run_name must be a plain folder name, got {self.run_name!r}")

    @property
    def cycle_steps(self) -> int:
        """Steps in one wait/warmup/active cycle."""
        return self.wait + self.warmup + self.active

    def recorded_steps(self) -> list[int] | None:
        """The profiler step numbers that end up in traces; None when `repeat == 0` (unbounded)."""
        if self.repeat == 0:
            return None
        first = self.skip_first + self.wait + self.warmup
        return [
            first + cycle * self.cycle_steps + i for cycle in range(self.repeat) for i in range(self.active)
        ]

    def action_at(self, step: int) -> str:
        """The schedule's action at profiler step `step` (torch.profiler.schedule's rule).

        `"none"` (profiler off: skipped, waiting, or every cycle done), `"warmup"`, `"record"`, or
        `"save"` (the last recorded step of a window; its trace is written when it ends). The session
        uses this instead of `torch.profiler.schedule`, which warns when `warmup == 0`.
        """
        if step < self.skip_first:
            return "none"
        step -= self.skip_first
        if self.repeat > 0 and step >= self.repeat * self.cycle_steps:
            return "none"
        in_cycle = step % self.cycle_steps
        if in_cycle < self.wait:
            return "none"
        if in_cycle < self.wait + self.warmup:
            return "warmup"
        return "record" if in_cycle < self.cycle_steps - 1 else "save"

    def resolved_run_name(self) -> str:
        """`run_name`, or a timestamped default such as `run-20261121-233000`."""
        return self.run_name or time.strftime("run-%Y%m%d-%H%M%S")

    @classmethod
    def option_names(cls) -> list[str]:
        """All field names (used to split `session(**options)`)."""
        return [f.name for f in fields(cls)]


def _is_plain_name(name: str) -> bool:
    """A name that stays one folder inside `log_dir`: no separator, no `.`/`..`, no control character."""
    separators = {"/", "\\", os.sep, os.altsep or "/"}
    return (
        bool(name)
        and name not in (".", "..")
        and not any(sep in name for sep in separators)
        and all(ch.isprintable() for ch in name)
    )
