"""`TrainprofCallback` for the Hugging Face `transformers.Trainer`.

    from trainprof.integrations.hf import TrainprofCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[TrainprofCallback(log_dir="log", wait=1, warmup=1, active=3)])
    trainer.train()   # the report is printed and written when training ends

A step is one optimizer step (`on_step_end`): with `gradient_accumulation_steps=N` it spans N
micro-batches. Every rank writes its own files into one run folder (`trainprof.run_name.shared_run_name`).
When the Trainer logs to TensorBoard, rank 0 also writes trainprof's per-step scalars into the
Trainer's TensorBoard folder, on the Trainer's `global_step` axis.

If `trainer.train()` raises, the Trainer calls no callback: `callback.session.stop(user_error=True)`
stops the profiler cleanly (the next `train()` does it too).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trainprof.integrations._session import TrainingSession, write_framework_scalars
from trainprof.session import Session, warn

# The Trainer logs an optimizer step at `state.global_step` after incrementing it: the step that
# profiler step N records (the (N+1)-th optimizer step) is logged at global_step N + 1.
GLOBAL_STEP_OFFSET = 1


class TrainprofCallback(TrainerCallback):
    """Profile a `transformers.Trainer` run with `trainprof.session`'s keyword arguments.

    `callback.session` is the current `trainprof.Session`: after training, its `findings`,
    `summary` and `run_dir`.
    """

    def __init__(self, log_dir: str | os.PathLike[str] = "log", run_name: str | None = None,
                 **options: Any) -> None:
        self._training = TrainingSession({"log_dir": log_dir, "run_name": run_name, **options})
        self._tensorboard_since: float | None = None

    @property
    def session(self) -> Session:
        """The session of the current (or last) training run."""
        return self._training.session

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start profiling (every rank)."""
        self._tensorboard_since = time.time() if state.is_world_process_zero else None
        self._training.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """One optimizer step ended (after all of its micro-batches)."""
        self._training.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Stop, analyse, write the reports; on rank 0 also the scalars for the Trainer's TensorBoard."""
        self._training.end()
        if self._tensorboard_since is None:
            return
        try:
            folder = trainer_tensorboard_dir(args, since=self._tensorboard_since)
        except Exception as error:  # never let the profiler's extras fail the user's train()
            warn(f"trainprof: finding the Trainer's TensorBoard folder failed ({error})")
            return
        if folder is not None:
            write_framework_scalars(self.session, folder, step_offset=GLOBAL_STEP_OFFSET)


def trainer_tensorboard_dir(args: Any, since: float = 0.0) -> Path | None:
    """The folder the Trainer's TensorBoard callback writes into, or None when it reports elsewhere.

    transformers < 5 names it `args.logging_dir`; 5.x takes `$TENSORBOARD_LOGGING_DIR`, else makes
    `output_dir/runs/<time>_<host>/` when training begins: the one of those whose events file was
    written since `since` (a time.time()) and last.
    """
    report_to = args.report_to
    report_to = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if not {"tensorboard", "all"} & set(report_to):
        return None
    folder = getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
    if folder:
        return Path(folder).expanduser()
    runs = Path(args.output_dir) / "runs"
    # File times can lag the clock by a file system tick: allow two seconds.
    events = [f for f in runs.glob("*/events.out.tfevents.*") if f.stat().st_mtime >= since - 2.0]
    if not events:
        return None
    return max(events, key=lambda f: f.stat().st_mtime).parent
