"""How fast are fused_layers' ops against torch eager, the Hugging Face modules they replace,
torch.compile and Liger-Kernel, in bf16, forward and forward+backward?

Needs a CUDA device. Times with CUDA events over calls queued back to back (median of batches,
after warm-up; `_time` says why not ``do_bench``'s flushed single calls), and reports
ms and achieved bytes/s over the fewest bytes each op must move, as a fraction of a large
device-to-device copy measured in the same run. Writes ``OUT.json`` and ``OUT.md`` and prints a
compact table last.

    python -m benchmarks.kernels --out log/fused_layers_bench     # full run
    python -m benchmarks.kernels --quick --out /tmp/bench          # smoke run
    python -m benchmarks.kernels --launch --out log/norm_launch    # host vs kernel time

``--launch`` answers a narrower question for LayerNorm and RMSNorm forward+backward at the norm
shapes: per call, the back-to-back time, the host's time without a sync (``trainprof.bench.host_times``:
the contenders side by side, round by round),
and the GPU kernel time summed from the profiler, each kernel time also as a fraction of copy
bandwidth; for eager torch, ours with the direct launch, ours through Triton's own launcher
(``FUSED_LAYERS_DIRECT_LAUNCH=0`` behaviour) and the CUDA C++ versions. Bars: kernel time >= 85%
of copy, host time <= eager's. About a minute on an H200.

Bytes counted (bf16, 2 bytes an element, weights negligible): forward reads the inputs and
writes the output; backward reads the inputs and dy and writes each input's gradient; the
forward+backward figure is their sum. RoPE (shapes B x T x Hq x Hk x D, q and k as Hugging Face
makes them: a projection viewed and transposed, cos/sin shared by the batch): each pass reads q
and k (or their grads) and writes them once, and reads cos and sin once per (b, t) position; its
backward needs no saved q or k.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.timing import steady_ms

NORM_SHAPES = [(131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384)]
ELEMENTWISE_SHAPES = NORM_SHAPES + [(16384, 16384), (8192, 11008)]
QUICK_SHAPES = [(8192, 1024), (2048, 4096)]
# RoPE: (batch, seq, q heads, kv heads, head_dim): Llama-3.2-1B's heads, and Llama-3-8B's
ROPE_SHAPES = [(4, 2048, 32, 8, 64), (2, 4096, 32, 8, 128), (8, 1024, 16, 4, 64)]
QUICK_ROPE_SHAPES = [(2, 512, 32, 8, 64)]
OPS = ("layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "rope")
OTHERS = ("eager", "hf", "compile", "liger")  # what "ours" must not be slower than
FWD_BAR, FWDBWD_BAR = 0.90, 0.80  # fractions of copy bandwidth
EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6}


def _eager_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x_f32 = x.float()
    return w * (x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + EPS["rms_norm"])).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


def _eager_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _heads(op: str, shape: tuple[int, ...], fn: Callable) -> Callable:
    """For rope: ``fn(q, k, cos, sin)`` called on (B, T, H*D) projections viewed as (B, H, T, D)
    the way a Hugging Face attention does (the timed leaves are the projections); others: ``fn``."""
    if op != "rope":
        return fn
    batch, seq, _, _, head_dim = shape

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, seq, -1, head_dim).transpose(1, 2)

    return lambda q, k, cos, sin: fn(heads(q), heads(k), cos, sin)


def _eager(op: str) -> Callable:
    return {
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS["layer_norm"]),
        "rms_norm": _eager_rms_norm,
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "geglu": lambda a, b: F.gelu(a, approximate="tanh") * b,
        "swiglu": lambda a, b: F.silu(a) * b,
        "rope": _eager_rope,
    }[op]


def _hf(op: str, width: int, params: list[torch.Tensor]) -> tuple[Callable, list[torch.Tensor]]:
    """The Hugging Face module the op replaces, sharing our weights; returns (fn, its parameters)."""
    from transformers.activations import ACT2FN, NewGELUActivation

    if op == "rope":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        return apply_rotary_pos_emb, []

    if op == "layer_norm":
        module = torch.nn.LayerNorm(width, eps=EPS["layer_norm"]).to(params[0].device, torch.bfloat16)
        with torch.no_grad():
            module.weight.copy_(params[0])
            module.bias.copy_(params[1])
        return (lambda x, w, b: module(x)), list(module.parameters())
    if op == "rms_norm":
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        module = LlamaRMSNorm(width, eps=EPS["rms_norm"]).to(params[0].device, torch.bfloat16)
        with torch.no_grad():
            module.weight.copy_(params[0])
        return (lambda x, w: module(x)), list(module.parameters())
    if op == "gelu":
        module = NewGELUActivation()  # GPT-2's "gelu_new": the tanh formula in plain torch ops
        return module, []
    act = ACT2FN["gelu_pytorch_tanh" if op == "geglu" else "silu"]  # Gemma / Llama MLP gates
    return (lambda a, b: act(a) * b), []


def _liger(op: str) -> Callable | None:
    """Liger-Kernel 0.8.5's Function for the op, or None where it has none (plain GELU)."""
    if op == "layer_norm":
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS["layer_norm"])
    if op == "rms_norm":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        # offset 0, Llama casting; in_place=False so dy is not overwritten between timed runs
        return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS["rms_norm"], 0.0, "llama", False)
    if op == "geglu":
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        return LigerGELUMulFunction.apply
    if op == "swiglu":
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerSiLUMulFunction.apply
    if op == "rope":
        from liger_kernel.ops.rope import LigerRopeFunction

        # in place on q and k where they are (B, T, H, D)-contiguous, as Hugging Face's are
        return LigerRopeFunction.apply
    return None


