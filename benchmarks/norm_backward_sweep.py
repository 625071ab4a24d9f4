"""Which launch settings make the Triton LayerNorm/RMSNorm backward kernels fastest? (GPU.)

Times the backward launchers alone (dx plus the dweight/dbias partial sums and their reduction),
bf16, at the benchmark's four shapes, over a grid of the settings in ``fused_layers.ops._launch``
(patched per run), and prints TB/s over the fewest bytes (read x and dy, write dx) with the
registers and spills Triton reports for each compiled kernel.

    python benchmarks/norm_backward_sweep.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

if __name__ == "__main__" and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import importlib  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))
from timing import steady_ms  # noqa: E402

# fused_layers.ops re-exports functions named like their modules: fetch the modules themselves.
_launch = importlib.import_module("fused_layers.ops._launch")
ln = importlib.import_module("fused_layers.ops.layer_norm")
rms = importlib.import_module("fused_layers.ops.rms_norm")

SHAPES = [(131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384)]
RESIDENT_WARPS = (8, 16, 32, 64)
PER_THREAD = (8, 16, 32)
TILES = (4096, 8192)


def compiled_resources(jit_function) -> list[dict]:
    """(num_warps, registers, spills) of every compiled variant of a Triton kernel, where exposed."""
    found = []
    for caches in getattr(jit_function, "device_caches", {}).values():
        for kernel in caches[0].values():
            try:
                found.append({"warps": kernel.metadata.num_warps, "regs": kernel.n_regs,
                              "spills": kernel.n_spills})
            except AttributeError:
                pass
    return found


def copy_tbps() -> float:
    """Bytes/s (read + write) of a 2 GiB device-to-device copy, timed as the kernels are."""
    source = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    target = torch.empty_like(source)
    return 4 * source.numel() / (steady_ms(lambda: target.copy_(source)) * 1e-3) / 1e12


def sweep_shape(tokens: int, width: int) -> list[dict]:
    """Every setting of the grid at one shape, both ops."""
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    _, mean, rstd = ln._layer_norm_forward(x, w, b, 1e-5)
    _, rms_rstd = rms._rms_norm_forward(x, w, 1e-6)
    calls = {
        "layer_norm": lambda: ln._layer_norm_backward(x, dy, w, mean, rstd, True, True),
        "rms_norm": lambda: rms._rms_norm_backward(x, dy, w, rms_rstd, True),
    }
    nbytes = 3 * x.numel() * 2
    rows = []
    for resident, per_thread, tile in itertools.product(RESIDENT_WARPS, PER_THREAD, TILES):
        _launch.RESIDENT_WARPS_PER_SM = resident
        _launch.BWD_ELEMENTS_PER_THREAD = per_thread
        _launch.BWD_TILE_ELEMENTS = tile
        for op, call in calls.items():
            ms = steady_ms(call)
            rows.append({"op": op, "shape": [tokens, width], "resident_warps": resident,
                         "per_thread": per_thread, "tile": tile, "ms": ms,
                         "tbps": nbytes / (ms * 1e-3) / 1e12})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("norm_backward_sweep.py needs a CUDA device (it times with CUDA events)")
    defaults = (_launch.RESIDENT_WARPS_PER_SM, _launch.BWD_ELEMENTS_PER_THREAD, _launch.BWD_TILE_ELEMENTS)
    copy = copy_tbps()
    torch.cuda.empty_cache()
    rows = []
    for tokens, width in SHAPES:
        rows += sweep_shape(tokens, width)
        torch.cuda.empty_cache()
    _launch.RESIDENT_WARPS_PER_SM, _launch.BWD_ELEMENTS_PER_THREAD, _launch.BWD_TILE_ELEMENTS = defaults
    resources = {"layer_norm": compiled_resources(ln._layer_norm_bwd_fused),
                 "rms_norm": compiled_resources(rms._rms_norm_bwd_fused)}
    result = {"device": torch.cuda.get_device_name(), "copy_tbps": copy, "defaults": defaults,
              "rows": rows, "resources": resources}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"copy {copy:.2f} TB/s; backward TB/s (3 bytes-units: read x, dy; write dx)")
    for op in ("layer_norm", "rms_norm"):
        for tokens, width in SHAPES:
            mine = [r for r in rows if r["op"] == op and r["shape"] == [tokens, width]]
            best = max(mine, key=lambda r: r["tbps"])
            default = next(r for r in mine if (r["resident_warps"], r["per_thread"], r["tile"]) == defaults)
            print(f"{op:10s} {tokens}x{width}: default {default['tbps']:.2f}  best {best['tbps']:.2f} "
                  f"(resident {best['resident_warps']}, per_thread {best['per_thread']}, "
                  f"tile {best['tile']})")
    for op, found in resources.items():
        print(op, "compiled:", sorted({(r["warps"], r["regs"], r["spills"]) for r in found}))


if __name__ == "__main__":
    main()
