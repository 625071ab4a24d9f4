"""GPT-2 in a plain accelerate loop with gradient accumulation, inside `with trainprof.session():`.

    python examples/accelerate_loop.py            # pinned batches, accelerate's default copies
    python examples/accelerate_loop.py --fixed    # the same with non-blocking copies
    accelerate launch --multi_gpu --num_processes=2 examples/accelerate_loop.py   # DDP on two GPUs
    torchrun --nproc_per_node=2 examples/accelerate_loop.py                       # the same; gloo on a CPU

Steps are optimizer steps: accelerate's optimizer wrapper calls the real `optimizer.step()` only
on the last micro-batch of each accumulation, and trainprof counts the real ones. The plain run
pins the DataLoader's memory but keeps accelerate's default `non_blocking=False`, so every batch
copy waits for the GPU (`send_to_device`); `--fixed` sets
`DataLoaderConfiguration(non_blocking=True)`. bf16 on a GPU. It prints where trainprof's summary
went and each sync it found. On several processes accelerate wraps the model in DDP, and
`accelerator.accumulate` skips the gradient all-reduce on all but the last micro-batch (`no_sync`);
the ranks share one run folder and rank 0 writes the cross-rank report (`report.ranks.md`).
"""

from __future__ import annotations

import torch
from _gpt2 import ACCUMULATION, SCHEDULE, gpt2, parser, print_outcome, token_samples
from accelerate import Accelerator, DataLoaderConfiguration

import trainprof


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(
        gradient_accumulation_steps=ACCUMULATION,
        mixed_precision="bf16" if cuda else "no",
        cpu=not cuda,
        dataloader_config=DataLoaderConfiguration(non_blocking=args.fixed and cuda),
    )
    model = gpt2(args.small)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = token_samples(args, model.config.vocab_size)
    loader = torch.utils.data.DataLoader(samples, batch_size=args.batch_size, pin_memory=cuda)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    with trainprof.session(log_dir=args.log_dir, run_name=args.run_name, **SCHEDULE) as sess:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    print_outcome("accelerate", args.fixed, sess)


if __name__ == "__main__":
    main()
