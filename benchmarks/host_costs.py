"""What does each piece of a fused norm's eager call cost on the host? (GPU; a diagnosis.)

Times host µs per call (no sync inside the loop; shapes small enough that the GPU keeps up) of
eager torch, the fused ops' public functions, their autograd.Functions and launchers, and
building blocks (a do-nothing autograd.Function, torch.empty), then shows a cProfile of the
forward's Python. The backward's Python runs on autograd's device thread, which cProfile does
not see: its launcher is profiled by a direct call instead.

    python -m benchmarks.host_costs [--width 1024] [--rows 8] [--out FILE.json]
    python -m benchmarks.host_costs --phases 32768x4096,8192x16384 [--out FILE.json]

``--phases`` splits one LayerNorm forward+backward at full-size shapes into its host phases
(clearing the grads, the forward call, the backward call) for eager torch, the CUDA extension's
autograd node called directly, and ``fused_layers.ops.layer_norm`` (``backend="cuda"`` and the
default), side by side with ``trainprof.bench.host_times``: rounds in rotated order, each sample
starting on a GPU kept busy by a spin kernel; medians of the rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ln = importlib.import_module("fused_layers.ops.layer_norm")
rms = importlib.import_module("fused_layers.ops.rms_norm")
ln_triton = importlib.import_module("fused_layers.backends.triton.layer_norm")
rms_triton = importlib.import_module("fused_layers.backends.triton.rms_norm")


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def host_us(call, calls: int = 300, repeats: int = 7) -> float:
    """Best-of-repeats host µs per call (noise only adds), GPU drained between repeats."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return best * 1e6


def phases(rows: int, width: int, rounds: int = 60, calls: int = 5, busy_ms: float = 10.0) -> dict:
    """Median host µs per call of each phase (``clear``, ``fwd``, ``bwd``, and the sample's ``total``).

    The samples are ``trainprof.bench.host_times``' (rounds in rotated order, each on a busy GPU);
    each call also records its phases, and a sample's phase figure is the mean over its calls.
    """
    from fused_layers.backends.cuda.build import load_extension
    from trainprof.bench import host_times

    ext = load_extension()
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
    x, w, b = make(rows, width), make(width), make(width)
    dy = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    forwards = {
        "eager": lambda: F.layer_norm(x, (width,), w, b, 1e-5),
        "extension node": lambda: ext.norm_autograd(x, w, b, 1e-5, False),
        "ops cuda": lambda: ln.layer_norm(x, w, b, 1e-5, backend="cuda"),
        "ops default": lambda: ln.layer_norm(x, w, b, 1e-5),
    }
    names = ("clear", "fwd", "bwd")
    per_call = {name: {phase: [] for phase in names} for name in forwards}  # µs, warm-up calls first

    def timed(name: str, forward) -> Callable[[], None]:
        def call() -> None:
            t0 = time.perf_counter()
            x.grad = w.grad = b.grad = None
            t1 = time.perf_counter()
            y = forward()
            t2 = time.perf_counter()
            y.backward(dy)
            t3 = time.perf_counter()
            for phase, seconds in zip(names, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                per_call[name][phase].append(seconds * 1e6)

        return call

    warmup = 3
    totals = host_times(
        {name: timed(name, forward) for name, forward in forwards.items()},
        device="cuda", warmup=warmup, rounds=rounds, calls_per_sample=calls, busy_gpu_ms=busy_ms,
    )  # fmt: skip

    def sample_means(values: list[float]) -> list[float]:  # one figure per sample, in round order
        return [statistics.fmean(values[i : i + calls]) for i in range(warmup, len(values), calls)]

    return {
        name: {phase: round(statistics.median(sample_means(values)), 1) for phase, values in by_phase.items()}
        | {"total": round(totals[name].median_us, 1)}
        for name, by_phase in per_call.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--phases", help="comma-separated ROWSxWIDTH shapes: split a forward+backward")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.phases:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.phases.split(",")]
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        result = {"device": torch.cuda.get_device_name(), "date": date}
        for rows, width in shapes:
            result[f"{rows}x{width}"] = split = phases(rows, width)
            for name, by_phase in split.items():
                print(f"{rows}x{width} {name:15s} " + "  ".join(f"{k} {v:6.1f}" for k, v in by_phase.items()))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
    x, w, b = make(args.rows, args.width), make(args.width), make(args.width)
    dy = torch.randn(args.rows, args.width, device="cuda", dtype=torch.bfloat16)

    def fwd_bwd(fn):
        def call():
            x.grad = w.grad = b.grad = None
            fn().backward(dy)

        return call

    def hf_rms():
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return w * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)

    y, stats = ln_triton._layer_norm_fwd(x.detach(), w.detach(), b.detach(), 1e-5)
    _, rstd = rms_triton._rms_norm_fwd(x.detach(), w.detach(), 1e-6)
    cases = {
        "torch.empty": lambda: torch.empty(args.width, device="cuda"),
        "noop Function fwd+bwd": fwd_bwd(lambda: _Noop.apply(x)),
        "F.layer_norm fwd+bwd": fwd_bwd(lambda: F.layer_norm(x, (args.width,), w, b, 1e-5)),
        "F.layer_norm fwd (grad on)": lambda: F.layer_norm(x, (args.width,), w, b, 1e-5),
        "layer_norm triton fwd+bwd": fwd_bwd(lambda: ln.layer_norm(x, w, b, 1e-5, backend="triton")),
        "layer_norm triton fwd (grad on)": lambda: ln.layer_norm(x, w, b, 1e-5, backend="triton"),
        "LayerNormFunction.apply fwd+bwd": fwd_bwd(
            lambda: ln_triton.LayerNormFunction.apply(x, w, b, 1e-5)[0]
        ),
        "_layer_norm_fwd launcher": lambda: ln_triton._layer_norm_fwd(
            x.detach(), w.detach(), b.detach(), 1e-5
        ),
        "_layer_norm_bwd launcher": lambda: ln_triton._layer_norm_bwd(
            dy, x.detach(), w.detach(), stats, True, True
        ),
        "layer_norm cuda fwd+bwd": fwd_bwd(lambda: ln.layer_norm(x, w, b, 1e-5, backend="cuda")),
        "HF LlamaRMSNorm fwd+bwd": fwd_bwd(hf_rms),
        "rms_norm triton fwd+bwd": fwd_bwd(lambda: rms.rms_norm(x, w, 1e-6, backend="triton")),
        "_rms_norm_fwd launcher": lambda: rms_triton._rms_norm_fwd(x.detach(), w.detach(), 1e-6),
        "_rms_norm_bwd launcher": lambda: rms_triton._rms_norm_bwd(dy, x.detach(), w.detach(), rstd, True),
    }
    results = {}
    for name, call in cases.items():
        try:
            results[name] = round(host_us(call), 1)
        except Exception as exc:  # one case failing must not end the probe
            results[name] = repr(exc)[:200]
        print(f"{name:34s} {results[name]} us", flush=True)
    profiles = {}
    for name in ("layer_norm triton fwd (grad on)", "_layer_norm_bwd launcher"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(500):
            cases[name]()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
        profiles[name] = text.getvalue()
        print(f"--- cProfile, 500 calls: {name}\n{text.getvalue()[-3500:]}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(),
                    "shape": [args.rows, args.width],
                    "host_us": results,
                    "profiles": profiles,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