def _ours(op: str, backend: str) -> Callable:
    from fused_layers.ops import geglu, gelu, layer_norm, rms_norm, rope, swiglu

    return {
        "layer_norm": lambda x, w, b: layer_norm(x, w, b, EPS["layer_norm"], backend=backend),
        "rms_norm": lambda x, w: rms_norm(x, w, EPS["rms_norm"], backend=backend),
        "gelu": lambda x: gelu(x, "tanh", backend=backend),
        "geglu": lambda a, b: geglu(a, b, "tanh", backend=backend),
        "swiglu": lambda a, b: swiglu(a, b, backend=backend),
        "rope": lambda q, k, cos, sin: rope(q, k, cos, sin, backend=backend),
    }[op]


def _min_bytes(op: str, shape: tuple[int, ...], pass_name: str) -> int:
    if op == "rope":
        batch, seq, q_heads, k_heads, head_dim = shape
        # q and k read and written once, cos and sin read once per (b, t) position, in each pass
        one_pass = (2 * (q_heads + k_heads) + 2) * batch * seq * head_dim * 2
        return one_pass if pass_name == "fwd" else 2 * one_pass
    numel = shape[0] * shape[1]
    n_inputs = 2 if op in ("geglu", "swiglu") else 1
    fwd = (n_inputs + 1) * numel * 2  # inputs read, output written
    bwd = (n_inputs + 1 + n_inputs) * numel * 2  # inputs and dy read, input grads written
    return fwd if pass_name == "fwd" else fwd + bwd


def _copy_bandwidth(quick: bool) -> float:
    """Bytes/s of ``y.copy_(x)`` over a large bf16 buffer (read + write), the ceiling we compare with."""
    numel = (256 if quick else 1024) * 2**20  # 2 GiB per buffer in the full run: far past L2
    x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = _time(y.copy_, [x], None, [], quick)  # timed as the ops are
    return 2 * numel * 2 / (ms * 1e-3)


def _contenders(op: str, shape: tuple[int, ...], params: list[torch.Tensor], cuda_error: str | None):
    """Yield (name, fn-or-None, extra grad tensors, error-or-None) for one op and shape."""
    from fused_layers import dispatch

    width = shape[1]
    yield "eager", _heads(op, shape, _eager(op)), [], None
    try:
        fn, hf_params = _hf(op, width, params)
        yield "hf", _heads(op, shape, fn), hf_params, None
    except Exception as exc:  # transformers missing or renamed: record, carry on
        yield "hf", None, [], repr(exc)
    yield "compile", _heads(op, shape, torch.compile(_eager(op), dynamic=False)), [], None
    try:
        liger = _liger(op)
        if liger is not None:
            yield "liger", _heads(op, shape, liger), [], None
    except ImportError as exc:
        yield "liger", None, [], repr(exc)
    yield "ours", _heads(op, shape, _ours(op, "triton")), [], None
    if dispatch.has_implementation(op, "cuda"):
        if cuda_error is None:
            yield "ours_cuda", _ours(op, "cuda"), [], None
        else:
            yield "ours_cuda", None, [], cuda_error


