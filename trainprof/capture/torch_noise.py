"""Keep torch's own profiler chatter off the user's terminal.

torch writes three things to stderr while a profiler starts and stops, none of which the user can
act on: Kineto's `USDT: ... profiler_start` / `profiler_stop` lines (C++, straight to fd 2, at every
window), c10's `[W... CPUAllocator.cpp:...] Memory block of unknown size was allocated before the
profiling started ...` (at the 1st, 1,001st, 2,001st... free, counted per process, of a block
allocated while memory profiling was off), and the Python warning `Profiler clears events at the
end of each cycle` (at a second window).

The C++ lines bypass Python, so `quiet_torch_stderr()` points fd 2 at a temporary file around the
profiler calls that print them (start, a step that starts or ends a window, stop), then writes back
every line but those. It is used only around those calls, never around the user's own steps: the
user's output is delayed by at most one profiler call, and never dropped. The allocator's warning
comes from c10's counter: `NoiseCanary` frees blocks of its own allocated before each window, one by
one inside the call that starts the window, until c10 prints its line there (filtered); the count
then starts again, and the user's next 999 such frees print nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("trainprof")

NOISE_LINES = (
    re.compile(rb"^USDT:.*profiler_(start|stop)\s*$"),
    re.compile(rb"^\[W\S* \S+ CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before"),
)
"""The stderr lines of torch's profiler that are left out (the module docstring says why)."""

CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"
"""The text of torch.profiler's once-per-process warning at the start of a second cycle."""

STDERR = 2
_REDIRECTING = threading.Lock()
"""Held while fd 2 is redirected: one redirection at a time in the process."""


@contextlib.contextmanager
def quiet_torch_stderr() -> Iterator[None]:
    """Inside the block, fd 2 goes to a temporary file; afterwards every line of it but torch's
    profiler chatter (`NOISE_LINES`) is written to the real stderr. When fd 2 cannot be redirected
    (closed, no temporary file) or another thread redirects it already, the block runs unfiltered:
    two redirections at once could leave fd 2 pointing at a temporary file."""
    if not _REDIRECTING.acquire(blocking=False):
        yield
        return
    try:
        with _redirected_stderr():
            yield
    finally:
        _REDIRECTING.release()


@contextlib.contextmanager
def _redirected_stderr() -> Iterator[None]:
    try:
        capture = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    with capture:
        saved = None
        try:
            sys.stderr.flush()
            saved = os.dup(STDERR)
            os.dup2(capture.fileno(), STDERR)
        except (OSError, ValueError, AttributeError):
            if saved is not None:
                os.close(saved)
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()  # Python's own buffered writes land in the capture too
            with contextlib.suppress(OSError):
                os.dup2(saved, STDERR)
            os.close(saved)
            _replay(capture)


def _replay(capture: Any) -> None:
    """Write the captured lines, less the noise, to the real stderr."""
    try:
        capture.seek(0)
        kept = b"".join(line for line in capture if not any(p.match(line) for p in NOISE_LINES))
        while kept:
            kept = kept[os.write(STDERR, kept):]
    except OSError:
        logger.debug("trainprof: could not write back stderr", exc_info=True)


def ignore_cycle_warning() -> Any:
    """Filter torch's cycle warning (module docstring); returns the filter entry for `restore`."""
    warnings.filterwarnings("ignore", message=CYCLE_WARNING, category=UserWarning)
    return warnings.filters[0]


def restore(entry: Any) -> None:
    """Remove one warnings filter entry that `ignore_cycle_warning` added (the others stay as they are)."""
    if entry is not None and entry in warnings.filters:
        warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list; typeshed says Sequence


C10_WARNING_EVERY = 1000
"""c10 prints its "unknown size" line at every this-many-th free of such a block (CPUAllocator.cpp's
`log_cnt_`, torch 2.13)."""


class NoiseCanary:
    """Small CPU blocks allocated while memory profiling is off (`arm()`, between windows), freed by
    `release()` inside `quiet_torch_stderr()` once a window records memory: one by one until c10's
    "unknown size" line lands in the captured stderr, where it is filtered (module docstring)."""

    def __init__(self) -> None:
        self._blocks: list[Any] = []
        self.arm()

    def arm(self) -> None:
        """Hold `C10_WARNING_EVERY` blocks again (call it while memory profiling is off)."""
        import torch

        self._blocks += [torch.empty(1) for _ in range(C10_WARNING_EVERY - len(self._blocks))]

    def release(self) -> None:
        """Free blocks until fd 2 grows (c10 printed its line into the capture), or every one: at most
        `C10_WARNING_EVERY` frees reach c10's next line. Where fd 2 is no file (not captured) its
        size never moves, and all are freed: c10's line is printed there once, as it would anyway."""
        try:
            before = os.fstat(STDERR).st_size
        except OSError:
            before = None
        while self._blocks:
            self._blocks.pop()
            with contextlib.suppress(OSError):
                if before is not None and os.fstat(STDERR).st_size != before:
                    return
