"""A 4-rank gloo job on the CPU for tests/test_distributed.py: three sessions in one process group.

    python tests/distributed_job.py OUT [WORLD]

1. `ddp`: DistributedDataParallel on a tiny MLP; the last rank sleeps before each step (a straggler).
2. `fsdp`: FSDP2 (`fully_shard` per layer and at the root), two micro-batches per step and no
   `set_requires_gradient_sync(False)` (gradients synced on every micro-batch).
3. `fail`: rank 2's loop raises; the others finish, and rank 0 reports without it.

Each rank writes `OUT/result.rank<R>.json`: per session its verdict, whether it holds the cross-rank
report, and the seconds its session took to exit (analysis, gather).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainprof

STEPS = 5  # wait 1, warmup 1, active 2, and one to end the window
OPTIONS = {"wait": 1, "warmup": 1, "active": 2, "with_stack": False, "profile_memory": False,
           "capture_syncs": False, "tensorboard_scalars": False, "console": False, "gather_timeout_s": 60}


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))


def _timed_exit(name: str, out: Path, loop) -> dict:
    session = trainprof.session(out, run_name=name, **OPTIONS)
    session.start()
    raised = False
    try:
        loop()
    except RuntimeError as error:
        if "planted" not in str(error):
            raise
        raised = True
    start = time.perf_counter()
    session.stop(user_error=raised)
    return {"verdict": session.summary.verdict, "cross_rank": session.cross_rank is not None,
            "exit_s": round(time.perf_counter() - start, 3)}


def worker(rank: int, world: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    out_dir = Path(out)
    results = {}

    ddp = torch.nn.parallel.DistributedDataParallel(_mlp(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def ddp_loop() -> None:
        for _ in range(STEPS):
            if rank == world - 1:
                time.sleep(0.03)  # PLANT: the straggler's slow input
            ddp(torch.randn(16, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    results["ddp"] = _timed_exit("ddp", out_dir, ddp_loop)

    from torch.distributed.fsdp import fully_shard

    sharded = _mlp()
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    fsdp_opt = torch.optim.SGD(sharded.parameters(), lr=0.01)

    def fsdp_loop() -> None:
        for _ in range(STEPS):
            for _micro in range(2):  # PLANT: no set_requires_gradient_sync(False) on the first
                sharded(torch.randn(16, 64)).pow(2).mean().backward()
            fsdp_opt.step()
            fsdp_opt.zero_grad()

    results["fsdp"] = _timed_exit("fsdp", out_dir, fsdp_loop)

    plain = _mlp()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)

    def failing_loop() -> None:
        for step in range(STEPS):
            if rank == 2 and step == 3:
                raise RuntimeError("planted failure inside the loop")
            plain(torch.randn(16, 64)).sum().backward()
            plain_opt.step()
            plain_opt.zero_grad()

    results["fail"] = _timed_exit("fail", out_dir, failing_loop)
    (out_dir / f"result.rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    out = sys.argv[1]
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 29571
    mp.spawn(worker, args=(world, out, port), nprocs=world)


if __name__ == "__main__":
    main()
