"""How fast is trainprof's load+analysis against HolisticTraceAnalysis on the same trace folders?

Each measurement runs in a fresh subprocess and reports wall seconds (load + analysis, timed inside
the child after its imports) and the child's peak RSS (`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`). Three
contenders per fixture: trainprof in-process (`analyze(path)`), trainprof as a whole cold process
(`trainprof analyze PATH --json`, interpreter start and imports included), and HTA
(`TraceAnalysis(trace_dir=...)` plus its temporal, idle-time and kernel breakdowns).

    python benchmarks/analyze_speed.py --hta-python /tmp/hta/bin/python --out speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURES = Path(
    os.environ.get("TRAINPROF_FIXTURES") or REPO.parent / "shared" / "fixtures" / "traces"
)

TRAINPROF_CHILD = """
import sys, time
from trainprof.analysis import analyze
t0 = time.perf_counter()
result = analyze(sys.argv[1]).to_dict()
print(time.perf_counter() - t0)
"""

# HTA reads every trace file in trace_dir; the fixture folders also hold truth.json, so the child
# analyzes a temporary folder of links to the trace files only.
HTA_CHILD = """
import sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
for name in ("get_temporal_breakdown", "get_idle_time_breakdown", "get_gpu_kernel_breakdown",
             "get_comm_comp_overlap", "get_cuda_kernel_launch_stats"):
    method = getattr(analyzer, name, None)
    if method is None:
        continue
    try:
        method(visualize=False)
    except TypeError:
        method()
    except Exception:  # e.g. no NCCL kernels for the overlap breakdown: skip, as a user would
        pass
print(time.perf_counter() - t0)
"""


def run_child(argv: list[str], env: dict | None = None) -> dict:
    """Run one measurement in a fresh process; wall time, in-child time and peak RSS (MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    inner = last if last.replace(".", "", 1).replace("e-", "", 1).isdigit() else ""
    # ru_maxrss of RUSAGE_CHILDREN is the max over all children so far: only meaningful when it grew.
    return {
        "process_s": round(wall, 3),
        "load_analyze_s": round(float(inner), 3) if inner else None,
        "peak_rss_mib": round(peak_kib / 1024, 1) if peak_kib > before else None,
    }


def best_of(runs: list[dict]) -> dict:
    """Each time's minimum over the runs (noise on a shared machine only adds), and the largest peak RSS."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]

    def pick(key: str, choose) -> float | None:
        values = [run[key] for run in good if run.get(key) is not None]
        return choose(values) if values else None

    return {"process_s": pick("process_s", min), "load_analyze_s": pick("load_analyze_s", min),
            "peak_rss_mib": pick("peak_rss_mib", max), "runs": len(good)}


def trace_links(folder: Path, into: Path) -> Path:
    """A folder holding only the trace files of `folder` (symlinks)."""
    into.mkdir()
    for file in folder.iterdir():
        if file.name.endswith((".pt.trace.json", ".pt.trace.json.gz")):
            (into / file.name).symlink_to(file)
    return into


def main() -> None:
    """Measure each fixture folder and print a table (and JSON to --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    parser.add_argument("--hta-python", default=None, help="interpreter of a venv with HolisticTraceAnalysis")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement; the fastest is kept")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    for folder in sorted(p for p in args.fixtures.iterdir() if p.is_dir()):
        size_mb = sum(f.stat().st_size for f in folder.glob("*.pt.trace.json*")) / 1e6
        row = {"fixture": folder.name, "gz_mb": round(size_mb, 2)}
        contenders = {
            "trainprof": [sys.executable, "-c", TRAINPROF_CHILD, str(folder)],
            "trainprof_cli": [sys.executable, "-m", "trainprof", "analyze", str(folder), "--json"],
        }
        with tempfile.TemporaryDirectory() as tmp:
            if args.hta_python:
                contenders["hta"] = [
                    args.hta_python,
                    "-c",
                    HTA_CHILD,
                    str(trace_links(folder, Path(tmp) / "t")),
                ]
            for name, argv in contenders.items():
                # Peak RSS needs a process whose peak exceeds every earlier child's: measure it in a
                # fresh wrapper process each time (the wrapper's RUSAGE_CHILDREN starts at zero).
                runs = []
                for _ in range(args.repeat):
                    runs.append(json.loads(
                        subprocess.run(
                            [sys.executable, __file__, "--measure", json.dumps(argv)],
                            capture_output=True,
                            text=True,
                            env=env,
                            cwd=REPO,
                        ).stdout
                        or '{"error": "no output"}'
                    ))
                row[name] = best_of(runs)
        rows.append(row)

    header = (
        f"{'fixture':18} {'gz MB':>6} | {'load+analysis s':>15} {'HTA s':>6} {'ratio':>6} |"
        f" {'whole process s':>15} {'HTA s':>6} {'ratio':>6} | {'peak MiB':>8} {'HTA MiB':>8}"
    )
    print(header)
    print("-" * len(header))

    def ratio(slow: float | None, fast: float | None) -> float | None:
        return round(slow / fast, 1) if slow and fast else None

    for row in rows:
        tp, cli, hta = row["trainprof"], row["trainprof_cli"], row.get("hta") or {}
        row["speedup_in_process"] = ratio(hta.get("load_analyze_s"), tp.get("load_analyze_s"))
        row["speedup_whole_process"] = ratio(hta.get("process_s"), cli.get("process_s"))
        print(
            f"{row['fixture']:18} {row['gz_mb']:6.2f} | {tp.get('load_analyze_s') or 0:15.3f}"
            f" {hta.get('load_analyze_s') or 0:6.2f} {row['speedup_in_process'] or 0:5.1f}x |"
            f" {cli.get('process_s') or 0:15.3f} {hta.get('process_s') or 0:6.2f}"
            f" {row['speedup_whole_process'] or 0:5.1f}x |"
            f" {cli.get('peak_rss_mib') or 0:8.0f} {hta.get('peak_rss_mib') or 0:8.0f}"
        )
    if args.out:
        args.out.write_text(json.dumps({"python": sys.version.split()[0], "rows": rows}, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        print(json.dumps(run_child(json.loads(sys.argv[2]))))
    else:
        main()
