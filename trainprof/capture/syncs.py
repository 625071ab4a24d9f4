"""Live capture of the call sites of synchronizing calls, during recorded steps only.

A trace names the function a sync happened in but not the line (see DEVELOPING.md), so the session
records, while the loop runs, where each sync was called:

- implicit syncs (`.item()`, `.cpu()`, boolean-mask indexing, pageable copies, ...): CUDA's sync
  debug mode "warn" turns each into a Python warning; a `warnings.showwarning` hook records the
  Python stack at that moment and swallows the warning, so the user's console is not flooded;
- explicit syncs (`torch.cuda.synchronize`, `Event.synchronize`, `Stream.synchronize`), which the
  debug mode does not flag: thin wrappers record them.

Everything is installed by `SyncCapture.activate()` and undone by `deactivate()`; nothing stays
installed outside the recorded steps. The hooks run inside the user's own calls, so a failure in
them never reaches the user: the call goes on as if trainprof were absent, one warning says so,
and the capture stops recording (`failed`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from trainprof.user_code import CodeLayout, current_layout, is_user_file, warn

logger = logging.getLogger(__name__)

# The text of the warning that `torch.cuda.set_sync_debug_mode("warn")` emits per synchronizing op.
SYNC_WARNING_RE = re.compile(r"called a synchronizing CUDA operation")
# Emitted once when the debug mode is switched on.
_PROTOTYPE_WARNING_RE = re.compile(r"Synchronization debug mode is a prototype feature")

_FrameTuple = tuple[str, int, str]  # (file, line, function)


def is_library_file(path: str, layout: CodeLayout | None = None) -> bool:
    """True when `path` is not the user's code (torch, HF libraries, trainprof, the stdlib, any
    installed package, frozen modules): the same rule the trace analysis applies."""
    return not is_user_file(path, layout)


def innermost_user_frame(
    stack: Iterable[_FrameTuple], is_library: Callable[[str], bool] = is_library_file
) -> _FrameTuple | None:
    """The innermost frame of the user's code in a stack ordered outermost -> innermost, or None."""
    for frame in reversed(list(stack)):
        if not is_library(frame[0]):
            return frame
    return None


def current_stack(skip: int = 1) -> list[_FrameTuple]:
    """The calling thread's Python stack, outermost -> innermost, without the `skip` innermost frames.

    Walks frames directly rather than `traceback.extract_stack()`, which reads source lines.
    """
    frame: FrameType | None = sys._getframe(skip)
    stack: list[_FrameTuple] = []
    while frame is not None:
        code = frame.f_code
        stack.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    stack.reverse()
    return stack


def _trim_capture_frames(stack: list[_FrameTuple]) -> list[_FrameTuple]:
    """Drop the innermost frames that are the warnings machinery or this module itself."""
    warnings_file = os.path.realpath(warnings.__file__)
    this_file = os.path.realpath(__file__)
    end = len(stack)
    while end > 0 and os.path.realpath(stack[end - 1][0]) in (warnings_file, this_file):
        end -= 1
    return stack[:end]


@dataclass
class SyncSite:
    """One synchronizing call, as written to `<worker>.syncsites.json`."""

    step: int
    call: str
    file: str | None
    line: int | None
    function: str | None
    stack: list[_FrameTuple] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of DEVELOPING.md's captured-sync-sites contract."""
        return {
            "step": self.step,
            "call": self.call,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "stack": [{"file": f, "line": n, "function": fn} for f, n, fn in self.stack],
        }