def _inputs(
    op: str, shape: tuple[int, ...], grad: bool, device: str = "cuda"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(args, parameters) in bf16 on the GPU; random data, never zeros."""
    make = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16).requires_grad_(grad)
    if op == "rope":  # (B, T, H*D) projections, and cos/sin of real angles shared by the batch
        batch, seq, q_heads, k_heads, head_dim = shape
        angles = torch.rand(1, seq, head_dim // 2, device=device) * 6.0
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
        return [make(batch, seq, q_heads * head_dim), make(batch, seq, k_heads * head_dim), cos, sin], []
    tokens, width = shape
    if op == "layer_norm":
        params = [make(width), make(width)]
        return [make(tokens, width)] + params, params
    if op == "rms_norm":
        params = [make(width)]
        return [make(tokens, width)] + params, params
    if op == "gelu":
        return [make(tokens, width)], []
    return [make(tokens, width), make(tokens, width)], []


def run(args: argparse.Namespace) -> dict:
    """Time every (op, shape, pass, contender); returns the results object written to JSON."""
    started = time.monotonic()
    for name in ("cache_size_limit", "recompile_limit"):  # one static compile per shape and op
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    try:
        from fused_layers.backends.cuda.build import load_extension

        load_extension()  # compiles the C++ extension, or says why not
        cuda_error = None
    except Exception as exc:
        cuda_error = repr(exc)
    copy_bps = _copy_bandwidth(args.quick)
    result = {**_run_header(copy_bps), "fused_layers_cuda_error": cuda_error, "rows": []}
    for op in args.ops.split(","):
        if op == "rope":
            shapes = QUICK_ROPE_SHAPES if args.quick else ROPE_SHAPES
        else:
            shapes = QUICK_SHAPES if args.quick else (NORM_SHAPES if "norm" in op else ELEMENTWISE_SHAPES)
        for shape in shapes:
            for pass_name in ("fwd", "fwd+bwd"):
                grad = pass_name == "fwd+bwd"
                inputs, params = _inputs(op, shape, grad)
                dy = _dy(op, shape) if grad else None
                nbytes = _min_bytes(op, shape, pass_name)
                row = {"op": op, "shape": list(shape), "pass": pass_name, "min_bytes": nbytes, "results": {}}
                for name, fn, extra, error in _contenders(op, shape, params, cuda_error):
                    if error is None and name == "compile" and time.monotonic() - started > args.budget_s:
                        error = "skipped: past --budget-s"
                    if error is not None:
                        row["results"][name] = {"error": error}
                        continue
                    try:
                        ms = _time(fn, inputs, dy, extra, args.quick)
                        row["results"][name] = {"ms": ms, "tbps": nbytes / (ms * 1e-3) / 1e12}
                    except Exception as exc:  # one contender failing must not end the run
                        row["results"][name] = {"error": repr(exc)[:500]}
                _judge(row, copy_bps)
                result["rows"].append(row)
                inputs = params = dy = None  # free this shape's buffers before the next
                torch.cuda.empty_cache()
                _write(result, args.out, _table)  # after every row: a run cut short still leaves its numbers
    return result


def _run_header(copy_bps: float) -> dict:
    """What a result file opens with: the device, the date (UTC), torch's and Triton's versions, and
    the copy bandwidth the rows are held to."""
    return {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "copy_tbps": copy_bps / 1e12,
    }


def _dy(op: str, shape: tuple[int, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The output gradient(s): one per output (rope's two are (B, H, T, D), contiguous)."""
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)
    if op == "rope":
        batch, seq, q_heads, k_heads, head_dim = shape
        return make(batch, q_heads, seq, head_dim), make(batch, k_heads, seq, head_dim)
    return make(*shape)


