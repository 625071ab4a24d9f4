"""A few steps of a small loop under trainprof.session, for Nsight tools to check its NVTX ranges.

The session pushes `trainprof wait|warmup|record` ranges holding `trainprof step N`. Run it under
Nsight Compute with an NVTX filter; kernels are profiled only if the ranges exist:

    ncu --nvtx --nvtx-include "trainprof record/" --launch-count 3 python -m benchmarks.nvtx_check
"""

from __future__ import annotations

import tempfile

import torch

import trainprof


def main() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with trainprof.session(
        log_dir=tempfile.mkdtemp(),
        wait=1,
        warmup=1,
        active=2,
        analyze=False,
        console=False,
        tensorboard_scalars=False,
    ) as sess:
        for _ in range(6):
            x = torch.randn(64, 256, device="cuda")
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    print(f"steps ended: {sess.steps_ended}; failure: {getattr(sess, '_failure', None)}")


if __name__ == "__main__":
    main()
