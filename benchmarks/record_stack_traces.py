"""Record real torch.profiler traces of the training stacks people use, for trainprof's tests.

    python -m benchmarks.record_stack_traces OUT_DIR [--device cuda]

Runs a small GPT-2 (2 layers, d=256) for 6 optimizer steps under each of: Hugging Face `Trainer`
(bf16, gradient accumulation 2, logging_steps=1), Lightning (`self.log(..., prog_bar=True)`,
bf16-mixed) and an accelerate loop (gradient accumulation 2, pinned DataLoader). Each run is
recorded by a plain `torch.profiler` (schedule wait=1, warmup=1, active=2; shapes, memory, stack)
written with `tensorboard_trace_handler` into OUT_DIR/<stack>/, plus `truth.json`: every call site
that `torch.cuda.set_sync_debug_mode("warn")` flagged during the run, with its stack, so tests can
check trainprof's sync findings against what torch itself saw.

This script uses torch.profiler directly, not trainprof, so the traces do not depend on the code
under test.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from pathlib import Path

import torch

SCHEDULE = dict(wait=1, warmup=1, active=2, repeat=1)
STEPS = 6  # optimizer steps: 1 wait + 1 warmup + 2 active + 2 after the window


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8192, n_positions=256)
    return GPT2LMHeadModel(cfg)


def samples(n: int, seq: int = 256) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 8192, (seq,), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def make_profiler(folder: Path, worker: str):
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities,
        schedule=schedule(**SCHEDULE),
        on_trace_ready=tensorboard_trace_handler(str(folder), worker_name=worker, use_gzip=True),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    )


class SyncRecorder:
    """Collect every sync that torch's sync debug mode flags, with the Python stack at that moment."""

    def __init__(self) -> None:
        self.sites: list[dict] = []
        self._previous = None

    def __enter__(self):
        self._previous = warnings.showwarning
        recorder = self

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchronizing" in str(message):
                stack = traceback.extract_stack()[:-1]
                recorder.sites.append(
                    {
                        "file": filename,
                        "line": lineno,
                        "stack": [
                            {"file": f.filename, "line": f.lineno, "function": f.name} for f in stack[-14:]
                        ],
                    }
                )
            else:
                recorder._previous(message, category, filename, lineno, file, line)

        warnings.simplefilter("always")
        warnings.showwarning = show
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = self._previous
        return False


def run_hf(folder: Path, device: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    prof = make_profiler(folder, "hf_trainer")

    class ProfilerStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            prof.step()

    args = TrainingArguments(
        output_dir=str(folder / "hf_out"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_steps=STEPS,
        logging_steps=1,
        bf16=device == "cuda",
        use_cpu=device != "cuda",
        report_to="none",
        save_strategy="no",
        dataloader_pin_memory=device == "cuda",
        seed=0,
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=samples(8 * 2 * STEPS),
                      callbacks=[ProfilerStep()])
    with prof:
        trainer.train()


def run_lightning(folder: Path, device: str) -> None:
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    prof = make_profiler(folder, "lightning")

    class LitGPT2(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2()

        def training_step(self, batch, batch_idx):
            loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class ProfilerStep(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            prof.step()

    loader = torch.utils.data.DataLoader(samples(8 * STEPS), batch_size=8)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if device == "cuda" else "32-true",
        logger=False,
        enable_checkpointing=False,
        callbacks=[ProfilerStep()],
        default_root_dir=str(folder / "pl_out"),
    )
    with prof:
        trainer.fit(LitGPT2(), loader)


def run_accelerate(folder: Path, device: str) -> None:
    from accelerate import Accelerator

    prof = make_profiler(folder, "accelerate")
    accelerator = Accelerator(
        gradient_accumulation_steps=2, mixed_precision="bf16" if device == "cuda" else "no",
        cpu=device != "cuda",
    )
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(samples(8 * 2 * STEPS), batch_size=8, pin_memory=device == "cuda")
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with prof:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                prof.step()


RUNS = {"hf_trainer": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", default=",".join(RUNS))
    args = parser.parse_args(argv)
    failed = 0
    for name in args.only.split(","):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with SyncRecorder() as recorder:
                RUNS[name](folder, args.device)
        except Exception:  # one stack failing must not lose the others' traces
            failed += 1
            traceback.print_exc()
            continue
        versions = {}
        for package in ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning"):
            try:
                versions[package] = __import__(package).__version__
            except Exception:
                pass
        truth = {"stack": name, "schedule": SCHEDULE, "optimizer_steps": STEPS, "versions": versions,
                 "sync_debug_sites": recorder.sites}
        (folder / "truth.json").write_text(json.dumps(truth, indent=1))
        print(f"{name}: {len(recorder.sites)} syncs flagged, traces in {folder}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
