"""The run folder's name that every rank of one launch agrees on, without any communication (a
library module: the session, its integrations and `trainprof run` read it)."""

from __future__ import annotations

import os
import re

RUN_NAME_VARIABLE = "TRAINPROF_RUN_NAME"
"""An environment variable that names the run folder for every process that reads it."""


def shared_run_name() -> str | None:
    """The run folder name that all ranks of one launch agree on, or None outside a launcher.

    1. `TRAINPROF_RUN_NAME`, when set (any launcher, e.g. `srun`: export it before the launch);
    2. under torchrun (or `accelerate launch`, which uses it): `run-torchrun-<run id>`, from
       `TORCHELASTIC_RUN_ID`; a single-node `torchrun` draws a fresh uuid per launch, a multi-node
       job shares its `--rdzv-id`;
    3. under a launcher whose run id is the default `none` (multi-node static rendezvous without
       `--rdzv-id`), or any launcher that sets `LOCAL_RANK`: `run-<host>-<launcher pid>`, shared by
       the ranks of one node (their parent process is the launcher).
    """
    explicit = os.environ.get(RUN_NAME_VARIABLE, "").strip()
    if explicit:
        return _folder_name(explicit)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return _folder_name(f"run-torchrun-{run_id[:8]}")
    if run_id or os.environ.get("LOCAL_RANK", "").strip():
        import socket

        host = socket.gethostname().split(".")[0]
        return _folder_name(f"run-{host}-{os.getppid()}")
    return None


def _folder_name(name: str) -> str:
    """`name` as one plain folder name (no separators, no leading dots)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".") or "run"
