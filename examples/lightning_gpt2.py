"""GPT-2 under Lightning's `Trainer`, profiled by trainprof's callback.

    python examples/lightning_gpt2.py            # self.log(..., prog_bar=True) every step
    python examples/lightning_gpt2.py --fixed    # the same with the trainprof catalog's fixes
    torchrun --nproc_per_node=2 examples/lightning_gpt2.py   # DDP: one GPU per rank (gloo on a CPU)

The plain run logs the loss with `self.log("train_loss", loss, prog_bar=True)`, as Lightning's
examples do: the progress bar reads it with `.item()` after every batch. `--fixed` logs it with
`on_step=False, on_epoch=True` (an epoch aggregate, no per-batch read), raises `log_every_n_steps`
past the run, and pins the DataLoader's memory (Lightning already copies with `non_blocking`).
Gradient accumulation 2, bf16-mixed on a GPU. It prints where trainprof's summary went and each
sync it found.
"""

from __future__ import annotations

import os

import torch
from _gpt2 import ACCUMULATION, SCHEDULE, gpt2, parser, print_outcome, token_samples

from trainprof.integrations.lightning import TrainprofCallback

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class LitGPT2(pl.LightningModule):
    def __init__(self, small: bool, fixed: bool) -> None:
        super().__init__()
        self.model = gpt2(small)
        self.fixed = fixed

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        if self.fixed:
            self.log("train_loss", loss, on_step=False, on_epoch=True, prog_bar=True)
        else:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    cuda = torch.cuda.is_available()
    module = LitGPT2(args.small, args.fixed)
    samples = token_samples(args, module.model.config.vocab_size)
    loader = torch.utils.data.DataLoader(samples, batch_size=args.batch_size, pin_memory=args.fixed and cuda)
    callback = TrainprofCallback(log_dir=args.log_dir, run_name=args.run_name, **SCHEDULE)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's ranks on this node
    trainer = pl.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=ACCUMULATION,
        accelerator="gpu" if cuda else "cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        precision="bf16-mixed" if cuda else "32-true",
        log_every_n_steps=10 * args.steps if args.fixed else 50,  # 50: Lightning's default
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=f"{args.log_dir}/lightning_out",
        callbacks=[callback],
    )
    trainer.fit(module, loader)
    print_outcome("lightning", args.fixed, callback.session)


if __name__ == "__main__":
    main()
