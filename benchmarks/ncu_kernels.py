"""Run each fused kernel a few times at one benchmark shape, for Nsight Compute to read. (GPU.)

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --launch-skip 3 --launch-count 1 -k regex:NAME python -m benchmarks.ncu_kernels CASE

CASE is one of: gelu_triton, gelu_cuda, ln_triton_1024, ln_cuda_1024, ln_triton_16384,
ln_cuda_16384 (forward and backward of each run five times, bf16).
"""

from __future__ import annotations

import sys

import torch

from fused_layers.ops import gelu, layer_norm


def main(case: str) -> None:
    op, backend, *width = case.split("_")
    width = int(width[0]) if width else 8192
    tokens = (131072 * 1024) // width
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
    x = make(tokens, width)
    dy = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    if op == "gelu":
        call = lambda: gelu(x, "tanh", backend=backend).backward(dy)
    else:
        w, b = make(width), make(width)
        call = lambda: layer_norm(x, w, b, 1e-5, backend=backend).backward(dy)
    for _ in range(5):
        x.grad = None
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
