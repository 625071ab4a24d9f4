"""Does each round-two GPU-busy rule fire on its habit, stay silent on the fix, and predict the gain?

    python -m benchmarks.busy_round_two --out DIR [--only attention_mask,checkpointing] [--deadline-s 280]

Each habit is a training loop in the form a user writes it and in its fix's form (`HABITS`):
- attention_mask: a 4-layer causal transformer (d 1024, 16 heads, B4 x T4096, bf16) whose attention
  calls `F.scaled_dot_product_attention` with an explicit causal mask (`mask`), and with
  `is_causal=True` (`causal`): the `attention_choice` rule.
- checkpointing: a 4-layer Llama-1B-shaped model (bf16, B4 x T2048) with Hugging Face's gradient
  checkpointing on every layer (`checkpointed`), and without (`plain`): the `recomputation` rule.
- compile: a 2-block MLP under `torch.compile(dynamic=False)` fed a new Python float each step, so that
  Dynamo recompiles until its recompile limit (1 here) and then runs the forward eagerly (`gives_up`);
  the same float as a 0-d tensor compiles once (`compiles`): the `compile_coverage` rule.
- autocast_microbatch: a 4-block fp32 MLP (d 4096) stepped over 8 micro-batches, `torch.autocast` around
  each (`per_microbatch`: every weight cast 8 times a step), and one autocast region around the step
  (`per_step`): the `copies_and_casts` rule (autocast weight casts).
- float_upcast: a bf16 MLP whose blocks normalise `F.layer_norm(x.float()).to(x.dtype)` (`upcast`),
  and `F.layer_norm(x)` in bf16 (`bf16`): the `copies_and_casts` rule (the model's own dtype casts).

Every variant is timed without the profiler first (CUDA events around each step after warm-up, the
median of `TIMED_STEPS`), then recorded by a `trainprof.session` window (wait 1, warm-up 1, active 2,
then `AFTER_WINDOW_STEPS` steps it times un-profiled) into `DIR/<habit>/<variant>/`. Each habit runs in
a process of its own, bounded by its share of the deadline; inside it each variant is tried on its
own, so one failure keeps the rest. The parent then analyses every folder (`trainprof.analysis.analyze`)
and writes `DIR/results.json`: per variant its median step and the analysis' verdict and findings; per
habit the rule, the predicted gain (the problem's finding), the measured one (problem - fix), and
whether the finding is gone after the fix. The traces go into `DIR/traces.tar.gz` (at most
`TAR_LIMIT_BYTES`: the largest variants are left out past it) and the run folders are removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HABITS: dict[str, tuple[str, str, str]] = {
    # habit: (the rule, the problem variant, the fix variant); compile last: it may take longest
    "attention_mask": ("attention_choice", "mask", "causal"),
    "float_upcast": ("copies_and_casts", "upcast", "bf16"),
    "autocast_microbatch": ("copies_and_casts", "per_microbatch", "per_step"),
    "checkpointing": ("recomputation", "checkpointed", "plain"),
    "compile": ("compile_coverage", "gives_up", "compiles"),
}
WARMUP_STEPS = 3
TIMED_STEPS = 10
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}
AFTER_WINDOW_STEPS = 8
TAR_LIMIT_BYTES = 15 * 2**20
"""The traces' archive stays under 16 MiB, the most a file brings back from the device."""
HABIT_SHARE_S = 44
"""Seconds a habit's process may take by default (five habits in 220 s: the analysis and the archive
after them keep the whole run under 5 minutes); a habit done early leaves its rest to the next."""


