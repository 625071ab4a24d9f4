"""A plain DistributedDataParallel script with no trainprof in it, for `trainprof run` under torchrun.

    torchrun --nproc_per_node=2 -m trainprof run --log-dir log examples/ddp_train.py --steps 12
    trainprof analyze log/run-torchrun-<id>      # one trace per rank: the rank table and any straggler

NCCL on GPUs (one per rank), gloo on a CPU. Each step logs the loss with `.item()` on rank 0 only,
so rank 0 has a sync each step that rank 1 lacks. Planted problems, one flag each:

    --accumulate 4        four micro-batches per optimizer step, all-reducing gradients after each
                          (add --no-sync for the fix: `model.no_sync()` on all but the last)
    --straggler-ms 40     the last rank sleeps before each step (a slow input pipeline)
    --bucket-cap-mb 1000  one gradient bucket: its all-reduce starts when backward ends (no overlap)
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-sync", action="store_true", help="skip the all-reduce on all but the last")
    parser.add_argument("--straggler-ms", type=float, default=0.0, help="the last rank sleeps this long")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size (default 25)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None,
                                    bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        if args.straggler_ms and rank == world - 1:
            time.sleep(args.straggler_ms / 1e3)
        for micro in range(args.accumulate):
            last = micro == args.accumulate - 1
            skip_sync = model.no_sync() if args.no_sync and not last else contextlib.nullcontext()
            with skip_sync:
                x = torch.randn(64, 1024, generator=generator).to(device, non_blocking=True)
                loss = (model(x) - x).pow(2).mean() / args.accumulate
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
