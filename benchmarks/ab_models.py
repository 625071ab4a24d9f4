"""Does fused_layers.swap pay off end to end, against torch.compile and Liger, on GPT-2 124M and
~1B Llamas? Runs `trainprof ab` once per model, each in its own process, and keeps its JSON, its
Markdown section and each variant's profiled step.

    python -m benchmarks.ab_models --out log/ab_models    # every model, 50 steps
    python -m benchmarks.ab_models --out /tmp/ab --models gpt2-tiny --steps 6 --device cpu   # smoke run

Per model (issues #8 and #20's bars):
- gpt2-124m: fp32 parameters under bf16 autocast, batch 8 x 1024;
- llama-1b (Llama-3.2-1B's shape and vocabulary, 128,256, tied): bf16 parameters, batch 4 x 2048;
- llama-1b-32k: the same with a 32,000 vocabulary, untied;
variants (``--variants``, or each model's own with ``--variants per-model``) among bare, fused,
liger (Liger's defaults; skipped where liger-kernel is missing), liger-matched, compile and
fused+compile; 50 steps each (5 untimed warm-up steps, where torch.compile compiles), timed in
interleaved blocks of 5. Loss parity is over all 50 steps. Writes OUT/<model>.json, OUT/<model>.md,
OUT/<model>.log and, unless --no-profile, OUT/<model>-traces/<variant>/ (read them with
`trainprof diff`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

RUNS = {
    "gpt2-124m": ["--batch", "8", "--seq", "1024", "--dtype", "fp32", "--autocast"],
    "llama-1b": ["--batch", "4", "--seq", "2048", "--dtype", "bf16"],
    "llama-1b-32k": ["--batch", "4", "--seq", "2048", "--dtype", "bf16"],
    "gpt2-tiny": [],  # CPU smoke run
}
VARIANTS = "bare,fused,liger,compile,fused+compile"
#: ``--variants per-model``: what each model's bars need (Liger has no GPT-2 patch: its defaults
#: leave GPT-2 bare, so only the matched variant, LigerLayerNorm, differs there).
PER_MODEL = {
    "gpt2-124m": "bare,fused,compile,fused+compile",
    "llama-1b": "bare,fused,liger,compile,fused+compile",
    "llama-1b-32k": "bare,fused,compile,fused+compile",
    "gpt2-tiny": VARIANTS,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--models", default="gpt2-124m,llama-1b", help=f"some of {', '.join(RUNS)}")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--variants", default=VARIANTS, help=f"default {VARIANTS}; or per-model")
    parser.add_argument("--no-profile", action="store_true", help="no profiled step, no diffs")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--timeout", type=int, default=540, help="seconds per model before it is stopped")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for model in args.models.split(","):
        variants = PER_MODEL[model] if args.variants == "per-model" else args.variants
        command = [
            sys.executable, "-m", "trainprof", "ab", "--model", model, "--variants", variants,
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--block", str(args.block),
            *RUNS[model], "--json", "--markdown", str(out / f"{model}.md"),
        ]
        command += ["--no-profile"] if args.no_profile else ["--log-dir", str(out / f"{model}-traces")]
        if args.device:
            command += ["--device", args.device]
        started = time.time()
        print(f"$ {' '.join(command)}", flush=True)
        log = out / f"{model}.log"  # written as it runs: a stopped run still shows its phases
        try:
            with log.open("w", encoding="utf-8") as stderr:
                done = subprocess.run(
                    command, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=args.timeout
                )
        except subprocess.TimeoutExpired:
            print(f"{model}: stopped after {args.timeout} s; its phases so far:", flush=True)
            lines = log.read_text(encoding="utf-8").splitlines()
            print("\n".join(line for line in lines if "trainprof ab:" in line), flush=True)
            failed += 1
            continue
        if done.returncode != 0:
            print(f"{model}: exit {done.returncode}; last lines of {log}:", flush=True)
            print("\n".join(log.read_text(encoding="utf-8").splitlines()[-15:]), flush=True)
            failed += 1
            continue
        (out / f"{model}.json").write_text(done.stdout, encoding="utf-8")
        print(f"{model}: {time.time() - started:.0f} s", flush=True)
        print((out / f"{model}.md").read_text(encoding="utf-8"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
