"""Analyse a folder's traces one at a time, in worker processes when there are several: memory
holds one trace per worker (plus the small per-trace results), never the folder.

HolisticTraceAnalysis loads every rank's trace into one process (its users report 200 GB of
traces needing 950 GB of memory, HTA#250). Here each worker loads, analyses and drops one trace,
and sends back its `TraceResult` (steps, findings, a few-kB summary of its collectives), which
`core.compose` merges: time grows with the number of ranks divided by the workers, memory with
the largest trace times the workers. Under torchrun, `trainprof analyze` first splits the folder
among the job's processes, each running `file_outcomes` over its share (`trainprof.job_analysis`).

Workers are forked where that is safe: on Linux, from a process with one Python thread that has not
imported torch (`trainprof analyze`); they start in milliseconds with the analysis already imported,
so two files already pay for a second process. Elsewhere they are started by `forkserver` (where the platform
has it, else `spawn`): forking a process that runs threads (a notebook, a training job) can deadlock
in the child; a worker then takes ~0.3 s to start and import the analysis, once, not once per trace.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainprof.trace.load import (
    Skipped,
    TraceLoadError,
    load_candidate,
    max_trace_bytes,
    no_trace_in,
    say_skipped,
    trace_size_limit,
    window_numbers,
)

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.core import TraceResult
    from trainprof.analysis.thresholds import Thresholds
    from trainprof.trace import Trace

AnalyzeOne = Callable[["Trace", "list[dict] | None", "Thresholds", bool], "TraceResult"]
"""What analyses one loaded trace: `core.analyze_trace`, which the caller hands in (this module is
below `core`, which reaches a folder through it; a worker process unpickles the function by name)."""

PARALLEL_MIN_FILES = 4
"""Files from which a folder is analysed in worker processes by default where workers cannot be forked:
starting one (an interpreter and the analysis' imports, ~0.3 s on the 2-core development machine,
2026-11-25) costs more than analysing two or three of the fixtures' traces in this process."""

FORKED_MIN_FILES = 2
"""The same where workers are forked (`_can_fork`): a fork costs milliseconds, a fixture's trace
~50 ms to analyse."""


def analyze_files(
    files: list[Path],
    in_folder: bool,
    sync_sites: list[dict] | None,
    limits: Thresholds,
    workers: int | None,
    report: Callable[[str, int, int], None],
    views: bool = False,
    *,
    analyze_one: AnalyzeOne,
) -> list[TraceResult]:
    """The `TraceResult` of each file that is a trace with a finished step (`trace.load.load_candidate`),
    in the order `load_traces` sorts traces (by rank, then file name) and with their windows numbered as
    it numbers them. `workers` None: one per core from `FORKED_MIN_FILES` files on where workers
    can be forked (`_can_fork`), else from `PARALLEL_MIN_FILES`; 1: this process. `views`: as
    `analyze`'s; `analyze_one`: `core.analyze_trace`."""
    alone = len(files) == 1 or not in_folder
    outcomes = file_outcomes(files, alone, sync_sites, limits, workers, report, views,
                             analyze_one=analyze_one)
    return folder_results(outcomes, files[0].parent)


Outcome = tuple[int, "TraceResult | Skipped | None", "Exception | None"]
"""What became of one file: its index in the folder's list, its result (`Skipped`: a window with no
finished step, or cut short; None for a file that is not a trace) and the error reading it raised
(None if none; then the result is None)."""