def _time(
    fn: Callable,
    inputs: list[torch.Tensor],
    dy: torch.Tensor | tuple[torch.Tensor, ...] | None,
    extra_leaves: list[torch.Tensor],
    quick: bool,
) -> float:
    """Median ms per call of ``fn(*inputs)``, or of its backward from ``dy`` (one gradient per
    output) when dy is given (``benchmarks/timing.py`` says how, and why not ``do_bench``)."""
    leaves = [t for t in inputs if t.requires_grad] + extra_leaves

    def call() -> None:
        for leaf in leaves:  # no call accumulates into another's gradients
            leaf.grad = None
        if dy is None:
            fn(*inputs)
        else:
            torch.autograd.backward(fn(*inputs), dy)

    with torch.no_grad() if dy is None else torch.enable_grad():
        return steady_ms(call, target_ms=5.0 if quick else 25.0, batches=3 if quick else 7)


def _judge(row: dict, copy_bps: float) -> None:
    ours = row["results"].get("ours", {})
    others = [r["tbps"] for name, r in row["results"].items() if name in OTHERS and "tbps" in r]
    row["best_other_tbps"] = max(others) if others else None
    if "tbps" not in ours:
        row["ours_pct_copy"] = None
        row["meets_bars"] = False
        return
    row["ours_pct_copy"] = 100 * ours["tbps"] * 1e12 / copy_bps
    bar = FWD_BAR if row["pass"] == "fwd" else FWDBWD_BAR
    row["meets_copy_bar"] = row["ours_pct_copy"] >= 100 * bar
    row["meets_best_other"] = row["best_other_tbps"] is None or ours["tbps"] >= row["best_other_tbps"]
    row["meets_bars"] = row["meets_copy_bar"] and row["meets_best_other"]


