"""Which launch plans make the Triton LayerNorm/RMSNorm kernels fastest? (GPU.)

For each of the benchmark's four bf16 shapes, patches the settings of
``fused_layers.backends.triton.heuristics`` (each op's ``NormSettings``: tile, values per thread,
resident warps, pipelining stages; the width above which the looped kernels take over, their chunk
and warps), keeps each distinct launch plan once, and times the launcher alone: the forward, or the
backward with its partial sums and their reduction. Each time is a CUDA graph of
``--calls`` back-to-back calls replayed 5 times (median), so no host time is in it. TB/s is over
the fewest bytes: forward reads x and writes y, backward reads x and dy and writes dx.

    python -m benchmarks.norm_backward_sweep [--out FILE.json] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

# fused_layers' Triton backend modules themselves (the ops re-export functions named like them).
_launch = importlib.import_module("fused_layers.backends.triton.heuristics")
ln = importlib.import_module("fused_layers.backends.triton.layer_norm")
rms = importlib.import_module("fused_layers.backends.triton.rms_norm")

SHAPES = [(131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384)]
# Module-level settings a sweep may patch; every other key of a setting is a NormSettings field.
GLOBALS = (
    "TILE_ELEMENTS", "ELEMENTS_PER_THREAD", "MAX_FUSED_WIDTH", "MAX_FUSED_WIDTH_BWD", "LOOP_BLOCK",
    "LOOP_WARPS", "MAX_WARPS", "PIPELINED_MAX_WIDTH",
)  # fmt: skip


def backward_grid(width: int, quick: bool) -> list[dict]:
    """Backward settings worth timing at this width: register-held rows (with pipelining stages)."""
    tiles = (1024, 2048) if quick else (1024, 2048, 4096, 8192)
    per_thread = (8, 16) if quick else (4, 8, 16, 32)
    resident = (16, 32) if quick else (16, 32, 64)
    stages = (1, 2, 3)
    if width > 1024:  # tiles hold one row from here on: the tile size changes nothing
        tiles = tiles[:1]
    grid = [
        {"bwd_tile": t, "bwd_per_thread": p, "resident_warps": r, "bwd_stages": n}
        for t, p, r, n in itertools.product(tiles, per_thread, resident, stages)
    ]
    if width >= 16384:  # 32 warps: half the values per thread of a row too wide for 16
        grid += [
            {
                "MAX_WARPS": 32,
                "bwd_per_thread": 16,
                "bwd_stages": n,
                "PIPELINED_MAX_WIDTH": width,
                "resident_warps": r,
            }
            for n, r in itertools.product(stages, (32, 64))
        ]
    if width >= 4096 and not quick:
        grid += [
            {"MAX_FUSED_WIDTH_BWD": width // 2, "LOOP_BLOCK": b, "LOOP_WARPS": w, "resident_warps": r}
            for b, w, r in itertools.product((1024, 2048, 4096), (4, 8, 16), resident)
        ]
    return grid


def forward_grid(width: int, quick: bool) -> list[dict]:
    grid = [
        {"TILE_ELEMENTS": t, "ELEMENTS_PER_THREAD": p}
        for t, p in itertools.product((2048, 4096), (8, 16, 32))
    ]
    if width >= 16384:
        grid += [{"max_fused_width": width, "MAX_WARPS": 32, "ELEMENTS_PER_THREAD": p} for p in (8, 16)]
    if width >= 8192 and not quick:
        grid += [
            {"max_fused_width": width // 2, "LOOP_BLOCK": b, "LOOP_WARPS": w}
            for b, w in itertools.product((2048, 4096), (4, 8, 16))
        ]
    return grid


def graph_us(call, calls: int) -> float:
    """Median µs per call of ``calls`` calls captured in one CUDA graph (compiled before capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_tbps() -> float:
    """Bytes/s (read + write) of a 2 GiB device-to-device copy, timed the same way."""
    source = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    target = torch.empty_like(source)
    return 4 * source.numel() / (graph_us(lambda: target.copy_(source), 5) * 1e-6) / 1e12


def compiled_resources(jit_function) -> list[dict]:
    """(num_warps, registers, spills) of every compiled variant of a Triton kernel, where exposed."""
    found = []
    for caches in getattr(jit_function, "device_caches", {}).values():
        for kernel in caches[0].values():
            try:
                found.append(
                    {"warps": kernel.metadata.num_warps, "regs": kernel.n_regs, "spills": kernel.n_spills}
                )
            except AttributeError:
                pass
    return found


class Patched:
    """Set _launch settings (module-level, or op's NormSettings fields) for one timing; restore after."""

    def __init__(self, op: str, setting: dict) -> None:
        self.op, self.setting = op, setting
        self.saved = {name: getattr(_launch, name) for name in GLOBALS}, dict(_launch.SETTINGS)

    def __enter__(self) -> None:
        fields = {k: v for k, v in self.setting.items() if k not in GLOBALS}
        for name, value in self.setting.items():
            if name in GLOBALS:
                setattr(_launch, name, value)
        _launch.SETTINGS[self.op] = _launch.SETTINGS[self.op]._replace(**fields)
        _launch._plans.clear()

    def __exit__(self, *exc) -> None:
        for name, value in self.saved[0].items():
            setattr(_launch, name, value)
        _launch.SETTINGS.update(self.saved[1])
        _launch._plans.clear()


def sweep_shape(tokens: int, width: int, args: argparse.Namespace) -> list[dict]:
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    _, stats = ln._layer_norm_fwd(x, w, b, 1e-5)
    _, rstd = rms._rms_norm_fwd(x, w, 1e-6)
    passes = {
        ("layer_norm", "bwd"): lambda: ln._layer_norm_bwd(dy, x, w, stats, True, True),
        ("rms_norm", "bwd"): lambda: rms._rms_norm_bwd(dy, x, w, rstd, True),
        ("layer_norm", "fwd"): lambda: ln._layer_norm_fwd(x, w, b, 1e-5),
        ("rms_norm", "fwd"): lambda: rms._rms_norm_fwd(x, w, 1e-6),
    }
    rows = []
    for (op, which), call in passes.items():
        nbytes = (3 if which == "bwd" else 2) * x.numel() * 2
        grid = [{}] + (
            backward_grid(width, args.quick) if which == "bwd" else forward_grid(width, args.quick)
        )
        seen: dict[tuple, dict] = {}
        for setting in grid:
            with Patched(op, setting):
                plan = _launch.norm_plan(op, tokens, width, x.device, backward=which == "bwd")
                extra = (_launch.LOOP_WARPS,) if not plan.fused else ()
                key = (*plan, *extra)
                if key in seen:
                    if not setting:
                        seen[key]["default"] = True
                    continue
                try:
                    us = graph_us(call, args.calls)
                except Exception as exc:  # a plan that fails to compile or launch must not end the sweep
                    us, error = None, repr(exc)[:300]
                else:
                    error = None
            row = {
                "op": op,
                "pass": which,
                "shape": [tokens, width],
                "setting": setting,
                "plan": list(key),
                "default": not setting,
                "us": us,
                "error": error,
                "tbps": nbytes / (us * 1e-6) / 1e12 if us else None,
            }
            seen[key] = row
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("norm_backward_sweep.py needs a CUDA device (it times with CUDA graphs)")
    started = time.time()
    copy = copy_tbps()
    torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "copy_tbps": copy,
        "rows": [],
    }
    for tokens, width in SHAPES:
        result["rows"] += sweep_shape(tokens, width, args)
        torch.cuda.empty_cache()
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"{tokens}x{width} done at {time.time() - started:.0f} s", flush=True)
    result["resources"] = {
        name: compiled_resources(kernel)
        for name, kernel in (
            ("ln_bwd_fused", ln._layer_norm_bwd_fused),
            ("rms_bwd_fused", rms._rms_norm_bwd_fused),
            ("ln_bwd_looped", ln._layer_norm_bwd_looped),
            ("rms_bwd_looped", rms._rms_norm_bwd_looped),
        )
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"copy {copy:.2f} TB/s (read+write); TB/s over the fewest bytes, default vs best plan")
    for op, which in itertools.product(("layer_norm", "rms_norm"), ("fwd", "bwd")):
        for tokens, width in SHAPES:
            mine = [
                r
                for r in result["rows"]
                if r["op"] == op and r["pass"] == which and r["shape"] == [tokens, width] and r["tbps"]
            ]
            if not mine:
                continue
            best = max(mine, key=lambda r: r["tbps"])
            default = next((r for r in mine if r["default"]), None)
            print(
                f"{op:10s} {which} {tokens}x{width}: default {default['tbps'] if default else 0:.2f} "
                f"({default['us'] if default else 0:.1f} us)  best {best['tbps']:.2f} ({best['us']:.1f} us) "
                f"{best['setting']} plan {best['plan']}"
            )


if __name__ == "__main__":
    main()
