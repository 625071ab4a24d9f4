"""Host code that holds the GPU idle and has a name of its own: an optimizer stepping on CPU tensors,
state offloaded to the host. The generic host-bound fix ("make the named host code cheaper") says
nothing to a loop whose optimizer runs on the CPU; its fix is where the optimizer's state lives.

`HOST_WORK` is the table: a regex over the Python function (and file) holding the host idle time
(`idle.HostFunction`), what it is, and its fix; a row with `optimizer_on_host` holds only where the
optimizer's step ran its math on the host (`optimizer_on_host`): `_single_tensor_adam` on GPU tensors
is a launch-bound Python loop, whose fix (`foreach`/`fused`) the launch finding gives.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from trainprof.analysis.attribution import OPTIMIZER_PREFIXES
from trainprof.analysis.idle import HostFunction
from trainprof.analysis.thresholds import Thresholds
from trainprof.analysis.timeline import Timeline


class HostWork(NamedTuple):
    """Host code of one kind: `pattern` (a regex searched in `file function`), `words` (what the host
    is doing, for a title: "the optimizer steps on the CPU"), `meaning` and `fix`."""

    key: str
    pattern: str
    words: str
    meaning: str
    fix: str
    optimizer_on_host: bool = False


HOST_WORK: tuple[HostWork, ...] = (
    HostWork(
        "host_optimizer",
        r"torch/optim/\w+\.py \w+|(^|\s)_(single|multi)_tensor_\w+|cpu_adam|cpu_adagrad|cpu_lion|"
        r"DeepSpeedCPU\w+",
        "the optimizer steps on the CPU (its parameters or states are CPU tensors)",
        "the optimizer's math runs on the host: a per-tensor loop of ATen ops on CPU tensors, which "
        "launch no GPU work while the GPU waits for the updated weights",
        "Step the optimizer where the tensors are fastest: keep parameters, gradients and optimizer "
        "state on the GPU and use a fused optimizer (torch.optim.AdamW(..., fused=True)); if the state "
        "lives on the host to save GPU memory (offload), use a vectorised CPU optimizer (DeepSpeed's "
        "DeepSpeedCPUAdam) instead of torch's per-tensor loop, overlap it with the next step "
        "(ZeRO-Offload's delayed parameter update), or offload only what the GPU cannot hold.",
        optimizer_on_host=True,
    ),
    HostWork(
        "offload",
        r"offload",
        "state is moved between host and GPU (offload)",
        "tensors offloaded to the host are moved back and forth inside the step",
        "Offload only what the GPU cannot hold, and overlap the copies with compute: pinned host "
        "buffers, non_blocking=True copies on a side stream, prefetching the next layer's tensors.",
    ),
)


def optimizer_on_host(timeline: Timeline, thresholds: Thresholds) -> bool:
    """Whether the optimizer's steps ran their math on the host: its ranges (`Optimizer.step#...`) hold
    ops, and at most `host_optimizer_max_launch_share` of them launched GPU work (an optimizer on GPU
    tensors launches a kernel from most of its math ops; one on CPU tensors launches none)."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if not len(ops):
        return False
    is_step = trace.names_matching(lambda name: name.startswith(OPTIMIZER_PREFIXES[0]))
    ranges = [(trace.events[c], is_step[trace.events[c].name]) for c in ("user_annotation", "cpu_op")]
    inside = np.zeros(len(ops), dtype=bool)
    for table, mask in ranges:
        for row in np.flatnonzero(mask).tolist():
            inside |= (
                (ops.thread == table.thread[row])
                & (ops.start_us >= table.start_us[row])
                & (ops.end_us <= table.end_us[row])
            )
    if not inside.any():
        return False
    launches = timeline.calls.start_us[timeline.call_is_launch]
    launch_thread = timeline.calls.thread[timeline.call_is_launch]
    launched = 0
    for thread in np.unique(ops.thread[inside]).tolist():
        times = np.sort(launches[launch_thread == thread])
        mine = inside & (ops.thread == thread)
        within = np.searchsorted(times, ops.end_us[mine]) - np.searchsorted(times, ops.start_us[mine])
        launched += int((within > 0).sum())
    return launched <= thresholds.host_optimizer_max_launch_share * int(inside.sum())


def host_work(timeline: Timeline, functions: list[HostFunction], thresholds: Thresholds) -> HostWork | None:
    """The `HOST_WORK` row whose functions hold the most of the host idle time, if they hold at least
    `host_work_min_share` of it (and, for an optimizer row, the optimizer ran on the host); else None."""
    total = sum(f.idle_ms_per_step for f in functions)
    if total <= 0:
        return None
    best, best_ms = None, 0.0
    for row in HOST_WORK:
        pattern = re.compile(row.pattern)
        held = sum(f.idle_ms_per_step for f in functions if pattern.search(f"{f.file or ''} {f.function}"))
        if held > best_ms:
            best, best_ms = row, held
    if best is None or best_ms < thresholds.host_work_min_share * total:
        return None
    if best.optimizer_on_host and not optimizer_on_host(timeline, thresholds):
        return None
    return best
