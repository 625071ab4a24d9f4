"""What do time and memory of `trainprof analyze DIR` become when torchrun splits the folder over
several processes?

    python -m benchmarks.job_scaling --out benchmarks/results/job_scaling.cpu.json

The folders are `rank_scaling`'s (rank k a copy of one of `ddp_straggler`'s two H200 traces with its
rank rewritten), built in a scratch folder deleted afterwards. Each command runs as a user runs it,
in a fresh process tree, its JSON report to a file:

- one process: `python -m trainprof analyze DIR --json` (its default: forked workers, one per core);
- P processes: `python -m torch.distributed.run --standalone --nproc_per_node P -m trainprof analyze
  DIR --json` (torchrun's agent, then P processes, each analysing its share and importing torch to
  reach the job's store).

Per run: the wall time of the whole command, the CPU seconds of every process in it, the largest
peak resident memory of any one process (`wait4`'s `ru_maxrss`, exact) and the peak of the tree's
summed resident memory (sampled every 20 ms; pages a process shares with another, torch's libraries
among them, count in each). The runs of one repeat go round the commands in turn, so that a busy
spell of the shared machine slows every command alike; each job's report must equal the single
process's, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.rank_scaling import build_ranks

REPO = Path(__file__).resolve().parents[1]
RANK_COUNTS = (8, 32, 64)
PROCESS_COUNTS = (1, 2, 4)
SAMPLE_S = 0.02


def command(folder: Path, processes: int) -> list[str]:
    """The command line of one run (module docstring)."""
    analyze = ["-m", "trainprof", "analyze", str(folder), "--json"]
    if processes == 1:
        return [sys.executable, *analyze]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [sys.executable, *launcher, *analyze]


def run_once(folder: Path, processes: int, out: Path) -> dict:
    """One fresh run: wall s, CPU s, the largest process's peak MiB, the tree's summed peak MiB."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    summed = [0]
    done = threading.Event()
    start = time.perf_counter()
    errors = out.with_suffix(".stderr")
    with out.open("w") as stdout, errors.open("w") as stderr:
        child = subprocess.Popen(command(folder, processes), stdout=stdout, stderr=stderr, cwd=REPO, env=env)

    def sample() -> None:
        while not done.is_set():
            try:
                root = psutil.Process(child.pid)
                tree = [root, *root.children(recursive=True)]
                total = 0
                for process in tree:
                    try:
                        total += process.memory_info().rss
                    except psutil.Error:
                        pass
                summed[0] = max(summed[0], total)
            except psutil.Error:
                pass
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{command(folder, processes)} exited {child.returncode}: "
                           f"{errors.read_text(errors='replace')[-2000:]}")
    return {
        "seconds": round(seconds, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "largest_process_mib": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "summed_mib": round(summed[0] / 2**20, 1),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, RANK_COUNTS)))
    parser.add_argument("--processes", default=",".join(map(str, PROCESS_COUNTS)))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rank_counts = [int(c) for c in args.ranks.split(",")]
    process_counts = [int(c) for c in args.processes.split(",")]
    runs: dict[tuple[int, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in rank_counts:
            folder = build_ranks(ranks, Path(tmp) / f"ranks{ranks}")
            for _ in range(args.repeat):
                reference = None
                for processes in process_counts:
                    out = Path(tmp) / f"report{processes}.json"
                    row = run_once(folder, processes, out)
                    report = out.read_bytes()
                    if reference is None:
                        reference = report
                    elif report != reference:
                        raise AssertionError(f"{processes} processes over {ranks} ranks: another report")
                    runs.setdefault((ranks, processes), []).append(row)
                    print(json.dumps({"ranks": ranks, "processes": processes, **row}), flush=True)
            for file in folder.iterdir():
                file.unlink()
    rows = []
    for (ranks, processes), measured in runs.items():
        rows.append({"ranks": ranks, "processes": processes, "runs": measured,
                     **{key: spread([run[key] for run in measured])
                        for key in ("seconds", "cpu_s", "largest_process_mib", "summed_mib")}})
    print("| ranks | processes | wall s (median, min-max) | CPU s | largest process MiB | summed MiB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        cells = [f"{row[key]['median']:.2f} ({row[key]['min']:.2f}-{row[key]['max']:.2f})"
                 for key in ("seconds", "cpu_s")]
        cells += [f"{row[key]['median']:.0f} ({row[key]['min']:.0f}-{row[key]['max']:.0f})"
                  for key in ("largest_process_mib", "summed_mib")]
        print(f"| {row['ranks']} | {row['processes']} | " + " | ".join(cells) + " |")
    if args.out:
        meta = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
