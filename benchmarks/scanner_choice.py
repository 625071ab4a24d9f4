"""Does the loader's C scanner (`trainprof/trace/_scan.c`) pay against msgspec on large traces, and does
the C forest walk (`trainprof/trace/_forest.c`) pay against its numpy twin?

Each run is a fresh process that loads one synthetic trace (`analyze_speed.repeat_steps`: a fixture's
steps repeated, written to a scratch folder, deleted after) and then analyses it, timing the load and
the load+analysis apart; peak RSS is the child's (`ru_maxrss`). Three configurations, alternated run by
run so that a noisy neighbour spreads over all of them: both C modules, msgspec instead of the scanner
(`load._scan = None`), numpy instead of the forest walk (`model._forest = None`). Each figure is the
median of `--repeat` runs, with the range.

    python -m benchmarks.scanner_choice tests/fixtures/traces/gpt2_pathologies/*.gz /tmp/scan 16 32 \
        --out benchmarks/results/scanner_choice.cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.analyze_speed import REPO, repeat_steps

CHILD = """
import json, resource, sys, time
from trainprof.analysis import analyze
from trainprof.trace import load, model
from trainprof.trace.load import load_traces
if sys.argv[2] == "msgspec":
    load._scan = None
if sys.argv[2] == "numpy_forest":
    model._forest = None
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
t0, c0 = time.perf_counter(), cpu()
traces = load_traces(sys.argv[1])
t1, c1 = time.perf_counter(), cpu()
analyze(traces)
t2, c2 = time.perf_counter(), cpu()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"load_s": t1 - t0, "analysis_s": t2 - t1, "load_analyze_s": t2 - t0,
                  "load_cpu_s": c1 - c0, "analysis_cpu_s": c2 - c1, "peak_rss_mib": peak}))
"""

CONFIGS = ("c_scanner", "msgspec", "numpy_forest")
FIGURES = ("load_s", "analysis_s", "load_analyze_s", "load_cpu_s", "analysis_cpu_s", "peak_rss_mib")


def measure(folder: Path, config: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), config], capture_output=True,
                          text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    """Each figure's median and range over the runs."""
    out: dict = {"runs": len(runs)}
    for key in FIGURES:
        values = [run[key] for run in runs]
        out[key] = round(statistics.median(values), 3)
        out[f"{key}_range"] = [round(min(values), 3), round(max(values), 3)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a fixture's trace file to repeat")
    parser.add_argument("scratch", type=Path, help="a scratch folder for the synthetic traces")
    parser.add_argument("copies", type=int, nargs="+")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    rows = []
    for copies in args.copies:
        folder = args.scratch / f"x{copies}"
        path = repeat_steps(args.source, copies, folder)
        size_mb = path.stat().st_size / 1e6
        measure(folder, "c_scanner")  # untimed: the file into the page cache
        runs: dict[str, list[dict]] = {config: [] for config in CONFIGS}
        for _ in range(args.repeat):
            for config in CONFIGS:
                runs[config].append(measure(folder, config))
        row = {"copies": copies, "json_mb": round(size_mb, 1)}
        row.update({config: summary(runs[config]) for config in CONFIGS})
        rows.append(row)
        path.unlink()
        for config in CONFIGS:
            s = row[config]
            print(f"{copies:3d} copies {size_mb:4.0f} MB {config:12}", "  ".join(
                f"{key} {s[key]} {s[key + '_range']}" for key in FIGURES), flush=True)
    if args.out:
        document = {"python": sys.version.split()[0], "source": str(args.source.resolve().relative_to(REPO)),
                    "rows": rows}
        args.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
