"""FSDP2 (`fully_shard`) with no trainprof in it, for `trainprof run` under torchrun.

    torchrun --nproc_per_node=2 -m trainprof run --log-dir log examples/fsdp2_train.py --steps 8
    trainprof analyze log/run-torchrun-<id>

Each block of a small MLP stack is its own FSDP unit, then the root: the all-gather of the next
block's parameters overlaps the current block's compute, and each block's reduce-scatter overlaps
the backward of the blocks before it. NCCL on GPUs (one per rank), gloo on a CPU. Planted
problems, one flag each:

    --accumulate 2     two micro-batches per step, reduce-scattering gradients after each
                       (add --no-sync for the fix: `set_requires_gradient_sync(False)` on all but the last)
    --one-unit         one FSDP unit for the whole model: everything is gathered before the first
                       layer and reduced after the last, with no compute to hide behind
    --keep-gathered    `reshard_after_forward=False`: no all-gather in backward, more memory
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-sync", action="store_true", help="reduce-scatter on the last micro-batch only")
    parser.add_argument("--one-unit", action="store_true", help="fully_shard the root only")
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    width = args.width

    def block() -> torch.nn.Module:
        up, down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        return torch.nn.Sequential(up, torch.nn.GELU(), down)

    blocks = [block() for _ in range(args.blocks)]
    model = torch.nn.Sequential(*blocks).to(device)
    reshard = not args.keep_gathered
    if not args.one_unit:
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        for micro in range(args.accumulate):
            last = micro == args.accumulate - 1
            if args.no_sync:
                model.set_requires_gradient_sync(last)
            x = torch.randn(32, width, generator=generator).to(device, non_blocking=True)
            loss = (model(x) - x).pow(2).mean() / args.accumulate
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
