"""Is fused_layers' linear cross-entropy at least as fast as Liger's and the compiled ``linear +
cross_entropy``, forward+backward, with peak memory no higher than Liger's? (issue 20's bar)

    python -m benchmarks.linear_cross_entropy --out DIR [--vocab 32000,128256,151936] [--repeats 20]
    python -m benchmarks.linear_cross_entropy --out DIR --vocab 50257 --width 768   # GPT-2's head

Needs a CUDA device; bf16, N = 8192 tokens (B4 x T2048), H = 2048 (``--width``). For each vocabulary size and
contender: forward+backward timed with CUDA events around each call, after warm-up, on fresh
random inputs every call (hidden states, labels with 5% ignored, and the weight redrawn in
place), median and quartiles; peak memory above the inputs (``max_memory_allocated`` minus what
was allocated before the call, gradients included); the loss's and gradients' error against
an fp32 ``F.linear`` + ``F.cross_entropy`` on the same inputs. Contenders:

- ``ours``: ``fused_layers.ops.linear_cross_entropy.linear_cross_entropy``, its default schedule;
  ``ours_*``: other schedules (``--schedules``), to show what the default was chosen over;
- ``liger``: ``liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss`` with its defaults;
- ``eager``: ``F.cross_entropy(F.linear(h, w).float(), y)``, as Hugging Face computes it;
- ``compile``: that function under ``torch.compile``; ``ours_compiled``: ours under it (the custom
  op, ``backend="triton"``).

Writes ``DIR/linear_cross_entropy.json`` and ``DIR/linear_cross_entropy.md``; prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_layers.backends.triton.linear_cross_entropy import Schedule
from fused_layers.ops.linear_cross_entropy import linear_cross_entropy

TOKENS, WIDTH = 8192, 2048
VOCABS = (32000, 128256, 151936)
IGNORED_FRACTION = 0.05
WARMUP = 3

#: Schedules compared with the default: name -> Schedule.
SCHEDULES = {
    "ours_c256": Schedule(chunk_tokens=256),
    "ours_c1024": Schedule(chunk_tokens=1024),
    "ours_c2048": Schedule(chunk_tokens=2048),
    "ours_s1024": Schedule(slice_columns=1024),
    "ours_s4096": Schedule(slice_columns=4096),
    "ours_bpp1": Schedule(blocks_per_program=1),
    "ours_bpp8": Schedule(blocks_per_program=8),
    "ours_fp32acc": Schedule(accumulate_fp32=True),
}

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _hf_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=-100)


def contenders(names: list[str]) -> dict[str, Loss]:
    """name -> loss function of (hidden (N, H), weight (V, H), labels (N,)); Liger only if installed."""
    table: dict[str, Loss] = {"ours": lambda h, w, y: linear_cross_entropy(h, w, y)}
    for name, schedule in SCHEDULES.items():
        table[name] = lambda h, w, y, schedule=schedule: linear_cross_entropy(h, w, y, schedule=schedule)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        pass
    else:
        liger = LigerFusedLinearCrossEntropyLoss()
        table["liger"] = lambda h, w, y: liger(w, h, y)
    table["eager"] = _hf_loss
    table["compile"] = torch.compile(_hf_loss, dynamic=False)
    # The custom op inside a compiled graph (explicitly: backend=None there runs the measured choice)
    table["ours_compiled"] = torch.compile(
        lambda h, w, y: linear_cross_entropy(h, w, y, backend="triton"), dynamic=False
    )
    return {name: table[name] for name in names if name in table}


def _inputs(weight: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh hidden states and labels; the weight redrawn in place (logits of std about 2)."""
    vocab, width = weight.shape
    weight.detach().normal_(0.0, 2.0 / width**0.5, generator=generator)
    weight.grad = None
    hidden = torch.randn(TOKENS, width, device="cuda", dtype=weight.dtype, generator=generator)
    labels = torch.randint(0, vocab, (TOKENS,), device="cuda", generator=generator)
    ignored = torch.rand(TOKENS, device="cuda", generator=generator) < IGNORED_FRACTION
    labels[ignored] = -100
    return hidden.requires_grad_(), labels


