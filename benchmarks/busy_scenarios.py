"""Does each GPU-busy finding's fix pay what the finding predicts? Problem/fix pairs, run on a GPU.

    python -m benchmarks.busy_scenarios --out DIR                 # every scenario
    python -m benchmarks.busy_scenarios --out DIR --only fp32_mlp,empty_cache

Each scenario is a training (or inference) loop in the form a user writes it (the problem) and in
the forms the finding's fix names. Every variant runs in its own process: it times steps without the
profiler (CUDA events around each step after warm-up; median and quartiles), records the peak memory,
then records a `trainprof.session` window of the same loop. DIR gets `<scenario>/<variant>/` run
folders (the trace, sync sites) and `timings.json` (one row per variant). `trainprof analyze` on a
problem folder should name the waste and predict the gain that the fix variant's timing measures.

Scenarios (each variant's first line says what it changes):
- fp32_mlp: 4 Llama-sized MLP blocks (2048 -> 8192 -> 2048, SwiGLU) in fp32 with TF32 off (PyTorch's
  default), a torch.cuda.synchronize() per step as timing loops have; fixes: TF32, bf16 autocast.
- gpt2_attention: GPT-2 124M at T=2048 with attn_implementation="eager"; fix: "sdpa". With SDPA its
  50,257-token head is the slow GEMM shape; fix: the vocabulary padded to 50,304 (`sdpa_vocab64`).
- compile_recompile: torch.compile(dynamic=False) fed a new sequence length each step; fixes:
  dynamic=True, padding to one length.
- empty_cache: torch.cuda.empty_cache() after every step; fix: none.
- vocab_head: a 2-layer Llama with Llama-3.2-1B's 128,256-token vocabulary (tied), B4 x T2048; fix:
  a fused linear cross-entropy (Liger's, where liger-kernel is installed).
- llama_swap: a 4-layer Llama-1B-shaped model (vocab 32,000), bf16; fix: fused_layers.swap.
- inference: GPT-2 124M forward under torch.no_grad, no backward, no optimizer.
- small_mlp: 32 narrow blocks (Linear 256 -> 256, GELU, LayerNorm) at batch 64, each kernel shorter
  than its launch: launch-bound with or without the profiler. No fix variant: it checks that judging
  a recorded step by the un-profiled one (`analysis.profiler_cost`) keeps a real launch-bound verdict.

The session runs `AFTER_WINDOW_STEPS` steps past its window, which it times un-profiled
(`unprofiled_step_ms` in the sync sites file) beside the CUDA-event timing above.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

SCENARIOS: dict[str, tuple[str, ...]] = {
    "fp32_mlp": ("fp32", "tf32", "bf16"),
    "gpt2_attention": ("eager", "sdpa", "sdpa_vocab64"),
    "compile_recompile": ("recompile", "dynamic", "padded"),
    "empty_cache": ("empty_cache", "plain"),
    "vocab_head": ("bare", "liger_flce"),
    "llama_swap": ("bare", "fused"),
    "inference": ("forward",),
    "small_mlp": ("eager",),
}
TIMED_STEPS = 10
WARMUP_STEPS = 3
# The session's window: steps 2-3 recorded (wait 1, warm-up 1). Recompiling models are recorded
# without Python stacks: with them, the profiler spends minutes per step in Dynamo's frames.
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}
AFTER_WINDOW_STEPS = 8


def _mlp_block(hidden: int, inner: int) -> torch.nn.Module:
    class SwiGLU(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(hidden, inner, bias=False)
            self.up = torch.nn.Linear(hidden, inner, bias=False)
            self.down = torch.nn.Linear(inner, hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))

    return SwiGLU()


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of: Callable) -> None:
    loss = loss_of()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build(scenario: str, variant: str) -> tuple[Callable[[int], None], dict]:
    """The loop's step function (given the step index) and notes on what was built."""
    device = torch.device("cuda")
    notes: dict = {"scenario": scenario, "variant": variant}
    torch.manual_seed(0)
    if scenario == "fp32_mlp":
        torch.backends.cuda.matmul.allow_tf32 = variant == "tf32"
        model = torch.nn.Sequential(*[_mlp_block(2048, 8192) for _ in range(4)]).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(4, 2048, 2048, device=device)

        def loss_of() -> torch.Tensor:
            with torch.autocast("cuda", torch.bfloat16, enabled=variant == "bf16"):
                return model(x).float().pow(2).mean()

        def step(i: int) -> None:
            _train_step(model, optimizer, loss_of)
            torch.cuda.synchronize()  # as timing loops do

        return step, notes
    if scenario in ("gpt2_attention", "inference"):
        from transformers import GPT2Config, GPT2LMHeadModel

        seq = 2048 if scenario == "gpt2_attention" else 1024
        batch = 4 if scenario == "gpt2_attention" else 8
        # sdpa_vocab64: the gemm_shape finding's fix, the vocabulary padded to a multiple of 64 (the
        # token ids stay GPT-2's: the padding rows are never a label)
        config = GPT2Config(n_positions=seq, vocab_size=50304 if variant == "sdpa_vocab64" else 50257)
        attn = variant.removesuffix("_vocab64") if scenario == "gpt2_attention" else "sdpa"
        model = GPT2LMHeadModel._from_config(config, attn_implementation=attn).to(device)
        ids = torch.randint(0, 50257, (batch, seq), device=device)
        notes.update(batch=batch, seq=seq, attn_implementation=attn, vocab_size=config.vocab_size)
        if scenario == "inference":
            model.eval()

            def step(i: int) -> None:
                with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                    model(input_ids=ids)

            return step, notes
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def loss_of() -> torch.Tensor:
            with torch.autocast("cuda", torch.bfloat16):
                return model(input_ids=ids, labels=ids).loss

        return (lambda i: _train_step(model, optimizer, loss_of)), notes
    if scenario == "compile_recompile":
        from torch import _dynamo

        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across releases
            if hasattr(_dynamo.config, name):
                setattr(_dynamo.config, name, 256)
        layers = (torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
        model = torch.nn.Sequential(*layers, torch.nn.LayerNorm(1024)).to(device)
        compiled = torch.compile(model, dynamic=variant == "dynamic")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        longest = 128 + 16 * 64

        def step(i: int) -> None:
            length = 128 + 16 * (i % 64)  # a new length every step, as unpadded batches give
            x = torch.randn(8, length, 1024, device=device)
            if variant == "padded":
                x = torch.nn.functional.pad(x, (0, 0, 0, longest - length))
            _train_step(model, optimizer, lambda: compiled(x).pow(2).mean())

        notes["with_stack"] = False
        return step, notes
    if scenario == "empty_cache":
        model = torch.nn.Sequential(*[_mlp_block(1024, 4096) for _ in range(4)]).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randn(8, 512, 1024, device=device)

        def step(i: int) -> None:
            with torch.autocast("cuda", torch.bfloat16):
                _train_step(model, optimizer, lambda: model(x).float().pow(2).mean())
            if variant == "empty_cache":
                torch.cuda.empty_cache()

        return step, notes
    if scenario in ("vocab_head", "llama_swap"):
        from transformers import LlamaConfig, LlamaForCausalLM

        big_vocab = scenario == "vocab_head"
        config = LlamaConfig(
            hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
            num_hidden_layers=2 if big_vocab else 4, vocab_size=128256 if big_vocab else 32000,
            tie_word_embeddings=big_vocab, max_position_embeddings=4096,
        )
        model = LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
        if variant == "liger_flce":
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(
                rope=False, rms_norm=False, swiglu=False, cross_entropy=False,
                fused_linear_cross_entropy=True, model=model,
            )
        if variant == "fused":
            import fused_layers

            notes["swapped"] = fused_layers.swap(model, backend="triton").summary()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, config.vocab_size, (4, 2048), device=device)

        def loss_of() -> torch.Tensor:
            return model(input_ids=ids, labels=ids).loss

        return (lambda i: _train_step(model, optimizer, loss_of)), notes
    if scenario == "small_mlp":
        blocks = [(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256)) for _ in range(32)]
        model = torch.nn.Sequential(*[layer for block in blocks for layer in block]).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(64, 256, device=device)
        return (lambda i: _train_step(model, optimizer, lambda: model(x).pow(2).mean())), notes
    raise ValueError(f"unknown scenario {scenario!r}")


