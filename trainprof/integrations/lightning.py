"""`TrainprofCallback` for Lightning's `Trainer` (`lightning.pytorch` or `pytorch_lightning`).

    from trainprof.integrations.lightning import TrainprofCallback

    trainer = Trainer(max_steps=100, callbacks=[TrainprofCallback(log_dir="log", active=3)])
    trainer.fit(model, loader)   # the report is printed and written when training ends

A step is one optimizer step: a batch ends a step only when `trainer.global_step` moved, so with
`accumulate_grad_batches=N` a step spans N batches. Every rank writes its own files into one run
folder (`trainprof.run_name.shared_run_name`). With a `TensorBoardLogger`, rank 0 also writes
trainprof's per-step scalars into the logger's folder. The callback is a subclass of the
`Callback` of each Lightning package installed, so either package's `Trainer` accepts it.
"""

from __future__ import annotations

import os
from typing import Any

from trainprof.integrations._session import TrainingSession, write_framework_scalars
from trainprof.session import Session, warn


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    for module in ("lightning.pytorch", "pytorch_lightning"):
        try:
            base = __import__(module, fromlist=["Callback"]).Callback
        except ImportError:
            continue
        if base not in bases:
            bases.append(base)
    if not bases:
        raise ImportError("trainprof.integrations.lightning needs lightning or pytorch-lightning installed")
    return tuple(bases)


# Lightning logs a training batch at the number of optimizer steps taken before it: the step
# that profiler step N records (the (N+1)-th optimizer step) is logged at step N.
LOGGED_STEP_OFFSET = 0


class TrainprofCallback(*_callback_bases()):  # type: ignore[misc]
    """Profile a Lightning `Trainer.fit` with `trainprof.session`'s keyword arguments.

    `callback.session` is the current `trainprof.Session`: after fit, its `findings`, `summary`
    and `run_dir`.
    """

    def __init__(self, log_dir: str | os.PathLike[str] = "log", run_name: str | None = None,
                 **options: Any) -> None:
        super().__init__()
        self._training = TrainingSession({"log_dir": log_dir, "run_name": run_name, **options})
        self._global_step = 0

    @property
    def session(self) -> Session:
        """The session of the current (or last) fit."""
        return self._training.session

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Start profiling (every rank), after the sanity check."""
        self._global_step = trainer.global_step
        self._training.begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """End a step when this batch ran an optimizer step (not on accumulating batches)."""
        if trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            self._training.step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Stop, analyse, write the reports; on rank 0 also the scalars for a TensorBoardLogger."""
        self._training.end()
        if not trainer.is_global_zero:
            return
        for folder in _tensorboard_log_dirs(trainer):
            write_framework_scalars(self.session, folder, step_offset=LOGGED_STEP_OFFSET)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Training failed: stop the profiler cleanly, write no report."""
        self._training.end(user_error=True)


def _tensorboard_log_dirs(trainer: Any) -> list[str]:
    """The folders of the trainer's TensorBoard loggers (either Lightning package's)."""
    folders = []
    try:
        for logger in trainer.loggers:
            if type(logger).__name__ == "TensorBoardLogger" and logger.log_dir:
                folders.append(str(logger.log_dir))
    except Exception as error:  # never let the profiler's extras fail the user's fit()
        warn(f"trainprof: finding the TensorBoard logger's folder failed ({error})")
    return folders
