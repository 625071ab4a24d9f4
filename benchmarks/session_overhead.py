"""What does `trainprof.session` cost a training step? (GPU; one run on an H100/H200.)

Per-step time of a GPT-2-small-shaped model (bf16 autocast, fused AdamW), each step timed from
one device synchronize to the next, for:

  (a) the bare loop;
  (b) the loop under trainprof.session, steps outside the recorded window (profiler off);
  (c) bare torch.profiler.profile with the same options, recorded steps;
  (d) the loop under trainprof.session, recorded steps (profiler + sync-site capture).

Also reported: the bare profiler's off steps (what torch's profiler itself costs when off) and the
bare loop run again at the end (drift between the first and the last mode).

Bars: (b)/(a) within 1 %, (d)/(c) within 3 %. The step that closes a window (trace export, and
for trainprof the analysis) is reported apart, as is the session's exit (final analysis, reports).

    python -m benchmarks.session_overhead [--quick] [--out DIR]
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


def host_overhead_us(steps: int = 3000) -> dict:
    """Host microseconds a step costs with and without a session that is not recording.

    Outside its window the session's only per-step work is its optimizer hook and the profiler's
    step bookkeeping; on a one-parameter CPU optimizer that work is the whole difference, free of
    the GPU's noise.
    """
    import trainprof

    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    optimizer = torch.optim.SGD([param], lr=0.0)

    def per_step_us() -> float:
        for _ in range(200):
            optimizer.step()
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        return (time.perf_counter() - start) / steps * 1e6

    bare = [per_step_us() for _ in range(5)]
    with tempfile.TemporaryDirectory() as log_dir:
        sess = trainprof.session(log_dir=log_dir, wait=10**9, warmup=1, active=1, console=False)
        sess.start()
        try:
            session = [per_step_us() for _ in range(5)]
        finally:
            sess.stop()
    return {"bare_us": statistics.median(bare), "session_us": statistics.median(session),
            "added_us": statistics.median(session) - statistics.median(bare)}


def phases(wait: int, warmup: int, active: int, repeat: int, steps: int) -> list[str]:
    """Each step's phase: "off", "starting", "warmup", "active", "closing" (the last active: exports)."""
    from torch.profiler import ProfilerAction, schedule

    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    names = {ProfilerAction.NONE: "off", ProfilerAction.WARMUP: "warmup", ProfilerAction.RECORD: "active",
             ProfilerAction.RECORD_AND_SAVE: "closing"}
    labels = [names[plan(i)] for i in range(steps + 1)]
    # A step's time includes the profiler's transition at its end: the last off step before a
    # window pays for starting the profiler ("starting"), the last active one for the export.
    labels = ["starting" if now == "off" and then != "off" else now
              for now, then in zip(labels, labels[1:], strict=False)]
    # Off steps before the first window, apart: they show whether a window leaves a cost behind.
    return ["off_before_first_window" if i < wait and label == "off" else label
            for i, label in enumerate(labels)]


