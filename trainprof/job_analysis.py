"""`trainprof analyze DIR` run by every process of a torchrun job: each process analyses its share
of the folder's files, and rank 0 gathers the results, composes them and prints the report that one
process would have printed.

    torchrun --nnodes N --nproc_per_node M -m trainprof analyze DIR [--json]

- **Whether.** torchrun gives each process it starts `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
  `MASTER_PORT`; with `WORLD_SIZE` above 1 the command runs here (`job_place`), else as always, never
  importing torch. A command started from a process of a torchrun job inherits these: `WORLD_SIZE=1
  trainprof analyze DIR` analyses the folder in that one process.
- **Who takes which file.** Every process lists the folder itself (`trace_paths`: the same folder on
  every node, a shared file system) and rank r takes the files at r, r + W, r + 2W, ... of the
  sorted list (W processes), as `folder._forked` splits a folder among its workers; a process left
  without a file sends an empty share. A process may still use worker processes
  (`folder.file_outcomes`), by default one per core of its share of the node (cores divided by
  `LOCAL_WORLD_SIZE`).
- **How results travel.** A share is a fingerprint of the folder's list and each file's outcome (its
  `TraceResult`, or the error reading it raised), pickled as `folder._forked`'s children send theirs
  (40-100 kB a trace for the `ddp_straggler` fixture's), set under keys of the job's TCPStore in
  pieces of `PIECE_BYTES` (torchrun's agent hosts the store; rank 0 does when the variables are set
  by hand). Rank 0 checks that every rank listed the same files, raises the first error in the
  folder's order (the message one process gives, whichever rank read the file), else sorts the
  results and numbers their windows as one process does (`folder.folder_results`) and composes them
  (`core.compose`).
- **Why the store, not a collective.** `gather_object` over gloo waits for every rank up to the
  group's timeout, one figure for a whole share's analysis: too short for a large folder, too long
  for a process that hung. Through the store a rank sets its keys and exits; rank 0 waits for every
  rank to join (`JOIN_TIMEOUT_S`), then for each share as long as its rank keeps finishing files (a
  counter each rank raises as it goes: `SILENCE_TIMEOUT_S`), and names the ranks it gave up on. A
  process that dies is ended by torchrun with the rest of the job. No process group is created: the
  store is all the gather needs (`trainprof.gather` gathers a session's summaries the same way).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis
    from trainprof.analysis.thresholds import Thresholds

JOIN_TIMEOUT_S = 120.0
"""How long a process tries to reach the job's store, and rank 0 waits for every rank to join it.
torchrun starts a job's processes together (after its nodes' agents have met), and each joins once
it has imported torch (2.5 s on the 2-core development machine, 2026-11-28); a rank that never joins
was not started by torchrun (a command that inherited a worker's environment)."""
SILENCE_TIMEOUT_S = 600.0
"""How long rank 0 waits for a rank that finishes no file: one trace at the default size limit (2 GiB
of JSON) takes minutes to analyse; a rank silent for longer has hung."""
POLL_S = 0.05
"""How often rank 0 looks for the shares still missing."""
PIECE_BYTES = 4 * 2**20
"""The most bytes set under one key: the TCPStore's libuv server (torch's default) drops a client that
sends a value over 8 MiB (torch 2.13), and a share is 40-100 kB a trace, so one of thousands of traces
travels in pieces."""
KEY_PREFIX = "trainprof/analyze"


class JobError(RuntimeError):
    """The job's ranks could not be gathered; the message names the ranks and what went wrong."""


class JobPlace(msgspec.Struct, frozen=True):
    """This process's place in a torchrun job, from the variables torchrun sets."""

    rank: int
    world_size: int
    local_world_size: int
    """The job's processes on this node, which share its cores."""


class Share(msgspec.Struct):
    """What one rank hands rank 0: how many files it listed and a digest of their paths, the outcome
    of each file it analysed (`folder.Outcome`, indexed in the whole folder's list), and the error
    raised outside any one file (listing the folder, a worker process lost), None if none."""

    file_count: int
    listing: str
    outcomes: list
    error: Any = None


def job_place(environ: Mapping[str, str] = os.environ) -> JobPlace | None:
    """This process's place in a torchrun job of several processes; None outside one (a variable
    missing or malformed) or in a job of one process. `LOCAL_WORLD_SIZE` missing (variables set by
    hand): one process on the node."""
    try:
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_world_size = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    except (KeyError, ValueError):
        return None
    if world_size < 2 or not 0 <= rank < world_size:
        return None
    if not environ.get("MASTER_ADDR") or not environ.get("MASTER_PORT"):
        return None
    return JobPlace(rank, world_size, max(local_world_size, 1))


def analyze_in_job(
    job: JobPlace,
    path: str | Path,
    thresholds: Mapping[str, float] | None = None,
    workers: int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    windows: int | None = None,
) -> Analysis:
    """Rank 0's part: its own share and every other rank's, composed into the `Analysis` that
    `analyze(path, thresholds=..., workers=..., windows=...)` returns. Raises what `analyze` raises on
    bad input (the first in the folder's order, whichever rank read it); JobError when a rank cannot be heard
    from, could not list the folder or listed other files. `on_progress` as `analyze`'s, for this
    rank's share, then the ranks still awaited."""
    from trainprof.analysis.core import compose
    from trainprof.analysis.folder import folder_results
    from trainprof.analysis.thresholds import Thresholds

    limits = Thresholds(thresholds)
    report = on_progress or _quiet
    store = _connect(job)
    _await_ranks(store, job.world_size, JOIN_TIMEOUT_S)
    files, own = _own_share(job, path, limits, workers, report, windows)
    if own.error is not None:  # the folder cannot be listed: what one process says
        raise own.error
    outcomes = list(own.outcomes)
    for rank, share in sorted(_collect(store, job.world_size, SILENCE_TIMEOUT_S, report).items()):
        if share.error is not None:
            raise JobError(f"rank {rank}: {share.error}")
        if (share.file_count, share.listing) != (own.file_count, own.listing):
            raise JobError(
                f"rank {rank} lists other trace files in {path} than rank 0 ({share.file_count} against "
                f"{own.file_count}): every process of the job must read the same folder (a shared file "
                "system)"
            )
        outcomes.extend(share.outcomes)
    results = folder_results(outcomes, files[0].parent)
    report("done", 1, 1)
    return compose(results, limits)


def send_share(
    job: JobPlace,
    path: str | Path,
    thresholds: Mapping[str, float] | None = None,
    workers: int | None = None,
    windows: int | None = None,
) -> None:
    """A rank other than 0: analyse its share and hand it to rank 0 through the job's store. Bad
    input travels in the share, for rank 0 to report; JobError when the store cannot be reached."""
    from trainprof.analysis.thresholds import Thresholds

    limits = Thresholds(thresholds)
    store = _connect(job)
    progress = _progress_key(job.rank)

    def heartbeat(what: str, done: int, total: int) -> None:
        store.add(progress, 1)  # rank 0 waits as long as this moves (SILENCE_TIMEOUT_S)

    _, share = _own_share(job, path, limits, workers, heartbeat, windows)
    try:
        _put(store, job.rank, _packed(share))
    except Exception as error:
        detail = _first_line(error)
        raise JobError(f"rank {job.rank}: could not hand its results to rank 0 ({detail})") from None


def _own_share(
    job: JobPlace, path: str | Path, limits: Thresholds, workers: int | None,
    report: Callable[[str, int, int], None], windows: int | None = None,
) -> tuple[list[Path], Share]:
    """The folder's files (each process's last `windows` of them, as `analyze`'s) and this rank's
    `Share` of them (module docstring)."""
    from trainprof.analysis.core import analyze_trace
    from trainprof.analysis.folder import file_outcomes
    from trainprof.trace.load import last_windows, trace_paths

    try:
        files = trace_paths(path)
        if windows is not None:
            files = last_windows(files, windows)
        mine = range(job.rank, len(files), job.world_size)
        alone = len(files) == 1 or not Path(path).is_dir()  # as `core.analyze`: every file must be a trace
        cores = max((os.cpu_count() or 1) // job.local_world_size, 1)
        outcomes = file_outcomes([files[index] for index in mine], alone, None, limits, workers, report,
                                 cores=cores, analyze_one=analyze_trace)
    except Exception as error:  # a folder this rank cannot list, a worker lost: rank 0 reports it
        return [], Share(0, "", [], error)
    in_folder = [(mine[index], result, error) for index, result, error in outcomes]
    return files, Share(len(files), _digest(files), in_folder)


def _digest(files: list[Path]) -> str:
    import hashlib

    return hashlib.sha256("\0".join(map(str, files)).encode("utf-8", "surrogateescape")).hexdigest()


def _connect(job: JobPlace) -> Any:
    """The job's TCPStore, with this rank's progress counter set (it has joined); JobError if not
    reached within `JOIN_TIMEOUT_S`."""
    from datetime import timedelta

    try:
        import torch.distributed as dist
    except ImportError:
        raise JobError("under torchrun, analyze needs torch: pip install 'trainprof[train]'") from None
    if not dist.is_available():
        raise JobError("under torchrun, analyze needs torch.distributed, which this torch lacks")
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=JOIN_TIMEOUT_S)))
        store.add(_progress_key(job.rank), 0)
    except Exception as error:
        detail = _first_line(error)
        raise JobError(f"rank {job.rank}: cannot reach the job's store at {where} ({detail})") from None
    return store


