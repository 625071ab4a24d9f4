"""What does `trainprof.session` cost a training step? (GPU; one run on an H100/H200.)

Per-step time of a GPT-2-small-shaped model (bf16 autocast, fused AdamW), each step timed from
one device synchronize to the next, for:

  (a) the bare loop;
  (b) the loop under trainprof.session, steps outside the recorded window (profiler off);
  (c) bare torch.profiler.profile with the same options, recorded steps;
  (d) the loop under trainprof.session, recorded steps (profiler + sync-site capture).

Bars: (b)/(a) within 1 %, (d)/(c) within 3 %. The step that closes a window (trace export, and
for trainprof the analysis) is reported apart, as is the session's exit (final analysis, reports).

    python benchmarks/session_overhead.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

# Bound before any session patches `torch.cuda.synchronize`: the timer's own syncs are not captured.
_synchronize = torch.cuda.synchronize


def build(quick: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    layers = 4 if quick else 12
    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=512)
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batches = [torch.randint(0, config.vocab_size, (8, 512), device="cuda") for _ in range(4)]
    return model, optimizer, batches


def run_steps(model, optimizer, batches, steps: int, on_step_end=None) -> list[float]:
    """Run `steps` steps; returns each step's milliseconds (synchronize to synchronize)."""
    times = []
    _synchronize()
    start = time.perf_counter()
    for i in range(steps):
        ids = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()  # ends the step for trainprof (and steps the bare profiler below)
        optimizer.zero_grad(set_to_none=True)
        if on_step_end is not None:
            on_step_end()
        _synchronize()
        end = time.perf_counter()
        times.append((end - start) * 1e3)
        start = end
    return times


def phases(wait: int, warmup: int, active: int, repeat: int, steps: int) -> list[str]:
    """The schedule's phase of each step: "off", "warmup", "active", "closing" (last active, exports)."""
    from torch.profiler import ProfilerAction, schedule

    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    names = {ProfilerAction.NONE: "off", ProfilerAction.WARMUP: "warmup", ProfilerAction.RECORD: "active",
             ProfilerAction.RECORD_AND_SAVE: "closing"}
    return [names[plan(i)] for i in range(steps)]


def median_of(times: list[float], labels: list[str], phase: str) -> float:
    picked = [t for t, label in zip(times, labels, strict=True) if label == phase]
    return statistics.median(picked) if picked else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, 2 windows (a smoke run)")
    parser.add_argument("--out", help="folder for session_overhead.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("session_overhead.py needs a CUDA GPU")

    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    import trainprof

    wait, warmup, active, repeat = 10, 1, 5, (2 if args.quick else 6)
    steps = (wait + warmup + active) * repeat + wait  # end on an off stretch
    labels = phases(wait, warmup, active, repeat, steps)
    options = {"record_shapes": True, "profile_memory": True, "with_stack": True}
    model, optimizer, batches = build(args.quick)
    run_steps(model, optimizer, batches, 15)  # allocator, autotuning, caches

    bare = run_steps(model, optimizer, batches, steps)

    log_dir = Path(tempfile.mkdtemp(prefix="trainprof_bench_"))
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=tensorboard_trace_handler(str(log_dir / "bare_profiler"), use_gzip=True),
        **options,
    )
    with prof:
        profiled = run_steps(model, optimizer, batches, steps, on_step_end=prof.step)

    sess = trainprof.session(log_dir=log_dir, run_name="trainprof", wait=wait, warmup=warmup, active=active,
                             repeat=repeat, console=False, **options)
    sess.start()
    under_session = run_steps(model, optimizer, batches, steps)
    exit_start = time.perf_counter()
    sess.stop()
    exit_ms = (time.perf_counter() - exit_start) * 1e3

    analysis_start = time.perf_counter()
    trainprof.analyze(str(sess.trace_files[0]))
    analysis_ms = (time.perf_counter() - analysis_start) * 1e3

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quick": args.quick,
        "schedule": {"wait": wait, "warmup": warmup, "active": active, "repeat": repeat, "steps": steps},
        "median_ms": {
            "a_bare": statistics.median(bare),
            "b_session_off": median_of(under_session, labels, "off"),
            "c_profiler_active": median_of(profiled, labels, "active"),
            "d_session_active": median_of(under_session, labels, "active"),
            "c_profiler_closing_step": median_of(profiled, labels, "closing"),
            "d_session_closing_step": median_of(under_session, labels, "closing"),
        },
        "session_exit_ms": exit_ms,
        "analysis_of_one_window_ms": analysis_ms,
        "sync_sites_captured": len(sess.sync_sites),
        "findings": len(sess.findings),
        "trace_files": [str(p) for p in sess.trace_files],
    }
    m = result["median_ms"]
    result["ratio_b_over_a"] = m["b_session_off"] / m["a_bare"]
    result["ratio_d_over_c"] = m["d_session_active"] / m["c_profiler_active"]
    result["pass_b_over_a_within_1pct"] = result["ratio_b_over_a"] <= 1.01
    result["pass_d_over_c_within_3pct"] = result["ratio_d_over_c"] <= 1.03

    print(f"{result['device']}, torch {result['torch']}, {steps} steps per mode")
    for name, value in m.items():
        print(f"  {name:<26} {value:9.2f} ms")
    for ratio, bar, passed in (("b_over_a", 1.01, "pass_b_over_a_within_1pct"),
                               ("d_over_c", 1.03, "pass_d_over_c_within_3pct")):
        verdict = "PASS" if result[passed] else "FAIL"
        print(f"  {ratio} = {result['ratio_' + ratio]:.4f}  bar <= {bar}  {verdict}")
    print(f"  session exit {exit_ms:.0f} ms, analysis of one window {analysis_ms:.0f} ms")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "session_overhead.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
