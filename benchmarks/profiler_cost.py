"""How much longer does each torch.profiler option make a recorded step? Run on a GPU.

    python -m benchmarks.profiler_cost --out profiler_cost.json
    python -m benchmarks.profiler_cost --out profiler_cost.json --only small_mlp/eager

Each loop of `benchmarks.busy_scenarios` named in `--only` runs in one process: warm-up steps, then
one `trainprof.session` per setting below (wait 1, warm-up 1, 2 recorded steps, then 8 steps after
the window that the session times un-profiled), the settings in turn, `--rounds` times. Each row is
one session: the recorded step (the analysis' mean step), the median un-profiled step, and the
verdict with and without the un-profiled steps (`analysis.profiler_cost`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

SETTINGS: dict[str, dict[str, bool]] = {
    "stack+shapes+memory": {},  # trainprof.session's defaults
    "shapes+memory": {"with_stack": False},
    "memory": {"with_stack": False, "record_shapes": False},
    "none": {"with_stack": False, "record_shapes": False, "profile_memory": False},
}
DEFAULT_LOOPS = "small_mlp/eager,gpt2_attention/sdpa_vocab64"


def measure(scenario: str, variant: str, rounds: int, scratch: Path) -> list[dict]:
    """One row per session: each setting, `rounds` times, in turn."""
    import trainprof
    from benchmarks.busy_scenarios import SCHEDULE, WARMUP_STEPS, build
    from trainprof.analysis import analyze
    from trainprof.trace import load_traces

    step, _ = build(scenario, variant)
    done = 0
    for _ in range(WARMUP_STEPS):
        step(done)
        done += 1
    rows = []
    for round_ in range(rounds):
        for name, options in SETTINGS.items():
            run = f"{scenario}-{variant}-{name}-{round_}"
            with trainprof.session(log_dir=scratch, run_name=run, console=False, tensorboard_scalars=False,
                                   **SCHEDULE, **options) as sess:
                for _ in range(sum(SCHEDULE.values()) + 8):
                    step(done)
                    done += 1
            torch.cuda.synchronize()
            traces = [t for path in sess.trace_files for t in load_traces(str(path))]
            for trace in traces:
                trace.unprofiled_step_ms = None
            alone = analyze(traces)
            rows.append({
                "loop": f"{scenario}/{variant}",
                "setting": name,
                "round": round_,
                "recorded_step_ms": sess.summary.mean_step_ms,
                "unprofiled_step_ms": sess.summary.unprofiled_step_ms,
                "slowdown_pct": sess.summary.profiler_slowdown_pct,
                "unprofiled_steps": sorted(sess.unprofiled_step_ms),
                "verdict": sess.summary.verdict,
                "verdict_from_the_trace_alone": alone.summary.verdict,
            })
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "unprofiled_steps"}), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--only", default=DEFAULT_LOOPS, help="scenario/variant loops, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for loop in args.only.split(","):
            scenario, variant = loop.split("/")
            rows += measure(scenario, variant, args.rounds, Path(scratch))
    summary = {}
    for row in rows:
        summary.setdefault((row["loop"], row["setting"]), []).append(row)
    table = [
        {
            "loop": loop,
            "setting": setting,
            "recorded_step_ms": [r["recorded_step_ms"] for r in group],
            "unprofiled_step_ms": [r["unprofiled_step_ms"] for r in group],
            "slowdown_pct_median": statistics.median(r["slowdown_pct"] for r in group),
            "verdicts": sorted({r["verdict"] for r in group}),
            "verdicts_from_the_trace_alone": sorted({r["verdict_from_the_trace_alone"] for r in group}),
        }
        for (loop, setting), group in summary.items()
    ]
    document = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "table": table,
        "rows": rows,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
