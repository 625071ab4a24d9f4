"""trainprof.ab on a GPU: the profiled step holds exactly one step's kernels. Skips without CUDA.

A GPU-bound step (a chain of large matmuls, queued without a sync) leaves kernels running when the
host moves on; the profiled window must not count the previous step's tail as its own.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from trainprof.ab import run  # noqa: E402

SIZE, CHAIN = 4096, 12


def _factory(variant):
    generator = torch.Generator(device="cuda").manual_seed(0)
    weights = [
        torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16, generator=generator) / SIZE**0.5
        for _ in range(CHAIN)
    ]
    x = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16, generator=generator)

    def step(i: int) -> torch.Tensor:
        y = x
        for w in weights:
            y = y @ w
        return y.float().square().mean()

    return step


def _kernels_of_one_step() -> int:
    step = _factory(None)
    step(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(1)
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for name in gpu if not name.startswith(("Memcpy", "Memset")))


def test_profiled_step_counts_its_own_kernels_only(tmp_path):
    result = run(_factory, ["bare", "fused"], steps=6, warmup=2, block=2, device="cuda", log_dir=tmp_path)
    summary = result.diffs["fused"]["a"]["summary"]
    expected = _kernels_of_one_step()
    assert expected >= CHAIN
    assert summary["kernels_per_step"] == expected  # twice as many when the warm-up step's tail counts
    assert result.diffs["fused"]["b"]["summary"]["kernels_per_step"] == expected
