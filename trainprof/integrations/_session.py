"""What the framework callbacks share: one session per training run, driven by the framework's
own step counter, and the scalars written into the framework's TensorBoard folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainprof.run_name import shared_run_name
from trainprof.session import Session, session, warn

logger = logging.getLogger("trainprof")


class TrainingSession:
    """A `Session` per training run (`begin` ... `end`), stepped by the framework's callback.

    The session's own optimizer-step hook also sees the first optimizer step; the first `step()`
    right after it closes that same step (Session's rule), and from then on only `step()` ends
    steps. So a step is the framework's optimizer step, counted once.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = dict(options)
        if self._options.get("run_name") is None:
            # Ranks of one launch share the run folder (each writes its own files into it).
            self._options["run_name"] = shared_run_name()
        self.session: Session = self._new_session()  # checks the options now, not at train time
        self._begun = False

    def begin(self) -> Session:
        """Start profiling a training run; a second run gets a fresh session (and run folder)."""
        if self._begun:
            self.session.stop()
            self.session = self._new_session()
        self._begun = True
        return self.session.start()

    def _new_session(self) -> Session:
        made = session(**self._options)
        made.started_by = "callback"  # its advice speaks of the framework's steps, not sess.step()
        return made

    def step(self) -> None:
        """End one optimizer step."""
        self.session.step()

    def end(self, user_error: bool = False) -> None:
        """Stop profiling; unless training failed, analyse and write the reports."""
        self.session.stop(user_error=user_error)


def write_framework_scalars(sess: Session, folder: str | os.PathLike[str], step_offset: int) -> bool:
    """Write the session's per-step scalars into a framework's TensorBoard folder.

    `step_offset` maps a profiler step number onto the framework's own x-axis (its logged step for
    the same optimizer step), so the scalars line up with the loss curve. False when nothing was
    written (no analysis, scalars off, tensorboard missing, or a failure, which only warns).
    """
    if sess.analysis is None or not sess.config.tensorboard_scalars:
        return False
    try:
        from trainprof.report.tensorboard import write_scalars

        return write_scalars(sess.analysis, Path(folder), step_offset)
    except Exception as error:  # a report must never end the user's training run
        logger.debug("trainprof: writing scalars into %s failed", folder, exc_info=True)
        warn(f"trainprof: writing scalars into {folder} failed ({error})")
        return False