def _train_step(model, optimizer, loss_of: Callable) -> None:
    loss_of().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build(habit: str, variant: str) -> Callable[[int], None]:
    """The variant's step function (given the step index)."""
    import torch
    import torch.nn.functional as F

    device = torch.device("cuda")
    torch.manual_seed(0)
    if habit == "attention_mask":
        batch, seq, width, heads = 4, 4096, 1024, 16

        class Block(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
                self.out = torch.nn.Linear(width, width, bias=False)
                self.up = torch.nn.Linear(width, 4 * width, bias=False)
                self.down = torch.nn.Linear(4 * width, width, bias=False)

            def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
                q, k, v = self.qkv(F.rms_norm(x, (width,))).view(batch, seq, 3, heads, -1).unbind(2)
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                if mask is None:
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:  # the habit: a causal mask passed where is_causal would do
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                x = x + self.out(y.transpose(1, 2).reshape(batch, seq, width))
                return x + self.down(F.gelu(self.up(F.rms_norm(x, (width,)))))

        with device:
            blocks = torch.nn.ModuleList(Block() for _ in range(4)).to(torch.bfloat16)
        optimizer = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=True)
        x = torch.randn(batch, seq, width, device=device, dtype=torch.bfloat16)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None, None]

        def loss_of() -> torch.Tensor:
            h = x
            for block in blocks:
                h = block(h, causal if variant == "mask" else None)
            return h.float().pow(2).mean()

        return lambda i: _train_step(blocks, optimizer, loss_of)
    if habit == "checkpointing":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
            num_hidden_layers=4, vocab_size=32000, max_position_embeddings=4096,
        )
        with device:  # initialised on the GPU: a slow host takes seconds for 0.5 B parameters
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        if variant == "checkpointed":
            model.gradient_checkpointing_enable()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, config.vocab_size, (4, 2048), device=device)
        return lambda i: _train_step(model, optimizer, lambda: model(input_ids=ids, labels=ids).loss)
    if habit == "compile":
        from torch import _dynamo

        # A limit of 1 (8 by default): the second value already gives up, one compile instead of eight
        # on a slow host.
        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across releases
            if hasattr(_dynamo.config, name):
                setattr(_dynamo.config, name, 1)
        _dynamo.reset()
        width = 2048
        with device:
            model = torch.nn.Sequential(*[
                layer
                for _ in range(2)
                for layer in (torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                              torch.nn.Linear(4 * width, width))
            ])

        class Scaled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = model

            def forward(self, x: torch.Tensor, scale) -> torch.Tensor:
                return self.body(x) * scale

        compiled = torch.compile(Scaled(), dynamic=False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randn(8, 1024, width, device=device)

        def step(i: int) -> None:
            # The habit: a Python float that changes each step (a schedule's value) specialises the
            # compiled frame; past the recompile limit Dynamo runs the forward eagerly.
            value = 1.0 + 1e-3 * i
            scale = value if variant == "gives_up" else torch.tensor(value, device=device)
            with torch.autocast("cuda", torch.bfloat16):
                _train_step(model, optimizer, lambda: compiled(x, scale).float().pow(2).mean())

        return step
    if habit == "autocast_microbatch":
        width, micro, tokens = 4096, 8, 256
        with device:  # fp32 weights, as autocast training keeps them
            model = torch.nn.Sequential(*[
                torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, width))
                for _ in range(4)
            ])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        batches = [torch.randn(4, tokens, width, device=device) for _ in range(micro)]

        def step(i: int) -> None:
            if variant == "per_microbatch":  # the habit: autocast's cast cache dies with each region
                for batch in batches:
                    with torch.autocast("cuda", torch.bfloat16):
                        loss = model(batch).float().pow(2).mean() / micro
                    loss.backward()
            else:  # the fix: one region for the step's micro-batches, each weight cast once
                with torch.autocast("cuda", torch.bfloat16):
                    for batch in batches:
                        (model(batch).float().pow(2).mean() / micro).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    if habit == "float_upcast":
        width = 2048

        class Block(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.up = torch.nn.Linear(width, 4 * width, bias=False)
                self.down = torch.nn.Linear(4 * width, width, bias=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if variant == "upcast":  # the habit: normalise in fp32 and cast back
                    h = F.layer_norm(x.float(), (width,)).to(x.dtype)
                else:  # the fix: layer_norm takes bf16 and keeps its statistics in fp32 itself
                    h = F.layer_norm(x, (width,))
                return x + self.down(F.gelu(self.up(h)))

        with device:
            model = torch.nn.Sequential(*[Block() for _ in range(8)]).to(torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randn(8, 2048, width, device=device, dtype=torch.bfloat16)
        return lambda i: _train_step(model, optimizer, lambda: model(x).float().pow(2).mean())
    raise ValueError(f"unknown habit {habit!r}")


def run_variant(habit: str, variant: str, out: Path) -> dict:
    """Time the variant's steps without the profiler, then record a session window of it."""
    import torch

    import trainprof
    from benchmarks.busy_scenarios import timed_steps

    step = build(habit, variant)
    row = {
        "habit": habit,
        "variant": variant,
        **timed_steps(step, WARMUP_STEPS, TIMED_STEPS),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    first = WARMUP_STEPS + TIMED_STEPS
    with trainprof.session(log_dir=out / habit, run_name=variant, analyze=False, console=False,
                           tensorboard_scalars=False, **SCHEDULE) as sess:
        for i in range(first, first + sum(SCHEDULE.values()) + AFTER_WINDOW_STEPS):
            step(i)
    torch.cuda.synchronize()
    row["trace_files"] = [str(p.relative_to(out)) for p in sess.trace_files]
    return row


def run_habit(habit: str, out: Path) -> list[dict]:
    """Both variants of a habit in this process, each on its own (a failure is its row's `error`)."""
    import gc

    import torch

    rows = []
    _, problem, fix = HABITS[habit]
    for variant in (problem, fix):
        started = time.time()
        try:
            row = run_variant(habit, variant, out)
        except Exception:  # one variant's failure keeps the other
            row = {"habit": habit, "variant": variant, "error": traceback.format_exc()[-3000:]}
        row["wall_s"] = round(time.time() - started, 1)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "step_ms"})[:2000], flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def analysed(row: dict, out: Path) -> dict:
    """The row with what `trainprof.analysis.analyze` says of its run folder."""
    from trainprof.analysis import analyze

    folder = out / row["habit"] / row["variant"]
    if "error" in row or not folder.is_dir():
        return row
    try:
        result = analyze(folder)
    except Exception:
        return {**row, "analysis_error": traceback.format_exc()[-2000:]}
    summary = result.summary
    findings = []
    for finding in result.findings:
        details = finding.details.to_dict() if finding.details is not None else {}
        findings.append({
            "kind": finding.kind,
            "severity": finding.severity,
            "gpu_ms_per_step": finding.gpu_ms_per_step,
            "predicted_step_ms": details.get("predicted_step_ms"),
            "title": finding.title,
        })
    return {
        **row,
        "verdict": summary.verdict,
        "gpu_step_ms": summary.gpu_step_ms,
        "unprofiled_step_ms": summary.unprofiled_step_ms,
        "mfu_pct": summary.mfu_pct,
        "mfu_achievable_pct": summary.mfu_achievable_pct,
        "findings": findings,
    }


def judged(rows: list[dict]) -> list[dict]:
    """Per habit: the rule's predicted gain on the problem, the measured gain (problem - fix), their
    ratio, and whether the finding is gone after the fix."""
    by_key = {(row["habit"], row["variant"]): row for row in rows}
    table = []
    for habit, (rule, problem, fix) in HABITS.items():
        bad, good = by_key.get((habit, problem)), by_key.get((habit, fix))
        if bad is None or good is None:
            continue
        found = [f for f in bad.get("findings", []) if f["kind"] == rule]
        predicted = found[0]["gpu_ms_per_step"] if found else None
        measured = (
            round(bad["step_ms_median"] - good["step_ms_median"], 3)
            if "step_ms_median" in bad and "step_ms_median" in good else None
        )
        table.append({
            "habit": habit,
            "rule": rule,
            "fires_on_problem": bool(found),
            "predicted_gain_ms": predicted,
            "measured_gain_ms": measured,
            "predicted_over_measured": round(predicted / measured, 3) if predicted and measured else None,
            "gone_after_fix": not [f for f in good.get("findings", []) if f["kind"] == rule]
            if "findings" in good else None,
        })
    return table


def pack(out: Path, rows: list[dict]) -> list[str]:
    """The run folders into `out/traces.tar.gz` under `TAR_LIMIT_BYTES` (the largest left out past
    it), then removed; returns the variants left out."""
    folders = [out / row["habit"] / row["variant"] for row in rows]
    folders = [folder for folder in folders if folder.is_dir()]
    sizes = {folder: sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) for folder in folders}
    kept, total, left_out = [], 0, []
    for folder in sorted(folders, key=lambda f: sizes[f]):  # smallest first: the most variants kept
        if total + sizes[folder] <= TAR_LIMIT_BYTES:
            kept.append(folder)
            total += sizes[folder]
        else:
            left_out.append(str(folder.relative_to(out)))
    with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
        for folder in kept:
            tar.add(folder, arcname=str(folder.relative_to(out)))
    for habit in {row["habit"] for row in rows}:
        shutil.rmtree(out / habit, ignore_errors=True)
    return left_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=",".join(HABITS), help="habits, comma-separated")
    parser.add_argument("--deadline-s", type=float, default=len(HABITS) * HABIT_SHARE_S,
                        help="seconds for every habit's process together")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        for row in run_habit(args.child, out):
            print("ROW " + json.dumps(row), flush=True)
        return 0
    habits = args.only.split(",")
    deadline = time.time() + args.deadline_s
    rows: list[dict] = []
    for index, habit in enumerate(habits):
        share = (deadline - time.time()) / (len(habits) - index)  # what is left, shared out
        command = [sys.executable, "-m", "benchmarks.busy_round_two", "--out", str(out), "--child", habit]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=max(share, 10))
            stdout, stderr = done.stdout, done.stderr
        except subprocess.TimeoutExpired as stopped:
            stdout = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else (stopped.stdout or "")
            stderr = f"timeout after {share:.0f} s"
        found = [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW ")]
        done_variants = {row["variant"] for row in found}
        found += [{"habit": habit, "variant": v, "error": stderr[-2000:]}
                  for v in HABITS[habit][1:] if v not in done_variants]
        rows.extend(found)
        with open(out / "log.txt", "a", encoding="utf-8") as log:  # the children's output, for a failure
            log.write(f"== {habit}\n{stdout[-20000:]}\n{stderr[-20000:]}\n")
        print(habit, [(r["variant"], r.get("step_ms_median"), "error" in r) for r in found], flush=True)
    (out / "results.json").write_text(json.dumps({"variants": rows}, indent=1), encoding="utf-8")
    rows = [analysed(row, out) for row in rows]
    result = {"habits": judged(rows), "variants": rows}
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    result["traces_left_out"] = pack(out, rows)
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result["habits"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