def file_outcomes(
    files: list[Path],
    alone: bool,
    sync_sites: list[dict] | None,
    limits: Thresholds,
    workers: int | None,
    report: Callable[[str, int, int], None],
    views: bool = False,
    cores: int | None = None,
    *,
    analyze_one: AnalyzeOne,
) -> list[Outcome]:
    """The outcome of each of `files` (indexes into `files`), analysed in this process or in `workers`
    (as `analyze_files`'). A process that reads files in turn stops at its first error: the folder
    fails on the first in its order (`folder_results`), which no later file changes. `alone`: every
    file must be a trace (`load_candidate`). `cores`: what this process's default workers may use
    (None: every core; `trainprof analyze` under torchrun shares a node's cores among its processes)."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not files:
        return []
    fork = _can_fork()
    workers = min(_default_workers(len(files), fork, cores) if workers is None else workers, len(files))
    if workers == 1:
        return _share(files, 0, 1, alone, sync_sites, limits, views, report, analyze_one=analyze_one)
    if fork:
        return _forked(files, alone, sync_sites, limits, workers, report, views, analyze_one=analyze_one)
    return _parallel(files, alone, sync_sites, limits, workers, report, views, analyze_one=analyze_one)


def folder_results(outcomes: list[Outcome], folder: Path) -> list[TraceResult]:
    """The folder's `TraceResult`s from its files' outcomes, in any order: the first error in the
    folder's order raised; else the traces sorted as `load_traces` sorts them and their windows
    numbered as it numbers them (`no_trace_in` raised when none has a finished step)."""
    ordered = sorted(outcomes, key=lambda outcome: outcome[0])
    for _, _, error in ordered:
        if error is not None:
            raise error
    results = [result for _, result, _ in ordered if result is not None]
    skipped = [result for result in results if isinstance(result, TraceLoadError)]
    kept = [result for result in results if not isinstance(result, TraceLoadError)]
    if not kept:
        raise no_trace_in(folder, skipped)
    say_skipped(skipped)
    kept.sort(key=_order)
    _number_windows(kept)
    return kept


def _default_workers(count: int, fork: bool, cores: int | None = None) -> int:
    """Workers for `count` files when none are asked for: one per core (of `cores`, None: every core)
    from `FORKED_MIN_FILES` files on where they can be forked (`fork`), else from `PARALLEL_MIN_FILES`."""
    least = FORKED_MIN_FILES if fork else PARALLEL_MIN_FILES
    return min(cores or os.cpu_count() or 1, count) if count >= least else 1


def _can_fork() -> bool:
    """Whether worker processes may be forked from this one: Linux (macOS's system libraries, its BLAS
    among them, are not safe in a forked child), one Python thread in this process, and no torch (a
    training process, whose CUDA and runtime threads a forked child would inherit in whatever state
    they were)."""
    return sys.platform.startswith("linux") and threading.active_count() == 1 and "torch" not in sys.modules


def _number_windows(results: list[TraceResult]) -> None:
    """Each file was loaded alone (window 0): number the windows of each process as `load_traces` does,
    on its `TraceInfo` and findings."""
    numbers = window_numbers([(result.process, result.first_event_us) for result in results])
    for result, window in zip(results, numbers, strict=True):
        result.info.window = window
        for finding in result.findings:
            finding.window = window


def _order(result: TraceResult) -> tuple:
    """As `trace.load.trace_order`: by rank (none last), then file name."""
    rank = result.info.rank
    return (rank is None, rank if rank is not None else 0, Path(result.info.file).name)


def _serial(
    file: Path, index: int, count: int, alone: bool, sync_sites: list[dict] | None, limits: Thresholds,
    report: Callable[[str, int, int], None], views: bool,
    *, analyze_one: AnalyzeOne,
) -> TraceResult | Skipped | None:
    report(f"loading {file.name}", 2 * index, 2 * count)
    trace = load_candidate(file, alone)
    if trace is None or isinstance(trace, TraceLoadError):
        return trace
    report(f"analysing {file.name}", 2 * index + 1, 2 * count)
    return analyze_one(trace, sync_sites, limits, views)


def _parallel(
    files: list[Path], alone: bool, sync_sites: list[dict] | None, limits: Thresholds, workers: int,
    report: Callable[[str, int, int], None], views: bool,
    *, analyze_one: AnalyzeOne,
) -> list[Outcome]:
    """`file_outcomes` in `workers` processes started by forkserver (or spawn), one file each at a
    time; every file is analysed (a worker's error comes back with its file's future)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # forkserver where the platform has it, else spawn (never fork: this process may run threads)
    safe_start = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(safe_start)
    overrides = limits.overridden()
    limit = max_trace_bytes()  # the caller's limit holds in the workers too
    outcomes: list[Outcome] = []
    report(f"analysing {len(files)} traces in {workers} processes", 0, 2 * len(files))
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending = {
            pool.submit(_analyze_file, str(file), alone, sync_sites, overrides, limit, views,
                        analyze_one=analyze_one): index
            for index, file in enumerate(files)
        }
        for done, future in enumerate(as_completed(pending), 1):
            index = pending[future]
            try:
                outcomes.append((index, future.result(), None))
            except Exception as error:  # a worker's TraceLoadError: raised in the folder's order
                outcomes.append((index, None, error))
            report(f"analysed {files[index].name}", 2 * done, 2 * len(files))
    return outcomes


