"""At the end of a distributed session, rank 0 gathers every rank's summary and writes the
cross-rank report (`summary.ranks.json`, `report.ranks.md`); no trace crosses the network.

Each rank analyses its own trace (in parallel, inside the job, as every session does), boils the
analysis down to a `RankSummary` of a few kB (`trainprof.analysis.distributed`) and hands it to rank
0 through the process group's own key-value store: the TCPStore that `init_process_group` (or
torchrun) set up for the group to find itself. Why the store and not a collective (`gather_object`):
a collective waits for every rank, and a rank that skipped its report (its loop raised, its analysis
failed) would hold all the others until the group's timeout (10 to 30 minutes); through the store a
rank other than 0 sets one key and returns at once, and rank 0 waits at most `timeout_s` for the
others' keys, then reports the ranks it has. Nothing here raises into the training run: a failure
logs and warns once, and each rank's own report is written either way.

The store is picked up while the loop runs (`GroupHandle.capture`, at every step until found): a
script run by `trainprof run` creates its process group inside the session and destroys it before
the session ends, and a reference held to the store keeps it usable after that.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import RankSummary

logger = logging.getLogger("trainprof")

KEY_PREFIX = "trainprof/rank-summary"
POLL_S = 0.05
"""How often rank 0 looks for the keys still missing while it waits."""

_SESSIONS = itertools.count()
"""Numbers the sessions of a process, so that the keys of a job's second session are not its first's
(the ranks of a job run the same code: their n-th sessions are the same session)."""


@dataclass
class GroupHandle:
    """What the gather needs of the job's process group, captured while it exists: the rank, the
    world size and the group's store (None until found)."""

    session_number: int
    rank: int | None = None
    world_size: int | None = None
    store: Any = None

    @classmethod
    def new(cls) -> GroupHandle:
        """A handle for the next session of this process (not yet captured)."""
        return cls(session_number=next(_SESSIONS))

    def capture(self) -> None:
        """Take the default process group's rank, size and store if it is initialised and they are not
        taken yet; anything missing (no torch.distributed, no group, a private API moved) leaves the
        handle as it was."""
        if self.store is not None:
            return
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.store = store
        except Exception:  # a broken or unusual distributed setup: no gather, never an error
            logger.debug("trainprof: no process group store for the cross-rank report", exc_info=True)

    @property
    def ready(self) -> bool:
        """Whether a group of several ranks was captured."""
        return self.store is not None and self.world_size is not None and self.world_size > 1

    def _key(self, rank: int) -> str:
        return f"{KEY_PREFIX}/{self.session_number}/{rank}"


def gather_summaries(
    handle: GroupHandle, summary: RankSummary | None, timeout_s: float
) -> tuple[list[RankSummary], list[int]] | None:
    """Send this rank's summary (None: it has none, e.g. its loop raised) and, on rank 0, collect
    the others'. Rank 0 gets `(summaries, missing ranks)`; every other rank None at once.

    Rank 0 waits up to `timeout_s` for the other ranks' keys; a rank with no summary sets an empty
    value, so that rank 0 need not wait for it.
    """
    from trainprof.analysis.distributed import RankSummary

    store, rank, world = handle.store, handle.rank, handle.world_size
    if not handle.ready or rank is None or world is None:
        return None
    if rank != 0:
        store.set(handle._key(rank), summary.to_bytes() if summary is not None else b"")
        return None
    deadline = time.monotonic() + max(timeout_s, 0.0)
    waiting = set(range(1, world))
    received: dict[int, bytes] = {}
    while waiting:
        for other in sorted(waiting):
            if store.check([handle._key(other)]):
                received[other] = store.get(handle._key(other))
                waiting.discard(other)
                _forget(store, handle._key(other))
        if waiting and time.monotonic() >= deadline:
            break
        if waiting:
            time.sleep(POLL_S)
    summaries = [summary] if summary is not None else []
    missing = sorted(waiting)
    for other, data in sorted(received.items()):
        if not data:  # the rank had no analysis
            missing.append(other)
            continue
        try:
            summaries.append(RankSummary.from_bytes(data))
        except Exception:  # a rank of another trainprof version, a torn value: left out, said so
            logger.debug("trainprof: rank %d's summary is unreadable", other, exc_info=True)
            missing.append(other)
    return summaries, sorted(missing)


def _forget(store: Any, key: str) -> None:
    """Remove a key once read (stores without delete keep it: it is a few kB)."""
    try:
        store.delete_key(key)
    except Exception:
        logger.debug("trainprof: could not delete %s from the store", key, exc_info=True)
