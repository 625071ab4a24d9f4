"""The framework integrations on the real frameworks, CPU, tiny GPT-2: HF Trainer, Lightning, accelerate.

Each run uses gradient accumulation 2 and checks, from the trace itself, that a profiled step is one
optimizer step spanning two micro-batches (two model forwards), never one micro-batch.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from trainprof.config import SessionConfig

SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}
QUIET = {"console": False, "profile_memory": False, "record_shapes": False}  # outputs not under test
OPTIMIZER_STEPS = 6
ACCUMULATION = 2


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def samples(count: int, seq_len: int = 16) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, 128, (seq_len,), generator=generator)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


class OptimizerSteps:
    """Counts real `torch.optim` steps, independently of trainprof (torch's global hook)."""

    def __enter__(self):
        self.count = 0

        def count(optimizer, args, kwargs):
            self.count += 1

        self._handle = register_optimizer_step_post_hook(count)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False


def forwards_per_profiler_step(trace_file: Path, module: str = "GPT2LMHeadModel") -> dict[int, int]:
    """How many forwards of `module` each recorded `ProfilerStep#N` holds, read from the trace."""
    with gzip.open(trace_file, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = {}
    for event in events:
        match = re.fullmatch(r"ProfilerStep#(\d+)", event.get("name", ""))
        if match and event.get("ph") == "X":
            steps[int(match.group(1))] = (event["ts"], event["ts"] + event["dur"])
    prefix = f"nn.Module: {module}_"
    forwards = [e["ts"] for e in events
                if e.get("cat") == "python_function" and e.get("name", "").startswith(prefix)]
    return {step: sum(start <= ts < end for ts in forwards) for step, (start, end) in sorted(steps.items())}


def tensorboard_scalars(folder: Path) -> dict[str, list[int]]:
    """Tag -> steps of the trainprof scalars in a TensorBoard folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: [event.step for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"] if tag.startswith("trainprof/")}


def assert_profiled_optimizer_steps(sess, optimizer_steps: int) -> None:
    """The session ended one step per optimizer step, and each recorded step holds 2 micro-batches."""
    recorded = SessionConfig(**SCHEDULE).recorded_steps()
    assert sess.steps_ended == optimizer_steps == OPTIMIZER_STEPS
    assert len(sess.trace_files) == 1
    assert forwards_per_profiler_step(sess.trace_files[0]) == {step: ACCUMULATION for step in recorded}
    summary = json.loads((sess.run_dir / "summary.json").read_text())
    assert [row["step"] for row in summary["steps"]] == recorded
    assert (sess.run_dir / "report.md").is_file()


def test_hf_trainer_callback_steps_per_optimizer_step(tmp_path):
    from transformers import Trainer, TrainingArguments

    from trainprof.integrations.hf import GLOBAL_STEP_OFFSET, TrainprofCallback

    callback = TrainprofCallback(log_dir=tmp_path / "log", run_name="hf", **SCHEDULE, **QUIET)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATION, max_steps=OPTIMIZER_STEPS, logging_steps=1,
        report_to=["tensorboard"], save_strategy="no", use_cpu=True, dataloader_pin_memory=False,
        disable_tqdm=True,
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=samples(2 * ACCUMULATION * OPTIMIZER_STEPS),
                      callbacks=[callback])
    with OptimizerSteps() as optimizer_steps:
        trainer.train()

    assert trainer.state.global_step == OPTIMIZER_STEPS
    sess = callback.session
    assert sess.run_dir == tmp_path / "log" / "hf"
    assert_profiled_optimizer_steps(sess, optimizer_steps.count)
    assert not torch.autograd._profiler_enabled()
    # The Trainer's TensorBoard folder got trainprof's scalars on its global_step axis.
    (trainer_folder,) = {f.parent for f in (tmp_path / "out" / "runs").glob("*/events.out.tfevents.*")}
    expected = [step + GLOBAL_STEP_OFFSET for step in SessionConfig(**SCHEDULE).recorded_steps()]
    scalars = tensorboard_scalars(trainer_folder)
    assert scalars and all(steps == expected for steps in scalars.values())


def test_hf_callback_rejects_unknown_options():
    from trainprof.integrations.hf import TrainprofCallback

    with pytest.raises(TypeError, match="actve"):
        TrainprofCallback(actve=3)
    with pytest.raises(ValueError, match="active"):
        TrainprofCallback(active=0)


def test_hf_tensorboard_folder_rules(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from trainprof.integrations.hf import trainer_tensorboard_dir

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = SimpleNamespace(report_to=["none"], output_dir=str(tmp_path))
    assert trainer_tensorboard_dir(args) is None
    args = SimpleNamespace(report_to="tensorboard", output_dir=str(tmp_path),
                           logging_dir=str(tmp_path / "tb4"))
    assert trainer_tensorboard_dir(args) == tmp_path / "tb4"  # transformers 4.x
    args = SimpleNamespace(report_to=["tensorboard"], output_dir=str(tmp_path))
    assert trainer_tensorboard_dir(args) is None  # nothing written yet
    for name in ("old", "new"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "events.out.tfevents.1").write_bytes(b"")
    os.utime(tmp_path / "runs" / "old" / "events.out.tfevents.1", (1, 1))
    assert trainer_tensorboard_dir(args, since=1000.0) == tmp_path / "runs" / "new"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "env"))
    assert trainer_tensorboard_dir(args) == tmp_path / "env"


def _lightning():
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    return pl


def _lit_gpt2(pl, fail_at_step: int | None = None):
    class LitGPT2(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2()

        def training_step(self, batch, batch_idx):
            if fail_at_step is not None and self.global_step == fail_at_step:
                raise RuntimeError("planted failure")
            loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return LitGPT2()


def _lightning_trainer(pl, tmp_path, callback, logger=False):
    return pl.Trainer(
        max_steps=OPTIMIZER_STEPS, accumulate_grad_batches=ACCUMULATION, accelerator="cpu", devices=1,
        logger=logger, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback], default_root_dir=str(tmp_path / "pl"),
    )


def test_lightning_callback_steps_per_optimizer_step(tmp_path):
    pl = _lightning()
    from trainprof.integrations.lightning import LOGGED_STEP_OFFSET, TrainprofCallback

    callback = TrainprofCallback(log_dir=tmp_path / "log", run_name="pl", **SCHEDULE, **QUIET)
    logger = pl.loggers.TensorBoardLogger(str(tmp_path / "tb"), name="gpt2")
    trainer = _lightning_trainer(pl, tmp_path, callback, logger=logger)
    loader = torch.utils.data.DataLoader(samples(2 * ACCUMULATION * OPTIMIZER_STEPS), batch_size=2)
    with OptimizerSteps() as optimizer_steps:
        trainer.fit(_lit_gpt2(pl), loader)

    assert trainer.global_step == OPTIMIZER_STEPS
    assert_profiled_optimizer_steps(callback.session, optimizer_steps.count)
    expected = [step + LOGGED_STEP_OFFSET for step in SessionConfig(**SCHEDULE).recorded_steps()]
    scalars = tensorboard_scalars(Path(logger.log_dir))
    assert scalars and all(steps == expected for steps in scalars.values())


def test_lightning_failure_stops_the_profiler_and_writes_no_report(tmp_path):
    pl = _lightning()
    from trainprof.integrations.lightning import TrainprofCallback

    callback = TrainprofCallback(log_dir=tmp_path / "log", run_name="pl", wait=0, warmup=1, active=4, **QUIET)
    trainer = _lightning_trainer(pl, tmp_path, callback)
    loader = torch.utils.data.DataLoader(samples(2 * ACCUMULATION * OPTIMIZER_STEPS), batch_size=2)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.fit(_lit_gpt2(pl, fail_at_step=3), loader)
    assert callback.session.steps_ended == 3
    assert not torch.autograd._profiler_enabled()
    assert not (callback.session.run_dir / "summary.json").exists()


def test_accelerate_loop_with_accumulation_counts_optimizer_steps(tmp_path):
    from accelerate import Accelerator

    import trainprof

    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, cpu=True)
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(samples(2 * ACCUMULATION * OPTIMIZER_STEPS), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    micro_batches = 0
    with OptimizerSteps() as optimizer_steps:
        with trainprof.session(log_dir=tmp_path, run_name="acc", **SCHEDULE, **QUIET) as sess:
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
                    accelerator.backward(loss)
                    optimizer.step()  # accelerate's wrapper: a real step only every 2nd micro-batch
                    optimizer.zero_grad()
                micro_batches += 1

    assert micro_batches == ACCUMULATION * OPTIMIZER_STEPS
    assert_profiled_optimizer_steps(sess, optimizer_steps.count)
