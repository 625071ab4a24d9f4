"""What does report.html add to a session's end of run? Per trace folder: the size of report.html,
and the time of the session's end-of-run work without it (load the traces, analyse, write
summary.json and report.md, print the console summary) against the time report.html adds (the
views `analyze(views=True)` builds, then rendering and writing the page). TensorBoard's files are
left out of both: their cost is mostly importing tensorboard (~0.8 s, once per process), which
would make report.html's share look smaller than it is.

    python -m benchmarks.report_html                      # the checked-in fixtures, 7 repeats
    python -m benchmarks.report_html --repeat 3 tests/fixtures/traces/gpt2_clean

Prints one table of CPU seconds (`time.process_time`: on a shared machine, wall time measures the
neighbours), the least of `--repeat` runs each on freshly loaded traces, and writes
benchmarks/results/report_html.cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

FIXTURES = (
    "tests/fixtures/traces/gpt2_pathologies",
    "tests/fixtures/traces/gpt2_clean",
    "tests/fixtures/traces/ddp_straggler",
    "tests/fixtures/busy/llama_swap/bare",
    "tests/fixtures/thirdparty/tl_h100_bert_small",
    "tests/fixtures/thirdparty/tl_mi300_resnet_act_ckpt",
)
BUDGET = 0.20
"""report.html may add at most this share to the end-of-run work (issue 19)."""


def _one_run(folder: str, out: Path) -> dict[str, float]:
    from trainprof.analysis import analyze
    from trainprof.analysis import views as views_module
    from trainprof.analysis.kernel_classes import classify_name
    from trainprof.report.console import print_report
    from trainprof.report.html import write_html
    from trainprof.report.json import write_json
    from trainprof.report.markdown import write_markdown
    from trainprof.trace import load_traces

    times: dict[str, float] = {}
    classify_name.cache_clear()  # a session classifies its kernel names once: not cached yet
    start = time.process_time()
    traces = load_traces(folder)
    times["load_s"] = time.process_time() - start
    start = time.process_time()
    analysis = analyze(traces)
    times["analyze_s"] = time.process_time() - start
    start = time.process_time()
    write_json(analysis, out / "summary.json")
    write_markdown(analysis, out / "report.md")
    with open(os.devnull, "w") as devnull:
        print_report(analysis, file=devnull)
    times["write_s"] = time.process_time() - start
    # The same analysis with its views (fresh traces: a trace caches its frames once built); the
    # views' own time is taken inside `trace_views`, not as a difference of two noisy timings.
    traces = load_traces(folder)
    spent = []
    trace_views = views_module.trace_views

    def timed_views(*args):
        start = time.process_time()
        views = trace_views(*args)
        spent.append(time.process_time() - start)
        return views

    views_module.trace_views = timed_views  # `analyze` imports it from the module when it runs
    try:
        with_views = analyze(traces, views=True)
    finally:
        views_module.trace_views = trace_views
    times["views_s"] = sum(spent)
    start = time.process_time()
    written = write_html(with_views, out / "report.html")
    times["html_s"] = time.process_time() - start
    times["html_bytes"] = written.stat().st_size
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", default=list(FIXTURES))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", default="benchmarks/results/report_html.cpu.json")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in args.folders:
            runs = [_one_run(folder, Path(tmp)) for _ in range(args.repeat)]
            row = {key: min(run[key] for run in runs) for key in runs[0]}
            row["folder"] = folder
            row["end_of_run_s"] = row["load_s"] + row["analyze_s"] + row["write_s"]
            row["added_s"] = row["views_s"] + row["html_s"]
            row["added_share"] = row["added_s"] / row["end_of_run_s"]
            rows.append(row)

    print(f"{'trace folder':<46} {'report.html':>11} {'end of run s':>12} {'views s':>8} {'html s':>7} "
          f"{'added':>6}")
    for row in rows:
        print(f"{row['folder']:<46} {row['html_bytes'] / 1024:>8.0f} KiB {row['end_of_run_s']:>12.3f} "
              f"{row['views_s']:>8.3f} {row['html_s']:>7.3f} {100 * row['added_share']:>5.1f}%")
    total_added = sum(row["added_s"] for row in rows)
    total_end = sum(row["end_of_run_s"] for row in rows)
    print(f"all: report.html adds {100 * total_added / total_end:.1f}% (budget {100 * BUDGET:.0f}%)")
    Path(args.json).write_text(json.dumps({
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "repeat": args.repeat, "rows": rows,
        "added_share_all": total_added / total_end,
    }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