def _await_ranks(store: Any, world_size: int, timeout_s: float) -> None:
    """Rank 0: return once every rank has joined the store; JobError naming those that did not within
    `timeout_s`."""
    from datetime import timedelta

    keys = [_progress_key(rank) for rank in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception:
        missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        if missing:
            raise JobError(
                f"{_ranks(missing)} did not join within {timeout_s:.0f} s: under torchrun every process runs "
                "`trainprof analyze`; to analyse in one process where torchrun's variables are set, run it "
                "with WORLD_SIZE=1"
            ) from None


def _collect(
    store: Any, world_size: int, silence_s: float, report: Callable[[str, int, int], None]
) -> dict[int, Share]:
    """Rank 0: every other rank's `Share`, each awaited as long as its rank finished a file within the
    last `silence_s` seconds; JobError naming the ranks that fell silent, or whose share is unreadable."""
    import time

    waiting = set(range(1, world_size))
    heard = {rank: (-1, time.monotonic()) for rank in waiting}  # its progress counter, and when it last moved
    shares: dict[int, Share] = {}
    while waiting:
        others = world_size - 1
        report(f"waiting for {len(waiting)} of {others} ranks", others - len(waiting), others)
        now = time.monotonic()
        for rank in sorted(waiting):
            if store.check([_share_key(rank)]):
                shares[rank] = _unpacked(rank, _take(store, rank))
                waiting.discard(rank)
                continue
            count = store.add(_progress_key(rank), 0)
            if count != heard[rank][0]:
                heard[rank] = (count, now)
        silent = sorted(rank for rank in waiting if now - heard[rank][1] > silence_s)
        if silent:
            raise JobError(f"{_ranks(silent)} finished no trace in {silence_s:.0f} s and sent no results; "
                           "rank 0 stopped waiting")
        if waiting:
            time.sleep(POLL_S)
    return shares


def _put(store: Any, rank: int, data: bytes) -> None:
    """Set `data` as `rank`'s share: its pieces first, then their count under the share's key, whose
    presence says the share is whole."""
    pieces = [data[start:start + PIECE_BYTES] for start in range(0, len(data), PIECE_BYTES)]
    for index, piece in enumerate(pieces):
        store.set(f"{_share_key(rank)}/{index}", piece)
    store.set(_share_key(rank), str(len(pieces)))


def _take(store: Any, rank: int) -> bytes:
    """`rank`'s share as `_put` set it, its keys dropped once read (the store's host would hold them
    until the job ends)."""
    key = _share_key(rank)
    count = int(store.get(key))
    data = b"".join(store.get(f"{key}/{index}") for index in range(count))
    for done in [*(f"{key}/{index}" for index in range(count)), key]:
        try:
            store.delete_key(done)
        except Exception:  # a store without delete keeps it
            pass
    return data


def _packed(share: Share) -> bytes:
    """`share` pickled; an error that does not pickle travels as a RuntimeError with its type and message."""
    import pickle

    try:
        return pickle.dumps(share, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        outcomes = [(index, result, _plain(error)) for index, result, error in share.outcomes]
        plain = Share(share.file_count, share.listing, outcomes, _plain(share.error))
        return pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)


def _plain(error: BaseException | None) -> RuntimeError | None:
    return None if error is None else RuntimeError(f"{type(error).__name__}: {error}")


def _unpacked(rank: int, data: bytes) -> Share:
    import pickle

    try:
        share = pickle.loads(data)
    except Exception as error:  # another trainprof version on that node, a torn value
        raise JobError(f"rank {rank}: its results could not be read ({_first_line(error)})") from None
    if not isinstance(share, Share):
        raise JobError(f"rank {rank}: its results could not be read (a {type(share).__name__})")
    return share


def _share_key(rank: int) -> str:
    return f"{KEY_PREFIX}/share/{rank}"


def _progress_key(rank: int) -> str:
    return f"{KEY_PREFIX}/progress/{rank}"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _quiet(what: str, done: int, total: int) -> None:
    """No progress to show."""