def _forked(
    files: list[Path], alone: bool, sync_sites: list[dict] | None, limits: Thresholds, workers: int,
    report: Callable[[str, int, int], None], views: bool,
    *, analyze_one: AnalyzeOne,
) -> list[Outcome]:
    """`_parallel`'s outcomes where forking is safe: this process analyses every `workers`-th file from
    the first, `workers - 1` forked children the others, each child's outcomes pickled back through a
    pipe. Not ProcessPoolExecutor: importing and starting it took ~8 ms on the 2-core development
    machine (2026-11-25), a sixth of a fixture trace's analysis. A child that exits without its
    outcomes raises RuntimeError naming its files."""
    import pickle

    report(f"analysing {len(files)} traces in {workers} processes", 0, 2 * len(files))
    children: dict[int, tuple[int, int]] = {}  # pid -> (its pipe's read end, its share's first file)
    try:
        for worker in range(1, workers):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: its share, pickled, then out without running the parent's exit code
                os.close(read_end)
                status = 1
                try:
                    share = _share(files, worker, workers, alone, sync_sites, limits, views,
                                   analyze_one=analyze_one)
                    with os.fdopen(write_end, "wb") as out:
                        pickle.dump(share, out, protocol=pickle.HIGHEST_PROTOCOL)
                    status = 0
                finally:
                    os._exit(status)
            os.close(write_end)
            children[pid] = (read_end, worker)
        outcomes = _share(files, 0, workers, alone, sync_sites, limits, views, report,
                          analyze_one=analyze_one)
        for pid in list(children):
            read_end, worker = children.pop(pid)
            with os.fdopen(read_end, "rb") as received:
                data = received.read()
            os.waitpid(pid, 0)
            if not data:
                names = ", ".join(file.name for file in files[worker::workers])
                raise RuntimeError(f"the worker process analysing {names} exited without a result")
            outcomes.extend(pickle.loads(data))
    finally:
        for pid, (read_end, _) in children.items():  # interrupted: the children's writes fail, they exit
            os.close(read_end)
            os.waitpid(pid, 0)
    report(f"analysed {len(files)} traces", 2 * len(files), 2 * len(files))
    return outcomes


def _share(
    files: list[Path], first: int, step: int, alone: bool, sync_sites: list[dict] | None, limits: Thresholds,
    views: bool, report: Callable[[str, int, int], None] | None = None,
    *, analyze_one: AnalyzeOne,
) -> list[Outcome]:
    """The outcome of every `step`-th file from `first`, up to the first that raises; `report` as
    `_serial`'s (None: none)."""
    outcomes: list[Outcome] = []
    for index in range(first, len(files), step):
        try:
            result = _serial(files[index], index, len(files), alone, sync_sites, limits,
                             report or _quiet, views, analyze_one=analyze_one)
        except Exception as error:  # a TraceLoadError, raised by `folder_results` in the folder's order
            outcomes.append((index, None, error))
            break
        outcomes.append((index, result, None))
    return outcomes


def _quiet(what: str, done: int, total: int) -> None:
    """A forked child's progress: the parent's bar draws it."""


def _analyze_file(
    file: str, alone: bool, sync_sites: list[dict] | None, overrides: dict[str, float], limit: int,
    views: bool,
    *, analyze_one: AnalyzeOne,
) -> TraceResult | Skipped | None:
    """In a worker: load one file, analyse it, return its result (the trace is dropped here)."""
    from trainprof.analysis.thresholds import Thresholds

    with trace_size_limit(limit):
        trace = load_candidate(Path(file), alone)
    if trace is None or isinstance(trace, TraceLoadError):
        return trace
    return analyze_one(trace, sync_sites, Thresholds(overrides), views)
