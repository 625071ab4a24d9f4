"""A gloo job on the CPU for tests/test_stragglers.py: ranks with the same work, and planted stragglers.

    python tests/rank_skew_job.py OUT WORLD PORT

In one process group, one session per case (un-profiled steps after the window, so that each rank
times when it reaches its first forward without the profiler):

- `equal`: every rank the same work (stacks, shapes and memory recorded, the session's defaults);
- `slowed`: the same work, and the last rank's host made slower only while the profiler records:
  every ATen op busy-waits `SLOW_US` (a `TorchDispatchMode` that checks the profiler), as the
  profiler's own cost per op would; recorded without stacks, as the profiler's cost goes unnamed;
- `sleep`: the last rank sleeps `SLEEP_MS` in its input function (`load_batch`) every step;
- `work`: the last rank's batch is `WORK_FACTOR` times the others' (more work per step).

Then the `equal` and `slowed` loops again under a plain `torch.profiler` per rank (stacks and shapes on,
no session: no un-profiled steps), into `OUT/plain-<case>/`, as a user records traces.

Rank 0 prints its console report of `sleep` into `OUT/console.sleep.rank0.txt`. Each rank writes
`OUT/result.rank<R>.json`: per case the session's verdict and findings (kind,
severity, rank, title) as rank 0 merged them (its own report with the cross-rank one).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext, redirect_stdout
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

import trainprof

SLEEP_MS = 150.0
SLOW_US = 500.0
WORK_FACTOR = 6
STEPS = 10  # wait 1, warmup 1, active 2, then 6 un-profiled steps
SESSION = {"wait": 1, "warmup": 1, "active": 2, "capture_syncs": False, "tensorboard_scalars": False,
           "console": False, "gather_timeout_s": 120}
CASES = ("equal", "slowed", "sleep", "work")


class SlowWhileProfiled(TorchDispatchMode):
    """Busy-waits `SLOW_US` in every ATen op while the profiler records."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.autograd.profiler._is_profiler_enabled:
            until = time.perf_counter() + SLOW_US / 1e6
            while time.perf_counter() < until:
                pass
        return func(*args, **(kwargs or {}))


def _loop(case: str, rank: int, world: int, step_end=None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=2)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    last = rank == world - 1
    batch = 64 * (WORK_FACTOR if case == "work" and last else 1)

    def load_batch() -> torch.Tensor:
        if case == "sleep" and last:
            time.sleep(SLEEP_MS / 1e3)  # PLANT: a slow input pipeline on one rank
        return torch.randn(batch, 512)

    slow = SlowWhileProfiled() if case == "slowed" and last else None
    for _ in range(STEPS):
        if slow is not None:
            slow.__enter__()
        ddp(load_batch()).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if slow is not None:
            slow.__exit__(None, None, None)
        if step_end is not None:
            step_end()


def worker(rank: int, world: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out_dir = Path(out)
    results = {}
    for case in CASES:
        # rank 0 prints its console report of the sleep case (into a file): what a user reads live
        console = case == "sleep" and rank == 0
        options = dict(SESSION, with_stack=case != "slowed", console=console)
        with open(out_dir / f"console.{case}.rank{rank}.txt", "w") if console else nullcontext() as text, \
                redirect_stdout(text) if console else nullcontext():
            with trainprof.session(out_dir, run_name=case, **options) as session:
                _loop(case, rank, world)
        results[case] = {
            "verdict": session.summary.verdict,
            "findings": [
                {"kind": f.kind, "severity": f.severity, "rank": f.rank, "title": f.title}
                for f in session.findings
            ],
        }
    for case in ("equal", "slowed"):
        folder = out_dir / f"plain-{case}"
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
            record_shapes=True,
            with_stack=case != "slowed",
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder), worker_name=f"rank{rank}"),
        )
        with profiler:
            _loop(case, rank, world, step_end=profiler.step)
    (out_dir / f"result.rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    out, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(worker, args=(world, out, port), nprocs=world)


if __name__ == "__main__":
    main()
