"""The one GPU timer the benchmarks share: calls queued back to back between CUDA events.

In a training step the GPU runs behind the host, so per-call time is the GPU's throughput, not the
host's latency per call. ``triton.testing.do_bench`` flushes L2 before every call instead, so the GPU
waits for the host to launch each one: with several launches and autograd per forward+backward, that
host gap moved H200 timings of every contender by up to 40% between runs (2026-11-21). Inputs should
be several times the 50-60 MB L2, so that back-to-back calls do not run from cache.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def steady_ms(call: Callable[[], object], target_ms: float = 25.0, batches: int = 7) -> float:
    """Median milliseconds per call over ``batches`` batches of about ``target_ms`` each, after warm-up."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    iters = max(5, int(target_ms / max(start.elapsed_time(end), 1e-3)))
    per_call = []
    for _ in range(batches):
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    return statistics.median(per_call)
