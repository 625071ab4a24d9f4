"""When each un-profiled step reaches its first forward: how late a rank starts its step's work
without the profiler, for the cross-rank report (`trainprof.analysis.stragglers`).

Between one step's optimizer step and the next step's forward a rank fetches its batch, logs,
sleeps, checkpoints: what one rank does there and the others do not makes the others wait for it
inside the step's collectives. At the start of each un-profiled step the session arms a one-shot
global forward pre-hook (`torch.nn.modules.module.register_module_forward_pre_hook`); the first
module call of the step removes it and records a CUDA event there (and the host time since the
step began). At exit each event is read against the step's own start event (`Session._mark_gpu`):
the time the GPU waited for the step's work to arrive, measured without the profiler and without
a sync (the events are read once, at exit).

Cost per un-profiled step: one hook registration and, on the first module call only, one Python
call and one event record; the hook is gone before any other module runs (while a global hook is
registered every module call takes `Module._call_impl`'s slow path). Never armed in a process where
torch.compile has compiled anything: Dynamo guards on the global hooks, and a hook that comes and
goes would recompile the user's graphs. Any failure turns the marks off for the session.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("trainprof")


class ForwardMarks:
    """The first-forward marks of a session's un-profiled steps (module docstring)."""

    def __init__(self, kept: int) -> None:
        self._marks: list[tuple[int, float, Any]] = []  # (step, host ms since it began, CUDA event or None)
        self._kept = kept
        self._handle: Any = None
        self._step = -1
        self._began = 0.0
        self._thread: int | None = None
        self._cuda = False
        self.on = True

    def arm(self, step: int, began: float, cuda: bool) -> None:
        """Mark the first forward of step `step`, which began at `began` (`time.perf_counter()`);
        `cuda`: record a CUDA event there too."""
        if not self.on:
            return
        self.disarm()
        try:
            if _compiled_anything():
                return
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._step, self._began, self._cuda = step, began, cuda
            self._thread = threading.get_ident()
            self._handle = register_module_forward_pre_hook(self._on_first_forward)
        except Exception:
            logger.debug("trainprof: forward marks off", exc_info=True)
            self.on = False

    def disarm(self) -> None:
        """Remove the hook if no module ran since `arm` (a step without a forward)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()

    def _on_first_forward(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:  # another thread's module: not this loop's forward
            return
        try:
            self.disarm()
            host_ms = (time.perf_counter() - self._began) * 1e3
            event = None
            if self._cuda:
                import torch

                if not torch.cuda.is_current_stream_capturing():
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
            if len(self._marks) >= self._kept:
                del self._marks[0]
            self._marks.append((self._step, host_ms, event))
        except Exception:
            logger.debug("trainprof: forward marks off", exc_info=True)
            self.on = False

    def pre_forward_ms(self, step_starts: dict[int, Any]) -> tuple[list[float], str | None]:
        """At exit (after the last event was reached): per marked step, ms from its start to its
        first forward, as the GPU ran it where the step's start event is in `step_starts` (step ->
        CUDA event), else on the host; and how (`cuda_events`, `host`, None: no marks)."""
        self.disarm()
        gpu = []
        try:
            for step, _, event in self._marks:
                start = step_starts.get(step)
                if event is not None and start is not None:
                    event.synchronize()
                    gpu.append(max(start.elapsed_time(event), 0.0))
        except Exception:
            logger.debug("trainprof: reading the forward marks failed", exc_info=True)
            gpu = []
        if gpu:
            return gpu, "cuda_events"
        host = [ms for _, ms, _ in self._marks]
        return host, ("host" if host else None)


def _compiled_anything() -> bool:
    """Whether torch.compile has compiled a frame in this process (Dynamo imported and counting)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo_utils, "counters", None)
    return bool(counters and counters.get("frames", {}).get("total"))