def _errors(loss_fn: Loss, weight: torch.Tensor, generator: torch.Generator) -> dict[str, float]:
    """Relative errors (norm of difference / norm) of loss, grad_hidden, grad_weight against fp32 math."""
    hidden, labels = _inputs(weight, generator)
    loss = loss_fn(hidden, weight, labels)
    loss.backward()
    got = (loss.detach().float(), hidden.grad.float(), weight.grad.float())
    ref_hidden = hidden.detach().float().requires_grad_()
    ref_weight = weight.detach().float().requires_grad_()
    ref_loss = F.cross_entropy(F.linear(ref_hidden, ref_weight), labels, ignore_index=-100)
    ref_loss.backward()
    refs = (ref_loss.detach(), ref_hidden.grad, ref_weight.grad)
    weight.grad = None
    names = ("loss", "grad_hidden", "grad_weight")
    return {n: ((g - r).norm() / r.norm()).item() for n, g, r in zip(names, got, refs, strict=True)}


def measure(loss_fn: Loss, vocab: int, repeats: int, seed: int, width: int = WIDTH) -> dict:
    """Times, peak memory above the inputs and errors of one contender at one vocabulary size."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.empty(vocab, width, device="cuda", dtype=torch.bfloat16).requires_grad_()
    times, peaks = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in range(WARMUP + repeats):
        hidden, labels = _inputs(weight, generator)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start.record()
        loss_fn(hidden, weight, labels).backward()
        end.record()
        end.synchronize()
        if step >= WARMUP:
            times.append(start.elapsed_time(end))
            peaks.append(torch.cuda.max_memory_allocated() - before)
        del hidden, labels
    errors = _errors(loss_fn, weight, generator)
    del weight
    torch.cuda.empty_cache()
    q1, median, q3 = statistics.quantiles(times, n=4)
    flops = 3 * 2 * TOKENS * width * vocab  # the three matrix products
    return {
        "median_ms": median,
        "q1_ms": q1,
        "q3_ms": q3,
        "min_ms": min(times),
        "tflops": flops / (median * 1e-3) / 1e12,
        "peak_mib": max(peaks) / 2**20,
        "errors": errors,
    }


def kernel_table(loss_fn: Loss, vocab: int, width: int = WIDTH, top: int = 14) -> list[dict]:
    """The GPU kernels of one forward+backward under torch.profiler: name, launches, total µs."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.empty(vocab, width, device="cuda", dtype=torch.bfloat16).requires_grad_()
    for _ in range(2):
        hidden, labels = _inputs(weight, generator)
        loss_fn(hidden, weight, labels).backward()
    hidden, labels = _inputs(weight, generator)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        loss_fn(hidden, weight, labels).backward()
        torch.cuda.synchronize()
    rows = [
        {"kernel": e.key[:90], "launches": e.count, "total_us": getattr(e, "device_time_total", 0.0)}
        for e in prof.key_averages()
    ]
    rows.sort(key=lambda row: -row["total_us"])
    return rows[:top]


