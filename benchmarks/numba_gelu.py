"""How fast is the numba CUDA GELU beside the Triton one and torch's, forward and forward+backward?

    python -m benchmarks.numba_gelu --out DIR

Needs a CUDA device and numba. tanh GELU on (8192, 8192) inputs (128 MiB in fp16, 256 MiB in
fp32: several times the L2), fp16 and fp32 (numba has no bfloat16); calls queued back to back
between CUDA events (``benchmarks.timing.steady_ms``). Bytes: forward reads x and writes y,
backward reads x and dy and writes dx; reported as TB/s and as a fraction of a device-to-device
copy measured in the same run. The CUDA C++ GELU was dropped from fused_layers (2026-11-22: 3.41-3.65
TB/s against Triton's 3.75-4.15 in bf16); its figures are in BENCHMARKS.md. Writes DIR/numba_gelu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from benchmarks.timing import steady_ms
from fused_layers import gelu

SHAPE = (8192, 8192)
BACKENDS = ("numba", "triton", "torch")


def copy_tb_per_s(elements: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, TB/s."""
    src = torch.empty(elements, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = steady_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy = copy_tb_per_s()
    rows = []
    for dtype in (torch.float16, torch.float32):
        x = torch.randn(SHAPE, device="cuda", dtype=dtype).requires_grad_()
        dy = torch.randn(SHAPE, device="cuda", dtype=dtype)
        size = x.numel() * x.element_size()
        for backend in BACKENDS:
            def forward(backend: str = backend, x: torch.Tensor = x) -> torch.Tensor:
                return gelu(x.detach(), "tanh", backend=backend)

            def both(backend: str = backend, x: torch.Tensor = x, dy: torch.Tensor = dy) -> None:
                x.grad = None
                gelu(x, "tanh", backend=backend).backward(dy)

            reference = torch.nn.functional.gelu(x.detach().float(), approximate="tanh")
            error = (forward().float() - reference).abs().max().item()
            for passes, call, moved in (("forward", forward, 2 * size), ("forward+backward", both, 5 * size)):
                ms = steady_ms(call)
                tb = moved / (ms * 1e-3) / 1e12
                rows.append({"dtype": str(dtype).removeprefix("torch."), "backend": backend, "passes": passes,
                             "ms": round(ms, 4), "tb_per_s": round(tb, 3), "of_copy": round(tb / copy, 3),
                             "max_abs_error": error})  # fmt: skip
                print(f"{rows[-1]['dtype']:8s} {backend:7s} {passes:17s} {ms:7.3f} ms {tb:5.2f} TB/s "
                      f"({tb / copy:.0%} of copy) err {error:.1e}", flush=True)  # fmt: skip
    report = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "shape": list(SHAPE),
        "copy_tb_per_s": round(copy, 3),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "numba_gelu.json").write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
