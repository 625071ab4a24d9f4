"""The schedule and the step hooks: the process-wide optimizer-step hook that ends steps, the
profiler's schedule, NVTX ranges per step, and the watch for another profiler starting (module
docstring of `trainprof.session`)."""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from trainprof.config import SessionConfig
from trainprof.session.common import _OURS, logger

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.session.lifecycle import Session

_ACTIVE: Session | None = None
"""The session whose profiler runs in this process, if any (torch allows one profiler at a time)."""
_ACTIVE_LOCK = threading.Lock()
"""Held while a session claims `_ACTIVE` and while the step hook is installed (threads race there)."""
_STEP_HOOK: Any = None
"""The handle of the process-wide optimizer-step hook (`_dispatch_optimizer_step`), once installed."""


class StepHooks:
    """The `Session`'s steps: ended by the optimizer-step hook or `step()`, each one moving the
    profiler along its schedule (`Session` holds the state)."""

    def step(self) -> None:
        """End the current step; for loops without an optimizer (see the module docstring)."""
        if not self._manual:
            self._manual = True
            if self._last_step_by_optimizer:
                # This call closes the step that the optimizer just ended: count it once.
                self._last_step_by_optimizer = False
                return
        self._advance()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._manual or threading.get_ident() != self._thread:
            return  # another thread's loop (its own session stepped aside): not this session's steps
        # The first optimizer to step after a step's end ends the next step; another that steps before
        # it steps again is of the same iteration (a GAN's second). One stepping a second time since,
        # or any once the step-ender is gone (replaced: stage-wise fine-tuning), ends a step.
        ender = self._primary_optimizer() if self._primary_optimizer is not None else None
        if ender is not None and optimizer is not ender and optimizer not in self._same_iteration:
            self._same_iteration.add(optimizer)
            return
        self._primary_optimizer, self._same_iteration = weakref.ref(optimizer), weakref.WeakSet()
        self._advance()
        self._last_step_by_optimizer = True

    def _advance(self) -> None:
        if not self._running or os.getpid() != self._pid:
            return
        ended = time.perf_counter()
        self._group.capture()  # a script may create its process group after the session started
        self.steps_ended += 1
        # The step that just ended ran under action_at(steps_ended - 1).
        if self._step_began is not None and self._unprofiled(self.steps_ended - 1):
            self._host_step_ms.append((ended - self._step_began) * 1e3)
        try:
            self._profile_step()
        finally:
            self._mark_gpu()
            self._step_began = time.perf_counter()
            self._mark_forward()

    def _profile_step(self) -> None:
        if self._capture is not None:
            self._capture.pause()  # the profiler's own syncs (stopping a trace) are not the user's
        try:
            if self._window_edge(self.steps_ended):
                # torch prints its start/stop lines here (trainprof.capture.torch_noise)
                from trainprof.capture import torch_noise

                with torch_noise.quiet_torch_stderr():
                    self._profiler.step()  # may call _on_trace_ready
                    recording = self.config.action_at(self.steps_ended) in ("record", "save")
                    if self._canary is not None and recording:
                        self._canary.release()  # c10's allocator line, inside this filter
                    elif self._canary is not None:
                        self._canary.arm()  # memory profiling is off again: blocks for the next window
            else:
                self._profiler.step()
            if self._failure is None:
                self._follow_schedule()
        except _OURS as exc:
            self._step_aside("the profiler step", exc)
            return
        if self._failure is not None:
            self._step_aside(*self._failure)

    def _window_edge(self, step: int) -> bool:
        """Whether the profiler step into `step` starts or ends a recorded window (or a warm-up)."""
        before = self.config.action_at(step - 1)
        return before == "save" or before != self.config.action_at(step)

    def _follow_schedule(self) -> None:
        """Capture sync sites exactly during the recorded steps; NVTX ranges per phase and step; the
        allocator's history from the first recorded step (`memory_history=True`)."""
        if self._nvtx is not None:
            self._mark_nvtx()
        if self._memory is not None:
            self._memory.follow(self.config.action_at(self.steps_ended), self.steps_ended)
        if self._capture is None:
            return
        from torch.profiler import ProfilerAction

        action = self._profiler.current_action
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._capture.activate(self._profiler.step_num)
        elif action == ProfilerAction.WARMUP:
            self._capture.prepare()  # its one-off cost lands in the warm-up step, not in a recorded one
        else:
            self._capture.deactivate()

    def _mark_nvtx(self) -> None:
        """Close the last step's NVTX range (and its phase's, when the phase changes), open the next.

        Nsight Systems then shows `trainprof wait|warmup|record` ranges holding `trainprof step N`.
        NVTX needs CUDA; any failure turns NVTX off for the session.
        """
        try:
            action = self.config.action_at(self.steps_ended)
            phase = {"none": "wait", "save": "record"}.get(action, action)
            if self._nvtx_depth == 2:
                self._nvtx.range_pop()
                self._nvtx_depth = 1
            if phase != self._nvtx_phase:
                if self._nvtx_depth == 1:
                    self._nvtx.range_pop()
                    self._nvtx_depth = 0
                self._nvtx.range_push(f"trainprof {phase}")
                self._nvtx_depth, self._nvtx_phase = 1, phase
            self._nvtx.range_push(f"trainprof step {self.steps_ended}")
            self._nvtx_depth = 2
        except Exception:
            logger.debug("trainprof: NVTX ranges off", exc_info=True)
            self._nvtx = None

    def _close_nvtx(self) -> None:
        nvtx, self._nvtx = self._nvtx, None
        while nvtx is not None and self._nvtx_depth > 0:
            self._nvtx_depth -= 1
            nvtx.range_pop()