def matmul_tflops(vocab: int, width: int = WIDTH) -> float:
    """bf16 rate of the logits product at this size (the ceiling the three products run against)."""
    a = torch.randn(TOKENS, width, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(vocab, width, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b.t()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b.t()
    end.record()
    end.synchronize()
    return 2 * TOKENS * width * vocab / (start.elapsed_time(end) / 10 * 1e-3) / 1e12


def verdicts(results: dict[str, dict]) -> dict[str, bool | None]:
    """The bar at one vocabulary size: ours' median <= Liger's and compile's; ours' peak <= Liger's."""
    ours, liger, compiled = results.get("ours"), results.get("liger"), results.get("compile")
    return {
        "faster_than_liger": None if not (ours and liger) else ours["median_ms"] <= liger["median_ms"],
        "faster_than_compile": None
        if not (ours and compiled)
        else ours["median_ms"] <= compiled["median_ms"],
        "memory_le_liger": None if not (ours and liger) else ours["peak_mib"] <= liger["peak_mib"],
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Fused linear cross-entropy, forward+backward ({report['device']}, {report['date']})",
        "",
        f"bf16, N = {TOKENS} tokens, H = {report['width']}; {report['repeats']} timed calls after {WARMUP} "
        f"warm-up, fresh random inputs each; torch {report['torch']}, triton {report['triton']}, "
        f"liger {report['liger']}. `python -m benchmarks.linear_cross_entropy`.",
        "",
        "| V | contender | median ms (q1-q3) | TFLOP/s | peak MiB above inputs | err grad_w | err grad_h |",
        "|---|---|---|---|---|---|---|",
    ]
    for vocab, entry in report["shapes"].items():
        for name, row in entry["results"].items():
            lines.append(
                f"| {vocab} | {name} | {row['median_ms']:.2f} ({row['q1_ms']:.2f}-{row['q3_ms']:.2f}) | "
                f"{row['tflops']:.0f} | {row['peak_mib']:.0f} | {row['errors']['grad_weight']:.1e} | "
                f"{row['errors']['grad_hidden']:.1e} |"
            )
        lines.append(f"| {vocab} | bf16 logits product alone | | {entry['matmul_tflops']:.0f} | | | |")
    lines += ["", "| V | ours <= Liger (time) | ours <= compile (time) | ours <= Liger (peak memory) |",
              "|---|---|---|---|"]  # fmt: skip
    for vocab, entry in report["shapes"].items():
        v = entry["verdicts"]
        lines.append(
            f"| {vocab} | {v['faster_than_liger']} | {v['faster_than_compile']} | {v['memory_le_liger']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", default=",".join(map(str, VOCABS)))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--width", type=int, default=WIDTH, help="hidden size H")
    parser.add_argument(
        "--contenders", default="ours,liger,compile,eager,ours_compiled," + ",".join(SCHEDULES)
    )
    parser.add_argument("--profile", default="", help="contenders whose kernels to list (comma-separated)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.linear_cross_entropy needs a CUDA device")
    try:
        import liger_kernel

        liger_version = getattr(liger_kernel, "__version__", "installed")
    except ImportError:
        liger_version = "not installed"
    import triton

    table = contenders(args.contenders.split(","))
    report = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger_version,
        "repeats": args.repeats,
        "width": args.width,
        "shapes": {},
    }
    for vocab in map(int, args.vocab.split(",")):
        results = {}
        profiles = {}
        for seed, (name, loss_fn) in enumerate(table.items()):
            try:
                results[name] = measure(loss_fn, vocab, args.repeats, seed, args.width)
            except Exception as error:  # one contender's failure must not lose the others' numbers
                print(f"V={vocab} {name}: FAILED {type(error).__name__}: {error}"[:400], flush=True)
                torch.cuda.empty_cache()
                continue
            if name in args.profile.split(","):
                profiles[name] = kernel_table(loss_fn, vocab, args.width)
                for row in profiles[name]:
                    print(f"    {row['total_us']:9.0f} us {row['launches']:5d}x {row['kernel']}")
            row = results[name]
            spread = f"{row['median_ms']:8.2f} ms ({row['q1_ms']:.2f}-{row['q3_ms']:.2f})"
            error = row["errors"]["grad_weight"]
            print(f"V={vocab} {name:14s} {spread} {row['peak_mib']:8.0f} MiB err_w {error:.1e}", flush=True)
        report["shapes"][vocab] = {
            "results": results,
            "matmul_tflops": matmul_tflops(vocab, args.width),
            "verdicts": verdicts(results),
            "kernels": profiles,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear_cross_entropy.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (args.out / "linear_cross_entropy.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
