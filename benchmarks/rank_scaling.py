"""How do time and memory of `trainprof analyze DIR` grow with the number of ranks?

    python -m benchmarks.rank_scaling --out benchmarks/results/rank_scaling.cpu.json

Synthetic ranks built from the fixtures: rank k is a copy of one of `ddp_straggler`'s two H200
traces (even ranks rank 0's, odd ranks rank 1's, 7.3 and 7.2 MB of JSON) with its
`distributedInfo` rank and world size rewritten, in a scratch folder deleted afterwards. For each
rank count, `analyze(folder)` runs in a fresh process (its default: one worker process per core,
each holding one trace at a time), while a thread of that process adds up every 20 ms the resident
memory of the process and of its descendants (the workers): the peak of the sum, of the parent
alone and of the largest worker. Then `analyze(folder, workers=1)`: the same one trace at a time, in
the process itself. For contrast, up to `--one-process-max` ranks, the folder loaded into one
process first (`analyze(load_traces(folder))`: every trace in memory at once).

Time should grow linearly with the ranks (the fit's R² and seconds per rank are printed) and the
workers' memory stay that of one trace, whatever the rank count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASES = sorted((REPO / "tests" / "fixtures" / "traces" / "ddp_straggler").glob("*.pt.trace.json.gz"))
RANK_COUNTS = (1, 8, 16, 32, 64)

CHILD = """
import json, sys, threading, time
import psutil
me = psutil.Process()
peaks = {"total": 0, "parent": 0, "worker": 0}
worker_cpu = {}  # pid -> the last CPU seconds seen (a worker's last 20 ms may be missed)
done = threading.Event()

def sample():
    while not done.is_set():
        try:
            children = me.children(recursive=True)
            parent = me.memory_info().rss
            workers = []
            for child in children:
                try:
                    workers.append(child.memory_info().rss)
                    cpu = child.cpu_times()
                    worker_cpu[child.pid] = cpu.user + cpu.system
                except psutil.Error:
                    pass
            peaks["total"] = max(peaks["total"], parent + sum(workers))
            peaks["parent"] = max(peaks["parent"], parent)
            peaks["worker"] = max([peaks["worker"], *workers])
        except psutil.Error:
            pass
        done.wait(0.02)

threading.Thread(target=sample, daemon=True).start()
from trainprof.analysis import analyze
from trainprof.trace import load_traces
start = time.perf_counter()
if sys.argv[2] == "workers":
    result = analyze(sys.argv[1])
elif sys.argv[2] == "serial":
    result = analyze(sys.argv[1], workers=1)
else:
    result = analyze(load_traces(sys.argv[1]))
seconds = time.perf_counter() - start
done.set()
time.sleep(0.05)
assert len(result.traces) == int(sys.argv[3]), len(result.traces)
mib = {key + "_mib": round(value / 2**20, 1) for key, value in peaks.items()}
own = me.cpu_times()
cpu_s = own.user + own.system + sum(worker_cpu.values())
print(json.dumps({"seconds": round(seconds, 3), "cpu_s": round(cpu_s, 2), **mib}))
"""


def build_ranks(count: int, folder: Path) -> Path:
    """`count` rank traces in `folder` (module docstring)."""
    folder.mkdir(parents=True)
    texts = [gzip.decompress(base.read_bytes()).decode() for base in BASES]
    for rank in range(count):
        text = texts[rank % len(texts)]
        # distributedInfo is one object near the top: {"backend": "nccl", "rank": R, "world_size": W, ...}
        text = re.sub(r'("distributedInfo": \{"backend": "nccl", "rank": )\d+(, "world_size": )\d+',
                      rf"\g<1>{rank}\g<2>{count}", text, count=1)
        (folder / f"rank{rank}.{1795302433816535958 + rank}.pt.trace.json.gz").write_bytes(
            gzip.compress(text.encode(), compresslevel=1)
        )
    return folder


def measure(folder: Path, how: str, ranks: int, repeat: int) -> dict:
    """The fastest of `repeat` fresh-process runs, with the largest peaks."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", CHILD, str(folder), how, str(ranks)],
                              capture_output=True, text=True, cwd=REPO, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "seconds": min(run["seconds"] for run in runs),
        "cpu_s": min(run["cpu_s"] for run in runs),
        **{key: max(run[key] for run in runs) for key in ("total_mib", "parent_mib", "worker_mib")},
    }


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (a, b, R²)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, RANK_COUNTS)))
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement; the fastest is kept")
    parser.add_argument("--one-process-max", type=int, default=16,
                        help="largest rank count also measured with every trace loaded in one process")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    counts = [int(c) for c in args.ranks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            folder = build_ranks(count, Path(tmp) / f"ranks{count}")
            row = {"ranks": count, "workers": measure(folder, "workers", count, args.repeat),
                   "serial": measure(folder, "serial", count, args.repeat)}
            if count <= args.one_process_max:
                row["one_process"] = measure(folder, "one_process", count, args.repeat)
            rows.append(row)
            print(json.dumps(row), flush=True)
            for file in folder.iterdir():
                file.unlink()
    fit = {}
    for how in ("workers", "serial"):
        for measure_of in ("seconds", "cpu_s"):
            a, b, r2 = linear_fit([r["ranks"] for r in rows], [r[how][measure_of] for r in rows])
            line = {"intercept": round(a, 3), "per_rank": round(b, 4), "r2": round(r2, 4)}
            fit[f"{how} {measure_of}"] = line
    print("| ranks | workers: s | CPU s | total peak MiB | parent MiB | largest worker MiB | one trace at a "
          "time in-process: s | CPU s | MiB | all loaded in one process: s | MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        w, s, one = row["workers"], row["serial"], row.get("one_process")
        tail = f"{one['seconds']:.2f} | {one['total_mib']:.0f}" if one else "- | -"
        print(f"| {row['ranks']} | {w['seconds']:.2f} | {w['cpu_s']:.1f} | {w['total_mib']:.0f} | "
              f"{w['parent_mib']:.0f} | {w['worker_mib']:.0f} | {s['seconds']:.2f} | {s['cpu_s']:.1f} | "
              f"{s['total_mib']:.0f} | {tail} |")
    for name, line in fit.items():
        print(f"{name} = {line['intercept']:.2f} + {line['per_rank']:.3f} x ranks, R² {line['r2']:.4f}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "fit": fit}, indent=1) + "\n")


if __name__ == "__main__":
    main()
