"""A measured batch of the fuzzer (tests/test_fuzz.py): outcome counts, the slowest run, the peak memory.

Each mutant runs in a worker process as in CI (`trainprof analyze --json --debug`, every writer on a
result, `trainprof diff` for one in `DIFF_EVERY`), and gets its own peak RSS: the worker resets its
`VmHWM` (Linux: `/proc/self/clear_refs`) before the mutant and reads it after. The bound checked per
mutant is the memory bound of docs/analyze.md "Memory" plus a slack for the warm process's own allocations:

    peak RSS growth <= 3 x the counted size of its traces + 8 x that of its sync sites files + 32 MiB

    python -m benchmarks.fuzz_batch 10000 --workers 2 --out fuzz.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SLACK = 32 * 2**20
SECONDS_LIMIT = 30.0
WARM_UP_SEED, WARM_UP_TRIES = -40, 50
"""Seeds outside every batch (multiples of -40: writers with TensorBoard scalars and a diff) run
first, unmeasured, until one was analysed: the one-off costs of a worker (imports, loading the base
traces, TensorBoard's writer) are no mutant's."""


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current RSS


def counted_sizes(folder: Path) -> tuple[int, int]:
    """(traces, sync sites files): the counted size of each regular file under `folder`, summed."""
    from trainprof.trace.budget import counted

    traces = sidecars = 0
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_bytes()
        if text[:2] == b"\x1f\x8b":
            try:
                text = gzip.decompress(text)
            except (OSError, EOFError, zlib.error):
                pass
        size, _ = counted(text)
        if path.name.endswith(".syncsites.json"):
            sidecars += size
        else:
            traces += size
    return traces, sidecars


def work(seeds: range, queue) -> None:
    """Run `seeds` in this process; put one record per mutant on `queue`."""
    from tests import test_fuzz  # run from the repository root (`python -m benchmarks.fuzz_batch`)

    for attempt in range(WARM_UP_TRIES):  # warm up, unmeasured, until a mutant ran every part
        with tempfile.TemporaryDirectory() as scratch:
            warm = test_fuzz.run_mutant(WARM_UP_SEED * (attempt + 1), Path(scratch), FIXTURES)
        if "writers" in warm and "diff" in warm:
            break
    for seed in seeds:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            record = {"seed": seed}
            before = _status("VmRSS:")
            _reset_peak()
            start, cpu = time.perf_counter(), time.process_time()
            try:
                record.update(test_fuzz.run_mutant(seed, folder, FIXTURES))
            except test_fuzz.Outcome as failure:
                record["failure"] = str(failure)[:600]
            except Exception as error:  # noqa: BLE001 - the fuzzer's own bug: counted, the batch goes on
                record["failure"] = f"seed {seed}: making the mutant failed: {type(error).__name__}: {error}"
            record["wall_s"] = time.perf_counter() - start
            record["cpu_s"] = time.process_time() - cpu
            record["peak_growth"] = max(_status("VmHWM:") - before, 0)
            traces, sidecars = counted_sizes(folder / "m")
            record["bound"] = 3 * traces + 8 * sidecars + SLACK
        queue.put(record)
    queue.put(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, nargs="?", default=10_000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    seeds = range(args.first_seed, args.first_seed + args.count)
    workers = [context.Process(target=work, args=(seeds[i::args.workers], queue))
               for i in range(args.workers)]
    for worker in workers:
        worker.start()
    outcomes: Counter = Counter()
    failures, over_bound, over_time, records = [], [], [], []
    done, running = 0, len(workers)
    started = time.perf_counter()
    while running:
        record = queue.get()
        if record is None:
            running -= 1
            continue
        done += 1
        records.append({k: v for k, v in record.items() if k != "description"} | {
            "description": record.get("description", "")[:200]})
        outcome = "failed" if "failure" in record else record["analyze"]
        outcomes[f"analyze {outcome}"] += 1
        for part in ("writers", "diff"):
            if part in record:
                outcomes[f"{part} {record[part]}"] += 1
        if "failure" in record:
            failures.append(record["failure"])
            print("FAIL", record["failure"][:400], flush=True)
        if record["peak_growth"] > record["bound"]:
            over_bound.append(record)
        if record["wall_s"] > SECONDS_LIMIT:
            over_time.append(record)
        if done % 500 == 0:
            seconds = time.perf_counter() - started
            print(f"{done}/{args.count} after {seconds:.0f} s: {dict(outcomes)}", flush=True)
    for worker in workers:
        worker.join()
    slowest = max(records, key=lambda r: r["wall_s"])
    largest = max(records, key=lambda r: r["peak_growth"])
    summary = {
        "mutants": done,
        "seeds": f"{args.first_seed}..{args.first_seed + args.count - 1}",
        "outcomes": dict(outcomes),
        "failures": failures,
        "slowest": {k: slowest.get(k) for k in ("seed", "wall_s", "cpu_s", "description")},
        "largest_peak_growth_mib": round(largest["peak_growth"] / 2**20, 1),
        "largest_peak": {k: largest.get(k) for k in ("seed", "peak_growth", "bound", "description")},
        "over_memory_bound": [{k: r.get(k) for k in ("seed", "peak_growth", "bound", "description")}
                              for r in over_bound],
        "over_30_s": [{k: r.get(k) for k in ("seed", "wall_s", "description")} for r in over_time],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "records": records}))


if __name__ == "__main__":
    main()
