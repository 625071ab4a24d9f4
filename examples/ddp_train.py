"""A plain DistributedDataParallel script with no trainprof in it, for `trainprof run` under torchrun.

    torchrun --nproc_per_node=2 -m trainprof run --log-dir log examples/ddp_train.py --steps 12
    trainprof analyze log/run-torchrun-<id>      # one trace per rank: the rank table and any straggler

NCCL on GPUs (one per rank), gloo on a CPU. Each step logs the loss with `.item()` on rank 0 only,
so rank 0 has a sync each step that rank 1 lacks.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(64, 1024, generator=generator).to(device, non_blocking=True)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
