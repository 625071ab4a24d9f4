"""How fast is the fused RoPE kernel itself, and which launch settings suit it?

A RoPE call moves little data (Llama-3.2-1B at B4 x T2048: 84 MB a pass, ~20 µs at H200 copy
speed), so back-to-back call timings measure the host's launch path; this script reads each
kernel's GPU time from the profiler instead, for forward and backward, as a fraction of copy
bandwidth over the fewest bytes (q and k read and written, cos/sin once per position), for
``MAX_TILE`` x ``ELEMENTS_PER_THREAD`` settings of fused_layers/backends/triton/rope.py, beside the GPU time
of Liger-Kernel's kernel and of the eager formula's kernels. Needs a CUDA device.

    python -m benchmarks.rope_sweep --out log/rope_sweep.json
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch

# (batch, seq, q heads, kv heads, head_dim), as in benchmarks/kernels.py
SHAPES = [(4, 2048, 32, 8, 64), (2, 4096, 32, 8, 128), (8, 1024, 16, 4, 64)]
SETTINGS = [(tile, per_thread) for tile in (128, 256, 512, 1024, 2048, 8192) for per_thread in (4, 8, 16)]
CALLS = 20


def _kernel_us(call, name_part: str) -> float:
    """Mean GPU µs per call of the kernels whose name contains ``name_part`` (all kernels if empty)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    total = sum(
        e.self_device_time_total
        for e in prof.key_averages()
        if name_part in e.key and e.self_device_time_total > 0
    )
    return total / CALLS


def _measure(shape: tuple[int, ...], copy_bps: float) -> dict:
    """Kernel µs and % of copy for every setting, Liger and eager, at one shape."""
    rope_module = importlib.import_module("fused_layers.backends.triton.rope")
    torch_rope = importlib.import_module("fused_layers.backends.torch.rope").rope
    batch, seq, q_heads, k_heads, head_dim = shape

    def heads(count: int) -> torch.Tensor:  # Hugging Face's layout: a projection, viewed and transposed
        x = torch.randn(batch, seq, count * head_dim, device="cuda", dtype=torch.bfloat16)
        return x.view(batch, seq, count, head_dim).transpose(1, 2)

    q, k = heads(q_heads), heads(k_heads)
    angles = torch.rand(1, seq, head_dim // 2, device="cuda")
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    one_pass = (2 * (q_heads + k_heads) + 2) * batch * seq * head_dim * 2

    def timed(fwd_us: float, bwd_us: float) -> dict:
        pct = lambda us: round(100 * one_pass / (us * 1e-6) / copy_bps, 1)  # noqa: E731
        return {
            "fwd_us": round(fwd_us, 2),
            "bwd_us": round(bwd_us, 2),
            "fwd_pct": pct(fwd_us),
            "bwd_pct": pct(bwd_us),
        }

    row = {"shape": list(shape), "min_bytes_per_pass": one_pass, "settings": []}
    saved = rope_module.MAX_TILE, rope_module.ELEMENTS_PER_THREAD
    try:
        for tile, per_thread in SETTINGS:
            rope_module.MAX_TILE, rope_module.ELEMENTS_PER_THREAD = tile, per_thread
            fwd = _kernel_us(lambda: rope_module._rope_fwd(q, k, cos, sin, 1), "_rope_kernel")
            bwd = _kernel_us(
                lambda: rope_module._rope_bwd(dq, dk, cos, sin, 1, torch.bfloat16), "_rope_kernel"
            )
            row["settings"].append({"max_tile": tile, "per_thread": per_thread, **timed(fwd, bwd)})
    finally:
        rope_module.MAX_TILE, rope_module.ELEMENTS_PER_THREAD = saved
    try:
        from liger_kernel.ops.rope import rope_backward, rope_forward

        # Liger works in place: fresh copies each call (the clones' kernels are not counted)
        fwd = _kernel_us(lambda: rope_forward(q.clone(), k.clone(), cos, sin), "_triton_rope")
        bwd = _kernel_us(lambda: rope_backward(dq.clone(), dk.clone(), cos, sin), "_triton_rope")
        row["liger"] = timed(fwd, bwd)
    except ImportError as exc:
        row["liger"] = {"error": repr(exc)}
    q_leaf, k_leaf = q.detach().requires_grad_(), k.detach().requires_grad_()

    def eager() -> None:
        torch.autograd.backward(torch_rope(q_leaf, k_leaf, cos, sin, 1), (dq, dk))

    row["eager_fwd_bwd_us"] = round(_kernel_us(eager, ""), 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="log/rope_sweep.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/rope_sweep.py needs a CUDA device")
    from trainprof.bench import measure_copy_bandwidth

    copy_bps = measure_copy_bandwidth("cuda")
    rows = [_measure(shape, copy_bps) for shape in SHAPES]
    result = {"device": torch.cuda.get_device_name(), "copy_tbps": copy_bps / 1e12, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"device: {result['device']}  copy: {result['copy_tbps']:.2f} TB/s; kernel µs and % of copy")
    for row in rows:
        print(row["shape"], "liger", row["liger"], "eager fwd+bwd µs (all kernels)", row["eager_fwd_bwd_us"])
        for setting in row["settings"]:
            print("   ", setting)


if __name__ == "__main__":
    main()
