"""Does each catalog fix remove its sync? The three training stacks, as usually written and with fixes.

    python benchmarks/sync_fixes.py OUT_DIR [--device cuda] [--only hf_trainer,lightning,accelerate]

Runs the small GPT-2 of `record_stack_traces.py` for 6 optimizer steps under each stack twice,
each time inside `trainprof.session` (wait=1, warmup=1, active=2, live sync capture on):

- `as_is`: the set-up recorded in tests/fixtures/stacks (HF Trainer logging_steps=1 with the
  default NaN/Inf filter and blocking copies; Lightning `self.log(..., prog_bar=True)` and an
  unpinned DataLoader; an accelerate loop with blocking copies);
- `fixed`: the same with the settings `trainprof/catalog/sync_sites.json` gives for each site
  (TrainingArguments(logging_nan_inf_filter=False, logging_steps=1000, accelerator_config=
  {"non_blocking": True}, dataloader_pin_memory=True, torch_compile=True); self.log(...,
  prog_bar=False) and DataLoader(pin_memory=True); DataLoaderConfiguration(non_blocking=True)).

Prints every sync finding (cause, via, where, count per step, catalog site, fix) of each run and
writes them to OUT_DIR/sync_fixes.json with, per stack, the catalog sites that `fixed` removed and
those it did not. Without a GPU nothing synchronizes, so every list is empty (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
from record_stack_traces import STEPS, samples, tiny_gpt2  # the same model and data as the fixtures

import trainprof


def run_hf(device: str, fixed: bool, out: Path) -> None:
    from transformers import Trainer, TrainingArguments

    extra = {}
    if fixed:
        extra = dict(
            logging_nan_inf_filter=False,
            logging_steps=1000,
            torch_compile=device == "cuda",
            accelerator_config={"non_blocking": True},
        )
    args = TrainingArguments(
        output_dir=str(out / "hf_out"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_steps=STEPS,
        logging_steps=extra.pop("logging_steps", 1),
        bf16=device == "cuda",
        use_cpu=device != "cuda",
        report_to="none",
        save_strategy="no",
        dataloader_pin_memory=device == "cuda",
        seed=0,
        **extra,
    )
    Trainer(model=tiny_gpt2(), args=args, train_dataset=samples(8 * 2 * STEPS)).train()


def run_lightning(device: str, fixed: bool, out: Path) -> None:
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    class LitGPT2(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2()

        def training_step(self, batch, batch_idx):
            loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.log("train_loss", loss, prog_bar=not fixed)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    loader = torch.utils.data.DataLoader(
        samples(8 * STEPS), batch_size=8, pin_memory=fixed and device == "cuda"
    )
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if device == "cuda" else "32-true",
        logger=False,
        enable_checkpointing=False,
        default_root_dir=str(out / "pl_out"),
    )
    trainer.fit(LitGPT2(), loader)


def run_accelerate(device: str, fixed: bool, out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(
        gradient_accumulation_steps=2,
        mixed_precision="bf16" if device == "cuda" else "no",
        cpu=device != "cuda",
        dataloader_config=DataLoaderConfiguration(non_blocking=fixed),
    )
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(samples(8 * 2 * STEPS), batch_size=8, pin_memory=device == "cuda")
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()


RUNS = {"hf_trainer": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}


def sync_rows(findings: list[dict]) -> list[dict]:
    rows = []
    for finding in findings:
        if finding.get("kind") != "sync_point":
            continue
        via = finding.get("via") or {}
        rows.append(
            {
                "cause": finding.get("cause"),
                "via": f"{via.get('library')} {via.get('file')}:{via.get('line')} {via.get('function')}"
                if via
                else None,
                "where": "{file}:{line} {function}".format(**finding["where"]),
                "per_step": finding.get("per_step"),
                "catalog_site": (finding.get("details") or {}).get("catalog_site"),
                "fix": finding.get("fix"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", default=",".join(RUNS))
    args = parser.parse_args(argv)
    results: dict[str, dict] = {}
    failed = 0
    for name in args.only.split(","):
        results[name] = {}
        for variant in ("as_is", "fixed"):
            folder = args.out / name / variant
            try:
                with trainprof.session(
                    log_dir=folder, run_name="run", wait=1, warmup=1, active=2, console=False
                ) as sess:
                    RUNS[name](args.device, variant == "fixed", folder)
            except Exception:  # one stack failing must not lose the others
                failed += 1
                traceback.print_exc()
                continue
            rows = sync_rows(sess.findings)
            results[name][variant] = {"steps_ended": sess.steps_ended, "syncs": rows}
            print(f"== {name} {variant}: {len(rows)} sync findings ({sess.steps_ended} steps)", flush=True)
            for row in rows:
                print(
                    f"  {row['per_step']}/step  {row['cause']}\n    via {row['via']}"
                    f"\n    where {row['where']}\n    catalog {row['catalog_site']}\n    fix {row['fix']}",
                    flush=True,
                )
        runs = results[name]
        if {"as_is", "fixed"} <= set(runs):
            before = {r["catalog_site"] for r in runs["as_is"]["syncs"]} - {None}
            after = {r["catalog_site"] for r in runs["fixed"]["syncs"]} - {None}
            runs["removed_by_fix"] = sorted(before - after)
            runs["still_there"] = sorted(before & after)
            print(
                f"   removed by the catalog fixes: {runs['removed_by_fix']};"
                f" still there: {runs['still_there']}"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sync_fixes.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
