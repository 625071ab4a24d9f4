"""How fast is trainprof's load+analysis against HolisticTraceAnalysis on the same trace folders?

Each measurement runs in a fresh subprocess and reports wall seconds (load + analysis, timed inside
the child after its imports) and the child's peak RSS (`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`).
Three contenders per fixture: trainprof in-process (`analyze(path)`; `from trainprof.analysis import
analyze` imports every analysis module before the clock starts, as HTA's child imports
`TraceAnalysis` first), trainprof as a whole cold process (`trainprof analyze PATH --json`,
interpreter start and imports included), and HTA (`TraceAnalysis(trace_dir=...)` plus its temporal,
idle-time and kernel breakdowns).

Both run from compiled bytecode, as an installed package does: the children write and read it in a
scratch `PYTHONPYCACHEPREFIX` (even where `PYTHONDONTWRITEBYTECODE` is set), after one untimed run
of each contender. Each figure is the median of `--repeat` runs, with their range.

    python -m benchmarks.analyze_speed --hta-python /tmp/hta/bin/python --out speed.json

Scaling (time and peak RSS against trace size; synthetic traces made by repeating a real fixture's
steps into a scratch folder, deleted after each measurement, never committed):

    python -m benchmarks.analyze_speed --scale tests/fixtures/traces/gpt2_pathologies/*.gz /tmp/s 1 4 16 \
        --out scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURES = REPO / "tests" / "fixtures" / "traces"

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


def run_child(argv: list[str]) -> dict:
    """Run one measurement in a fresh process; wall time, in-child time and peak RSS (MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
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


def measure_argv(argv: list[str]) -> list[str]:
    """The command that measures `argv` in a fresh wrapper process: this module again, `--measure`.
    Run with `-m` from the repository root, so the wrapper and its `-c` / `-m` child import this
    checkout's trainprof."""
    return [sys.executable, "-m", "benchmarks.analyze_speed", "--measure", json.dumps(argv)]


def median_of(runs: list[dict]) -> dict:
    """Each figure's median over the runs, with its range (`*_range`: lowest, highest)."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]
    summary: dict = {"runs": len(good)}
    for key in ("process_s", "load_analyze_s", "peak_rss_mib"):
        values = [run[key] for run in good if run.get(key) is not None]
        summary[key] = round(statistics.median(values), 3) if values else None
        summary[f"{key}_range"] = [min(values), max(values)] if values else None
    return summary


def compiled_bytecode_env(cache: Path) -> dict[str, str]:
    """The children's environment: bytecode written to and read from `cache`, as from an install."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


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
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement; the median is kept")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    rows = []
    bytecode = tempfile.TemporaryDirectory()
    env = compiled_bytecode_env(Path(bytecode.name))
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
                for run in range(args.repeat + 1):  # the first writes the bytecode: not kept
                    done = subprocess.run(
                        measure_argv(argv), capture_output=True, text=True, cwd=REPO, env=env
                    )
                    if run:
                        runs.append(json.loads(done.stdout or '{"error": "no output"}'))
                row[name] = median_of(runs)
        rows.append(row)
    bytecode.cleanup()

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


def repeat_steps(source: Path, copies: int, out: Path) -> Path:
    """A synthetic trace: `source`'s events `copies` times over, each copy shifted in time past the
    previous one, with its step numbers and correlation ids renumbered (never committed: written to
    `out`, a scratch folder)."""
    import gzip

    import msgspec

    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as handle:
        document = msgspec.json.decode(handle.read())
    events = document["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    top_correlation = (
        max(
            (e.get("args", {}).get("correlation", 0) for e in events if isinstance(e.get("args"), dict)),
            default=0,
        )
        + 1
    )
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_count = max((int(e["name"].split("#")[1]) for e in steps), default=0) + 1
    repeated = [e for e in events if not isinstance(e.get("ts"), (int, float))]
    for copy in range(copies):
        for event in timed:
            shifted = dict(event, ts=event["ts"] + copy * span)
            args = event.get("args")
            if isinstance(args, dict) and "correlation" in args:
                shifted["args"] = dict(args, correlation=args["correlation"] + copy * top_correlation)
            if str(event.get("name", "")).startswith("ProfilerStep#"):
                shifted["name"] = f"ProfilerStep#{int(event['name'].split('#')[1]) + copy * step_count}"
            repeated.append(shifted)
    document["traceEvents"] = repeated
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"x{copies}.pt.trace.json"
    path.write_bytes(msgspec.json.encode(document))
    return path


SCALE_CHILD = """
import sys, time, resource
from trainprof.analysis import analyze
t0 = time.perf_counter()
analyze(sys.argv[1])
print(time.perf_counter() - t0)
"""


def scale(source: Path, copies: list[int], scratch: Path, out: Path | None = None) -> None:
    """Analysis time and peak RSS against trace size: `source` repeated 1, 4, 16, ... times
    (the rows also as JSON to `out`, when given)."""
    rows = []
    print(f"{'copies':>6} {'JSON MB':>8} {'steps':>6} | {'load+analysis s':>15} {'peak MiB':>9}")
    for count in copies:
        folder = scratch / f"x{count}"
        path = repeat_steps(source, count, folder)
        size_mb = path.stat().st_size / 1e6
        argv = [sys.executable, "-c", SCALE_CHILD, str(folder)]
        measured = json.loads(
            subprocess.run(
                measure_argv(argv),
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout
            or '{"error": "no output"}'
        )
        print(
            f"{count:6d} {size_mb:8.0f} {3 * count:6d} | {measured.get('load_analyze_s') or 0:15.2f}"
            f" {measured.get('peak_rss_mib') or 0:9.0f}",
            flush=True,
        )
        rows.append({"copies": count, "json_mb": round(size_mb, 1), "steps": 3 * count, **measured})
        path.unlink()
    if out is not None:
        document = {"python": sys.version.split()[0], "source": str(source), "rows": rows}
        out.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        print(json.dumps(run_child(json.loads(sys.argv[2]))))
    elif len(sys.argv) >= 2 and sys.argv[1] == "--scale":
        # --scale SOURCE_TRACE SCRATCH_DIR COPIES... [--out FILE]
        # (e.g. gpt2_pathologies' trace, /tmp/s, 1 4 16 64)
        argv = sys.argv[2:]
        out = None
        if "--out" in argv:
            at = argv.index("--out")
            out = Path(argv[at + 1])
            del argv[at : at + 2]
        scale(Path(argv[0]), [int(c) for c in argv[2:]], Path(argv[1]), out)
    else:
        main()
