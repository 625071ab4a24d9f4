"""What the session's modules share: its limits, the process's rank and worker name, the summary of
a session that profiled nothing, and what trainprof's own code may raise."""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import TYPE_CHECKING

from trainprof.user_code import warn

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Summary

logger = logging.getLogger("trainprof")

MAX_WINDOWS = 8
"""Recorded windows kept for the analysis at exit (the most recent ones; older traces stay on disk)."""

UNPROFILED_STEPS_KEPT = 256
"""Un-profiled step times kept (the most recent): their median is the loop's step without the profiler."""

# A rank as torchrun writes it: ASCII digits, at most 9 (str.isdigit() also accepts '²', and int()
# refuses 5000 digits).
_RANK_VALUE = re.compile(r"[0-9]{1,9}")


def process_rank() -> int | None:
    """This process's rank: from an initialised torch.distributed group, else env RANK / LOCAL_RANK.

    A variable that is not a plain number (`RANK=²`, 5000 digits) is ignored with one warning.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a broken distributed setup must not stop profiling
        pass
    for variable in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(variable, "").strip()
        if not value:
            continue
        if _RANK_VALUE.fullmatch(value):
            return int(value)
        warn(f"trainprof: ignoring {variable}={value[:20]!r}{'...' if len(value) > 20 else ''}: "
             "not a rank (a number); files are named without a rank")
    return None


def worker_name(rank: int | None = None) -> str:
    """This process's name in file names: `rank<R>_<host>_<pid>`, or `<host>_<pid>` without a rank.

    No dots: a trace's worker is its file name up to the first `.` (trainprof.trace), and
    TensorBoard's profiler plugin reads `<node>_<pid>` from it.

    The rank (default `process_rank()`) comes from an initialised torch.distributed group, else from
    env RANK / LOCAL_RANK, so ranks never overwrite each other's files even before (or without) a
    process group.
    """
    return _worker_name(process_rank() if rank is None else rank)


def _worker_name(rank: int | None) -> str:
    """`worker_name` for a rank already decided (None: no rank)."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "host"
    name = f"{host}_{os.getpid()}"
    return f"rank{rank}_{name}" if rank is not None else name


_NOT_PROFILED = "not-profiled"


def _not_profiled(reason: str) -> Summary:
    """The summary of a session with no analysis: verdict `not-profiled`, the reason, no figures."""
    from trainprof.analysis.result import Summary  # its first use imports msgspec, not `import trainprof`

    return Summary(verdict=_NOT_PROFILED, reason=reason)


_OURS = (Exception, SystemExit)
"""What trainprof's own code may raise and the session absorbs (rich raises SystemExit on a closed
stdout); a KeyboardInterrupt is the user's and passes through."""


class ProfilerBusy(RuntimeError):
    """Another profiler runs (or started) in this process: the session steps aside for it."""