def timed_steps(step: Callable[[int], None], warmup: int = WARMUP_STEPS, timed: int = TIMED_STEPS) -> dict:
    """Steps 0 .. `warmup` - 1 untimed, then `timed` steps each timed with CUDA events, peak memory
    counted from the first timed step: a result row's `step_ms_median`, `step_ms_q1`, `step_ms_q3`
    and `step_ms` (each step, ms)."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup, warmup + timed):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    quartiles = statistics.quantiles(times, n=4)
    return {
        "step_ms_median": round(statistics.median(times), 3),
        "step_ms_q1": round(quartiles[0], 3),
        "step_ms_q3": round(quartiles[2], 3),
        "step_ms": [round(t, 3) for t in times],
    }


def run_variant(scenario: str, variant: str, out: Path) -> dict:
    """Time the variant's steps without the profiler, then record a session window of it."""
    import trainprof

    step, notes = build(scenario, variant)
    row = {
        **notes,
        **timed_steps(step),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    run_dir = out / scenario
    run_dir.mkdir(parents=True, exist_ok=True)
    first = WARMUP_STEPS + TIMED_STEPS
    total = sum(SCHEDULE.values()) + AFTER_WINDOW_STEPS
    with trainprof.session(
        log_dir=run_dir, run_name=variant, analyze=False, console=False, tensorboard_scalars=False,
        with_stack=notes.get("with_stack", True), **SCHEDULE,
    ) as sess:
        for i in range(first, first + total):
            step(i)
            if scenario == "inference":
                sess.step()
    torch.cuda.synchronize()
    row["trace_files"] = [str(p.relative_to(out)) for p in sess.trace_files]
    return row


def peaks() -> dict:
    """The device's matmul rates (TFLOP/s) by dtype and its device-to-device copy bandwidth (TB/s)."""
    out: dict = {"device": torch.cuda.get_device_name()}
    n = 8192

    def timed(fn: Callable[[], object], repeat: int = 20) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeat

    for label, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, False),
                               ("tf32", torch.float32, True), ("fp32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        seconds = timed(lambda a=a, b=b: a @ b, repeat=5 if label == "fp32" else 20)
        out[f"matmul_{label}_tflops"] = round(2 * n**3 / seconds / 1e12, 1)
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.randn(1 << 30, device="cuda")  # 4 GiB
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src))
    out["copy_tb_s"] = round(2 * src.numel() * 4 / seconds / 1e12, 3)  # bytes read + written
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per variant")
    parser.add_argument("--tar-into", default=None, help="pack each scenario as DIR/<scenario>.tar")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        row = run_variant(*args.child, out)
        print("ROW " + json.dumps(row), flush=True)
        return 0
    rows = [{"peaks": peaks()}]
    print(json.dumps(rows[0]), flush=True)
    for scenario in args.only.split(","):
        for variant in SCENARIOS[scenario]:
            started = time.time()
            command = [sys.executable, "-m", "benchmarks.busy_scenarios", "--out", str(out),
                       "--child", scenario, variant]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
                found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
                row = json.loads(found[-1]) if found else {
                    "scenario": scenario, "variant": variant, "error": done.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                row = {"scenario": scenario, "variant": variant, "error": f"timeout {args.timeout} s"}
            row["wall_s"] = round(time.time() - started, 1)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("step_ms", "error")}),
                  row.get("error", "")[-600:], flush=True)
            (out / "timings.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
        if args.tar_into and (out / scenario).is_dir():
            with tarfile.open(Path(args.tar_into) / f"{scenario}.tar", "w") as tar:
                tar.add(out / scenario, arcname=scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