class SyncCapture:
    """Records synchronizing calls while active; `sites` holds them in the order they happened."""

    def __init__(self) -> None:
        self.sites: list[SyncSite] = []
        self.step_num = 0
        self.active = False
        self._lock = threading.Lock()
        self._local = threading.local()  # .in_explicit: inside a wrapped explicit sync
        self._undo: list[Callable[[], None]] = []
        self.layout: CodeLayout | None = None
        """Where library code lives in this process, fixed when recording first starts."""
        self.failed = False
        """A hook failed: nothing more is recorded (the hooks pass every call straight through)."""

    # -- recording ---------------------------------------------------------------------------

    def record(self, call: str, stack: list[_FrameTuple]) -> SyncSite:
        """Record one synchronizing call with its stack (outermost -> innermost)."""
        layout = self.layout
        user = innermost_user_frame(stack, lambda file: is_library_file(file, layout))
        site = SyncSite(
            step=self.step_num,
            call=call,
            file=user[0] if user else None,
            line=user[1] if user else None,
            function=user[2] if user else None,
            stack=stack,
        )
        with self._lock:
            self.sites.append(site)
        return site

    def take_sites(self) -> list[SyncSite]:
        """Return the sites recorded so far and forget them."""
        with self._lock:
            sites, self.sites = self.sites, []
        return sites

    def _guarded_record(self, call: str, skip: int, trim: bool = False) -> None:
        """Record the caller's stack; any failure makes the capture step aside instead of raising."""
        try:
            stack = current_stack(skip=skip + 1)
            self.record(call, _trim_capture_frames(stack) if trim else stack)
        except Exception as exc:
            self._step_aside(exc)

    def _step_aside(self, exc: Exception) -> None:
        """Stop recording for good after a hook failed; say so once, never raise into the user's call."""
        first = not self.failed
        self.failed = True
        self.active = False
        if not first:
            return
        logger.debug("trainprof: sync capture failed", exc_info=exc)
        message = (
            f"trainprof: capturing sync call sites failed ({type(exc).__name__}: {exc}); "
            "sync lines are not recorded from here on, training goes on"
        )
        warn(message)  # from the user's frame; never raises (`python -W error`: logged)

    def _explicit_wrapper(self, call: str, original: Callable[..., Any]) -> Callable[..., Any]:
        capture = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not capture.active or getattr(capture._local, "in_explicit", False):
                return original(*args, **kwargs)
            capture._guarded_record(call, skip=2)
            # A sync debug warning raised by the explicit call itself is the same sync: ignore it.
            capture._local.in_explicit = True
            try:
                return original(*args, **kwargs)
            finally:
                capture._local.in_explicit = False

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(original, "__name__", call)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def _showwarning(self, original: Callable[..., Any]) -> Callable[..., Any]:
        capture = self

        def showwarning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
            if not capture._undo:  # removed, but still called through a hook the user put over it
                return original(message, category, filename, lineno, file, line)
            try:
                text = str(message)
                is_sync = SYNC_WARNING_RE.search(text) is not None
                is_prototype = _PROTOTYPE_WARNING_RE.search(text) is not None
            except Exception as exc:
                capture._step_aside(exc)
                return original(message, category, filename, lineno, file, line)
            if is_sync:
                if capture.active and not getattr(capture._local, "in_explicit", False):
                    capture._guarded_record("implicit", skip=2, trim=True)
                return  # swallowed: one per sync would flood the console
            if is_prototype:
                return
            original(message, category, filename, lineno, file, line)

        return showwarning

    # -- install / remove -------------------------------------------------------------------

    def activate(self, step_num: int) -> None:
        """Install the hooks (idempotent) and record from profiler step `step_num` on."""
        self.step_num = step_num
        self.prepare()
        self.active = not self.failed

    def prepare(self) -> None:
        """Read the code layout and install the hooks without recording (idempotent).

        The session calls it in the warm-up step, so that this one-off work (1 ms and more on a slow
        host: the layout resolves every imported module's path) is not in a recorded step, where the
        analysis would count it as the user's host time.
        """
        if self.layout is None:
            self.layout = current_layout()
        if self._undo:  # already installed (paused or active)
            return
        import torch

        self._patch(torch.cuda, "synchronize", "torch.cuda.synchronize")
        self._patch(getattr(torch.cuda, "Event", None), "synchronize", "Event.synchronize")
        self._patch(getattr(torch.cuda, "Stream", None), "synchronize", "Stream.synchronize")

        previous_showwarning = warnings.showwarning
        ours = warnings.showwarning = self._showwarning(previous_showwarning)
        self._undo.append(lambda: _restore(warnings, "showwarning", ours, previous_showwarning))
        # "always": the default filter shows a warning once per code location; every sync counts.
        for pattern in (SYNC_WARNING_RE.pattern, _PROTOTYPE_WARNING_RE.pattern):
            warnings.filterwarnings("always", message=f".*{pattern}")
            entry = warnings.filters[0]
            self._undo.append(functools.partial(_remove_filter, entry))

        if torch.cuda.is_available():
            previous_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._undo.append(lambda: torch.cuda.set_sync_debug_mode(previous_mode))

    def _patch(self, owner: Any, attribute: str, call: str) -> None:
        original = getattr(owner, attribute, None) if owner is not None else None
        if original is None:
            return
        wrapper = self._explicit_wrapper(call, original)
        setattr(owner, attribute, wrapper)
        self._undo.append(lambda: _restore(owner, attribute, wrapper, original))

    def pause(self) -> None:
        """Stop recording but keep the hooks: around the profiler's own step, whose syncs are not
        the user's (stopping a trace synchronizes the device)."""
        self.active = False

    def deactivate(self) -> None:
        """Remove every hook and restore the sync debug mode; safe to call more than once."""
        self.active = False
        failures = []
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # keep undoing the rest
                failures.append(exc)
        if failures:
            raise failures[0]


def _restore(owner: Any, attribute: str, ours: Any, original: Any) -> None:
    """Put `original` back, unless the user replaced `ours` meanwhile: then theirs stays (ours, if
    theirs calls it, passes everything through once the capture is off)."""
    if getattr(owner, attribute, None) is ours:
        setattr(owner, attribute, original)


def _remove_filter(entry: tuple[Any, ...]) -> None:
    try:
        warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list; typeshed says Sequence
    except ValueError:
        return
    mutated = getattr(warnings, "_filters_mutated", None)
    mutated = mutated or getattr(warnings, "_filters_mutated_lock_held", None)
    if mutated is not None:
        mutated()
