"""Where does a LayerNorm / RMSNorm forward+backward spend its time? (GPU; a diagnosis.)

Profiles a few back-to-back forward+backward calls of each contender at one shape with
torch.profiler, then reads the trace with trainprof's own analysis: GPU busy %, host time per
call, and each kernel's mean duration, so host-bound calls are told apart from slow kernels.

    python -m benchmarks.profile_norm_step [--tokens 131072] [--width 1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import trainprof
from fused_layers.ops import layer_norm, rms_norm


def contenders() -> dict:
    def eager_rms(x, w, b):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return w * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)

    found = {
        "layer_norm/eager": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        "layer_norm/triton": lambda x, w, b: layer_norm(x, w, b, 1e-5, backend="triton"),
        "layer_norm/cuda": lambda x, w, b: layer_norm(x, w, b, 1e-5, backend="cuda"),
        "rms_norm/eager": eager_rms,
        "rms_norm/triton": lambda x, w, b: rms_norm(x, w, 1e-6, backend="triton"),
    }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_norm_step.py needs a CUDA device")
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
    x, w, b = make(args.tokens, args.width), make(args.width), make(args.width)
    dy = torch.randn(args.tokens, args.width, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name, fn in contenders().items():
        def call(fn=fn):
            for leaf in (x, w, b):
                leaf.grad = None
            fn(x, w, b).backward(dy)

        for _ in range(5):
            call()
        torch.cuda.synchronize()
        host_start = time.perf_counter()
        for _ in range(args.calls):
            call()
        host_ms = (time.perf_counter() - host_start) * 1e3 / args.calls
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - host_start) * 1e3 / args.calls
        folder = Path(tempfile.mkdtemp())
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder), worker_name="w"),
        ):
            for _ in range(args.calls):
                call()
            torch.cuda.synchronize()
        analysis = trainprof.analyze(str(folder)).to_dict()
        steps = analysis["steps"]
        kernels = next((f for f in analysis["findings"] if f["kind"] == "top_kernels"), {})
        per_kernel = [
            {"kernel": k.get("name", "")[:60], "calls": k.get("count"), "mean_us": k.get("mean_us")}
            for k in (kernels.get("details") or {}).get("kernels", [])[:6]
        ]
        results[name] = {"host_ms_per_call": host_ms, "wall_ms_per_call": wall_ms,
                         "gpu_busy_pct": steps[0]["gpu_busy_pct"] if steps else None,
                         "kernels": per_kernel}
        print(f"{name:18s} host {host_ms:6.3f} ms/call  wall {wall_ms:6.3f} ms/call  "
              f"gpu busy {results[name]['gpu_busy_pct']}%")
        for k in per_kernel:
            print(f"    {k['calls']!s:>4} x {k['mean_us']!s:>8} us  {k['kernel']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "profile_norm_step.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
