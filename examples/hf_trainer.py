"""GPT-2 under the Hugging Face `Trainer`, profiled by trainprof's callback.

    python examples/hf_trainer.py            # bf16, gradient accumulation 2, logging_steps=1
    python examples/hf_trainer.py --fixed    # the same with the trainprof catalog's fixes
    torchrun --nproc_per_node=2 examples/hf_trainer.py   # DDP: one GPU per rank (gloo on a CPU)

The plain run is the setup people start from (and issue #7's): bf16, `gradient_accumulation_steps=2`,
`logging_steps=1`, the default pinned DataLoader. `--fixed` applies the catalog's settings:
`logging_nan_inf_filter=False` (no `isnan(loss) or isinf(loss)` per micro-batch), a `logging_steps`
larger than the run (no `.item()` of loss and grad-norm per step), and pinned batches copied with
`non_blocking` (accelerate's `send_to_device`). It prints where trainprof's summary went and each
sync it found. Under torchrun the ranks share one run folder, and rank 0 writes the cross-rank
report (`report.ranks.md`) from every rank's summary.
"""

from __future__ import annotations

import torch
from _gpt2 import ACCUMULATION, SCHEDULE, gpt2, parser, print_outcome, token_samples
from transformers import Trainer, TrainingArguments

from trainprof.integrations.hf import TrainprofCallback


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    cuda = torch.cuda.is_available()
    model = gpt2(args.small)
    samples = token_samples(args, model.config.vocab_size)
    callback = TrainprofCallback(log_dir=args.log_dir, run_name=args.run_name, **SCHEDULE)
    training = TrainingArguments(
        output_dir=f"{args.log_dir}/hf_trainer_out",
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=args.steps,
        bf16=cuda,
        use_cpu=not cuda,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=cuda,  # the Trainer's default on a GPU
        # The catalog's fixes (trainprof/catalog/sync_sites.json):
        logging_steps=10 * args.steps if args.fixed else 1,
        logging_nan_inf_filter=not args.fixed,
        accelerator_config={"non_blocking": args.fixed and cuda},
    )
    trainer = Trainer(model=model, args=training, train_dataset=samples, callbacks=[callback])
    trainer.train()
    print_outcome("hf_trainer", args.fixed, callback.session)


if __name__ == "__main__":
    main()
