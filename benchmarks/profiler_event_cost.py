"""What does torch.profiler add to the host per recorded event? (CPU or GPU; the figures behind
`trainprof.analysis.profiler_overhead`.)

    python -m benchmarks.profiler_event_cost [--out FILE.json] [--repeat 5]

Two loops, each timed bare and inside an always-recording `torch.profiler.profile` per option set
(stacks, shapes, memory), the profiler started before and its export left out of the timing:

- `ops`: `OPS` small tensor ops a round (on the GPU where there is one: each also a kernel launch),
  in one Python function: the added time per recorded op;
- `python`: a chain of `DEPTH` pure-Python calls a round, no op: the added time per Python call
  (`with_stack` records each one).

Each figure is the median over `--repeat` alternating bare/profiled pairs of (profiled - bare) /
events, in µs; the spread is the min and max of the pairs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

OPS = 4
DEPTH = 8
ROUNDS = 2000
OPTIONS = {
    "none": {},
    "shapes": {"record_shapes": True},
    "shapes+memory": {"record_shapes": True, "profile_memory": True},
    "stack+shapes+memory": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}


def _ops_loop(x: torch.Tensor) -> None:
    for _ in range(ROUNDS):
        x.add_(1.0)
        x.mul_(0.5)
        y = x + 1.0
        x.copy_(y)


def _chain(depth: int) -> int:
    return 0 if depth == 0 else 1 + _chain(depth - 1)


def _python_loop(_: torch.Tensor) -> None:
    for _ in range(ROUNDS):
        _chain(DEPTH)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(loop, x: torch.Tensor, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    loop(x)
    _sync(device)
    return time.perf_counter() - start


def measure(device: torch.device, repeat: int) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    x = torch.zeros(64, device=device)
    rows = {}
    loops = (("ops", _ops_loop, ROUNDS * OPS), ("python", _python_loop, ROUNDS * (DEPTH + 1)))
    for loop_name, loop, events in loops:
        _timed(loop, x, device)  # warm-up
        for option, kwargs in OPTIONS.items():
            added = []
            for _ in range(repeat):
                bare = _timed(loop, x, device)
                with torch.profiler.profile(activities=activities, **kwargs):
                    profiled = _timed(loop, x, device)
                added.append((profiled - bare) / events * 1e6)
            rows[f"{loop_name}/{option}"] = {
                "us_per_event": round(statistics.median(added), 3),
                "min": round(min(added), 3),
                "max": round(max(added), 3),
                "events": events,
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "rows": measure(device, args.repeat),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