def _dispatch_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The one optimizer-step hook: hands the step to the running session, if any."""
    session = _ACTIVE
    if session is not None:
        session._on_optimizer_step(optimizer, args, kwargs)


def _install_step_hook() -> None:
    """Install `_dispatch_optimizer_step` once per process (caller holds `_ACTIVE_LOCK`).

    Never removed: see the module docstring. Adding it can still race with another thread that is
    inside its own global optimizer hooks at that moment (a user's); it happens once per process.
    """
    global _STEP_HOOK
    if _STEP_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK = register_optimizer_step_post_hook(_dispatch_optimizer_step)


class _TorchSchedule:
    """`SessionConfig.action_at` as torch.profiler's schedule (step -> ProfilerAction)."""

    def __init__(self, config: SessionConfig) -> None:
        from torch.profiler import ProfilerAction

        self._config = config
        self._actions = {"none": ProfilerAction.NONE, "warmup": ProfilerAction.WARMUP,
                         "record": ProfilerAction.RECORD, "save": ProfilerAction.RECORD_AND_SAVE}

    def __call__(self, step: int) -> Any:
        return self._actions[self._config.action_at(step)]


def _nvtx_module() -> Any:
    """torch.cuda.nvtx when CUDA is present, else None (NVTX raises on a CPU-only build)."""
    import torch

    return torch.cuda.nvtx if torch.cuda.is_available() else None


def _watch_other_profilers(owner: Session) -> Any:
    """While `owner` runs, a torch profiler other than its own that starts makes it step aside first.

    Every torch profiler (torch.profiler.profile and torch.autograd.profiler.profile) enables itself
    through `torch.autograd.profiler.profile._prepare_trace`. Returns the undo.
    """
    from torch.autograd import profiler as autograd_profiler

    cls = autograd_profiler.profile
    original = cls._prepare_trace
    session_ref = weakref.ref(owner)

    def _prepare_trace(prof: Any, *args: Any, **kwargs: Any) -> Any:
        session = session_ref()
        if session is not None and session._running and session._pid == os.getpid():
            ours = getattr(session._profiler, "profiler", None)
            if prof is not ours:
                session._yield_to_other_profiler()
        return original(prof, *args, **kwargs)

    _prepare_trace.__wrapped__ = original  # type: ignore[attr-defined]
    cls._prepare_trace = _prepare_trace

    def undo() -> None:
        if cls.__dict__.get("_prepare_trace") is _prepare_trace:
            cls._prepare_trace = original

    return undo