def median_of(times: list[float], labels: list[str], *phases: str) -> float:
    picked = [t for t, label in zip(times, labels, strict=True) if label in phases]
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

    # Modes run in interleaved blocks of one schedule cycle each (a, c, b/d, a, c, b/d, ...): on a
    # shared machine the step time drifts by several % over a minute, which would swamp a 1 % bar
    # if each mode ran in one stretch.
    wait, warmup, active = 6, 1, 5
    blocks = 2 if args.quick else 12
    steps = wait + warmup + active + 2  # one cycle, then two off steps after the window
    labels = phases(wait, warmup, active, 1, steps)
    options = {"record_shapes": True, "profile_memory": True, "with_stack": True}
    host_cost = host_overhead_us()
    model, optimizer, batches = build(args.quick)
    run_steps(model, optimizer, batches, 15)  # allocator, autotuning, caches

    log_dir = Path(tempfile.mkdtemp(prefix="trainprof_bench_"))
    bare: list[float] = []
    profiled: list[float] = []
    under_session: list[float] = []
    profiled_labels: list[str] = []
    session_labels: list[str] = []
    exit_ms: list[float] = []
    sessions = []
    block_ratios: dict[str, list[float]] = {"b_over_a": [], "d_over_c": []}
    off_phases = ("off", "off_before_first_window")
    for block in range(blocks):
        bare_block = run_steps(model, optimizer, batches, steps)
        bare += bare_block

        prof = profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(log_dir / "bare_profiler"), use_gzip=True),
            **options,
        )
        with prof:
            profiled_block = run_steps(model, optimizer, batches, steps, on_step_end=prof.step)
        profiled += profiled_block
        profiled_labels += labels

        sess = trainprof.session(log_dir=log_dir, run_name=f"trainprof{block}", wait=wait, warmup=warmup,
                                 active=active, repeat=1, console=False, **options)
        sess.start()
        session_block = run_steps(model, optimizer, batches, steps)
        under_session += session_block
        exit_start = time.perf_counter()
        sess.stop()
        exit_ms.append((time.perf_counter() - exit_start) * 1e3)
        session_labels += labels
        sessions.append(sess)
        # Ratios within one block, whose modes ran seconds apart, cancel the machine's slow drift.
        block_ratios["b_over_a"].append(
            median_of(session_block, labels, *off_phases) / statistics.median(bare_block))
        block_ratios["d_over_c"].append(
            median_of(session_block, labels, "active") / median_of(profiled_block, labels, "active"))

    analysis_start = time.perf_counter()
    trainprof.analyze(str(sessions[0].trace_files[0]))
    analysis_ms = (time.perf_counter() - analysis_start) * 1e3
    sess = sessions[-1]

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quick": args.quick,
        "schedule": {"wait": wait, "warmup": warmup, "active": active, "steps_per_block": steps,
                     "blocks": blocks},
        "median_ms": {
            "a_bare": statistics.median(bare),
            "b_session_off": median_of(under_session, session_labels, "off", "off_before_first_window"),
            "b_session_off_before_window": median_of(under_session, session_labels,
                                                     "off_before_first_window"),
            "b_session_off_after_window": median_of(under_session, session_labels, "off"),
            "c_profiler_off": median_of(profiled, profiled_labels, "off", "off_before_first_window"),
            "c_profiler_active": median_of(profiled, profiled_labels, "active"),
            "d_session_active": median_of(under_session, session_labels, "active"),
            "c_profiler_closing_step": median_of(profiled, profiled_labels, "closing"),
            "d_session_closing_step": median_of(under_session, session_labels, "closing"),
        },
        "session_exit_ms_median": statistics.median(exit_ms),
        "analysis_of_one_window_ms": analysis_ms,
        "sync_sites_captured_last_block": len(sess.sync_sites),
        "findings": len(sess.findings),
        "trace_files_last_block": [str(p) for p in sess.trace_files],
    }
    m = result["median_ms"]
    result["ratio_b_over_a_pooled"] = m["b_session_off"] / m["a_bare"]
    result["ratio_d_over_c_pooled"] = m["d_session_active"] / m["c_profiler_active"]
    result["block_ratios"] = block_ratios
    result["ratio_b_over_a"] = statistics.median(block_ratios["b_over_a"])
    result["ratio_d_over_c"] = statistics.median(block_ratios["d_over_c"])
    result["host_us_per_step_outside_window"] = host_cost
    result["pass_b_over_a_within_1pct"] = result["ratio_b_over_a"] <= 1.01
    result["pass_d_over_c_within_3pct"] = result["ratio_d_over_c"] <= 1.03

    print(f"{result['device']}, torch {result['torch']}, {blocks} interleaved blocks of {steps} steps each")
    for name, value in m.items():
        print(f"  {name:<30} {value:9.2f} ms")
    for ratio, bar, passed in (("b_over_a", 1.01, "pass_b_over_a_within_1pct"),
                               ("d_over_c", 1.03, "pass_d_over_c_within_3pct")):
        verdict = "PASS" if result[passed] else "FAIL"
        spread = block_ratios[ratio]
        print(f"  {ratio} = {result['ratio_' + ratio]:.4f} (median of {len(spread)} blocks, "
              f"{min(spread):.3f}..{max(spread):.3f})  bar <= {bar}  {verdict}")
    print(f"  host time the session adds to a step outside the window: {host_cost['added_us']:.1f} us "
          f"({100 * host_cost['added_us'] * 1e-3 / m['a_bare']:.3f}% of a bare step)")
    exit_median = statistics.median(exit_ms)
    print(f"  session exit {exit_median:.0f} ms (median), analysis of one window {analysis_ms:.0f} ms")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "session_overhead.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