def _table(result: dict) -> str:
    names = ["eager", "hf", "compile", "liger", "ours", "ours_cuda"]
    lines = [
        f"device: {result['device']}  date: {result['date']}  torch {result['torch']}  triton "
        f"{result['triton']}  copy: {result['copy_tbps']:.2f} TB/s (read+write)",
        "TB/s over the fewest bytes; bars: fwd >= 90% / fwd+bwd >= 80% of copy, and >= best of "
        "eager/hf/compile/liger",
        "",
        "| op | shape | pass | " + " | ".join(names) + " | ours % copy | copy bar | >= best |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for row in result["rows"]:
        cells = []
        for name in names:
            r = row["results"].get(name)
            cells.append("-" if r is None else (f"{r['tbps']:.2f}" if "tbps" in r else "err"))
        pct = row.get("ours_pct_copy")
        lines.append(
            f"| {row['op']} | {'x'.join(map(str, row['shape']))} | {row['pass']} | "
            + " | ".join(cells)
            + f" | {'-' if pct is None else f'{pct:.0f}%'} | {'yes' if row.get('meets_copy_bar') else 'NO'}"
            + f" | {'yes' if row.get('meets_best_other') else 'NO'} |"
        )
    lines += _error_lines(result, "errors (first of each op/contender):")
    return "\n".join(lines)


def _error_lines(result: dict, heading: str) -> list[str]:
    """A blank line, `heading` and one line per op/contender whose run raised; none when none did."""
    errors = {
        f"{row['op']}/{name}": r["error"][:200]
        for row in result["rows"]
        for name, r in row["results"].items()
        if "error" in r
    }
    return ["", heading] + [f"- {k}: {v}" for k, v in errors.items()] if errors else []


def _write(result: dict, out: str, table: Callable[[dict], str]) -> None:
    """`result` to STEM.json and its `table` to STEM.md, for the path stem `out`."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    path.with_suffix(".md").write_text(table(result) + "\n")


LAUNCH_KERNEL_BAR = 0.85  # GPU kernel time of ours as a fraction of copy bandwidth
# Host time: rounds of one sample per contender, each sample the mean of HOST_CALLS calls.
HOST_ROUNDS = 41
HOST_CALLS = 5
HOST_BUSY_GPU_MS = 10.0  # longer than any contender's HOST_CALLS calls take the host


def _launch_contenders(op: str):
    """Yield (name, fn, direct launch on?) for the --launch mode."""
    yield "eager", _eager(op), True
    yield "ours", _ours(op, "triton"), True
    yield "ours_triton_launcher", _ours(op, "triton"), False
    yield "ours_cuda", _ours(op, "cuda"), True


def _kernel_us(call: Callable[[], None], calls: int = 10) -> float:
    """GPU time per call summed over every kernel, memcpy and memset the profiler saw."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in prof.key_averages()) / calls


def _launch_calls(op: str, shape: tuple[int, int], saved_direct: bool) -> dict[str, Callable[[], None]]:
    """name -> one forward+backward of that contender on fresh bf16 inputs of ``shape``."""
    from fused_layers.backends.triton import launch

    inputs, _ = _inputs(op, shape, grad=True)
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    calls = {}
    for name, fn, direct in _launch_contenders(op):

        def call(fn=fn, direct=direct) -> None:
            launch.DIRECT_LAUNCH = saved_direct and direct
            try:
                for leaf in inputs:
                    leaf.grad = None
                fn(*inputs).backward(dy)
            finally:
                launch.DIRECT_LAUNCH = saved_direct

        calls[name] = call
    return calls


def run_launch(args: argparse.Namespace) -> dict:
    """--launch: host µs, kernel µs and back-to-back µs per forward+backward of each norm.

    Host times come first, for every shape, before anything runs the profiler: once it has run,
    CUPTI stays attached and adds host time to every kernel launch (on the H200's host, eager
    LayerNorm forward+backward took 132-141 µs a call in three of four measurements before one
    profiled run, 201-250 after it).
    """
    from fused_layers.backends.triton import launch
    from trainprof.bench import host_times, measure_copy_bandwidth, paired_ratio, time_fn

    saved = launch.DIRECT_LAUNCH
    copy_bps = measure_copy_bandwidth("cuda")
    result = {**_run_header(copy_bps), "rows": []}
    shapes = QUICK_SHAPES if args.quick else NORM_SHAPES
    cases = [(op, shape) for op in ("layer_norm", "rms_norm") for shape in shapes]
    for op, shape in cases:  # pass 1: host time, no profiler yet
        row = {"op": op, "shape": list(shape), "min_bytes": _min_bytes(op, shape, "fwd+bwd"), "results": {}}
        calls = {}
        for name, call in _launch_calls(op, shape, saved).items():
            try:
                call()  # builds and warms; a contender that fails here is left out of the timing
                calls[name] = call
            except Exception as exc:  # one contender failing must not end the run
                row["results"][name] = {"error": repr(exc)[:500]}
        # Side by side: the contenders in rotated order, one sample each per round, so that the
        # host's drift within the run falls on all of them alike. The bar's figure starts each
        # sample on a GPU kept busy (launches meet a queue, as in a GPU-bound step); the other
        # starts on an idle GPU.
        for key, busy_ms in (("host", HOST_BUSY_GPU_MS), ("host_idle", None)):
            hosts = host_times(
                calls, device="cuda", rounds=HOST_ROUNDS, calls_per_sample=HOST_CALLS, busy_gpu_ms=busy_ms
            )
            for name, host in hosts.items():
                row["results"].setdefault(name, {}).update(
                    {f"{key}_us": host.median_us, f"{key}_iqr_us": host.iqr_ms * 1e3,
                     f"{key}_samples_ms": host.samples_ms}
                )  # fmt: skip
                if name != "eager" and "eager" in hosts:
                    row["results"][name][f"{key}_over_eager"] = paired_ratio(host, hosts["eager"])
        result["rows"].append(row)
        calls = None
        torch.cuda.empty_cache()
    for row in result["rows"]:  # pass 2: back-to-back and kernel time
        shape = tuple(row["shape"])
        for name, call in _launch_calls(row["op"], shape, saved).items():
            if "error" in row["results"].get(name, {}):
                continue
            try:
                steady = time_fn(call, device="cuda", target_ms=5.0 if args.quick else 25.0)
                kernel_us = _kernel_us(call)
                row["results"][name].update(
                    steady_us=steady.median_us,
                    kernel_us=kernel_us,
                    kernel_pct_copy=100 * row["min_bytes"] / (kernel_us * 1e-6) / copy_bps,
                )
            except Exception as exc:
                row["results"][name] = {"error": repr(exc)[:500]}
        eager = row["results"].get("eager", {})
        for name in ("ours", "ours_cuda"):  # the bars, for the Triton and the CUDA C++ version
            ours = row["results"].get(name, {})
            if "kernel_us" in ours and "host_us" in eager:
                row.setdefault("bars", {})[name] = {
                    "kernel": ours["kernel_pct_copy"] >= 100 * LAUNCH_KERNEL_BAR,
                    "host": ours["host_us"] <= eager["host_us"],
                }
        torch.cuda.empty_cache()
        _write(result, args.out, _launch_table)
    return result


def _launch_table(result: dict) -> str:
    names = ["eager", "ours", "ours_triton_launcher", "ours_cuda"]
    lines = [
        f"device: {result['device']}  date: {result['date']}  torch {result['torch']}  triton "
        f"{result['triton']}  copy: {result['copy_tbps']:.2f} TB/s (read+write)",
        "forward+backward, bf16, µs per call: back-to-back (CUDA events) / host with the GPU busy / host "
        "from an idle GPU (no sync in either) / GPU kernels (profiler), and kernels as % of copy. Host: "
        f"medians of {HOST_ROUNDS} rounds that time each contender in turn, before any profiling. Bars: "
        f"ours' kernels >= {100 * LAUNCH_KERNEL_BAR:.0f}% of copy; ours' host (GPU busy) <= eager's. Last "
        "columns: CUDA's host sample over eager's in the same round, median (quartiles)",
        "",
        "| op | shape | " + " | ".join(names) + " | kernel bar (Triton / CUDA) | host bar (Triton / CUDA) "
        "| CUDA / eager host, GPU busy | same, idle |",
        "|---|---|" + "---|" * len(names) + "---|---|---|---|",
    ]
    for row in result["rows"]:
        cells = []
        for name in names:
            r = row["results"].get(name)
            if r is None or "error" in r:
                cells.append("-" if r is None else "err")
                continue
            keys = ("steady_us", "host_us", "host_idle_us", "kernel_us")
            times = " / ".join(f"{r[key]:.0f}" if key in r else "-" for key in keys)
            cells.append(f"{times} ({r['kernel_pct_copy']:.0f}%)" if "kernel_pct_copy" in r else times)
        verdict = {True: "yes", False: "NO", None: "-"}
        bars = row.get("bars", {})
        judged = [
            " / ".join(verdict[bars.get(name, {}).get(bar)] for name in ("ours", "ours_cuda"))
            for bar in ("kernel", "host")
        ]
        cuda = row["results"].get("ours_cuda", {})
        paired = [
            "{:.2f} ({:.2f}-{:.2f})".format(*cuda[key]) if key in cuda else "-"
            for key in ("host_over_eager", "host_idle_over_eager")
        ]
        lines.append(
            f"| {row['op']} | {row['shape'][0]}x{row['shape'][1]} | " + " | ".join(cells)
            + f" | {judged[0]} | {judged[1]} | {paired[0]} | {paired[1]} |"
        )  # fmt: skip
    lines += _error_lines(result, "errors:")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="log/fused_layers_bench", help="path stem: writes STEM.json and STEM.md"
    )
    parser.add_argument("--quick", action="store_true", help="two small shapes, short timing: a smoke run")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    parser.add_argument(
        "--launch", action="store_true", help="norms only: host vs GPU kernel time per forward+backward"
    )
    parser.add_argument(
        "--budget-s", type=float, default=float(os.environ.get("BENCH_BUDGET_S", 330)),
        help="past this many seconds, skip further torch.compile contenders (their compiles dominate)",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks.kernels needs a CUDA device (it times with CUDA events)")
    torch.manual_seed(0)
    if args.launch:
        result = run_launch(args)
        _write(result, args.out, _launch_table)
        print(_launch_table(result))
        return
    result = run(args)
    _write(result, args.out, _table)
    print(_table(result))


if __name__ == "__main__":
    main()
