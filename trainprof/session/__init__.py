"""The profiler's lifecycle around an unchanged training loop.

    with trainprof.session():
        train()

Steps are found by themselves: an `optimizer.step()` ends one (torch's global optimizer step
hook): the first optimizer to step after a step's end ends the next, other optimizers stepping
before it steps again are the same iteration, and an optimizer built mid-run ends steps once the
one before it is gone or it steps a second time (`_on_optimizer_step`). `Session.step()` is for
loops without an optimizer; once it is called, the session steps manually only, and a first manual
call right after an optimizer-ended step closes that same step, so a loop calling both
`opt.step(); sess.step()` (either order) counts each step once.

Files (run dir = `log_dir/run_name/`, worker W = `[rankR_]host_pid`):
- `W.<time_ns>.pt.trace.json.gz`: each recorded window, for TensorBoard's PyTorch Profiler tab
  (written whole or not at all: a failed, cut or interrupted export is never left as a trace);
- `W.syncsites.json`: the captured call sites of synchronizing calls (DEVELOPING.md), and at exit
  the time of the steps the profiler did not touch after its first window began
  (`unprofiled_step_ms`), against which the analysis weighs the recorded ones: as the GPU ran
  them, between CUDA events recorded at the step ends (after trainprof's own work there), else on
  the host from one step's end to the next;
- `W.peaks.json`: the GPU's matmul and copy rates, measured once per device and torch version
  (`trainprof.capture.peaks`), read by the analysis for achieved TFLOP/s, TB/s and MFU;
- `W.memory.json`: the caching allocator's state as each window ended and at an out-of-memory error
  (`trainprof.capture.memory`); `W.memory_history.pickle`: its history over the first window with
  `memory_history=True`;
- at exit: `summary.json` (the analysis), `report.md` (`summary.rankR.json`, `report.rankR.md` when the
  process has a rank, so ranks sharing a run folder never overwrite each other), TensorBoard scalars;
  with a process group of several ranks, rank 0 also writes the cross-rank report from every rank's
  gathered summary (`summary.ranks.json`, `report.ranks.md`; `trainprof.gather`).
  Every file is written to a new temporary name and renamed (`trainprof.files.write_atomically`): a
  full disk leaves no half-written file, and a link planted in the run folder is never followed.

A loop that raises ends the session unreported, except on an out-of-memory error: the session then
records what the allocator held and where the error was raised (`trainprof.capture.memory`), writes
its report with the `out_of_memory` finding first, and the error leaves `with` unchanged (the same
object and traceback).

The step path stays cheap: at a window's end only torch's export runs (inside the step that ends
it); the analysis runs once, at exit, over the last `MAX_WINDOWS` windows (memory stays bounded with
`repeat=0`).

Only one profiler can run in a process (two overlapping torch profilers crash it): a session that
finds one running (another thread's session included), or sees another start while it runs, steps
aside with one warning. A session counts the optimizer steps of the thread that started it, in the
process that started it: another thread's loop, or a child forked inside a window, is not recorded.

Steps are seen through one process-wide optimizer-step hook, installed by the first session and
never removed (inert outside a session): torch iterates its global hook dict inside every
`optimizer.step()`, in every thread, and removing or adding a hook while another thread iterates
it raises in that thread's `optimizer.step()`.

Warnings from trainprof can never raise into the user's loop, even under `python -W error`: they
are logged instead when the warnings filter turns them into exceptions.

This module imports no torch at import time: `import trainprof` stays cheap.
"""

from __future__ import annotations

from trainprof.session.common import (
    MAX_WINDOWS,
    UNPROFILED_STEPS_KEPT,
    ProfilerBusy,
    _worker_name,
    process_rank,
    worker_name,
)
from trainprof.session.hooks import _dispatch_optimizer_step
from trainprof.session.lifecycle import Session, session
from trainprof.user_code import warn

__all__ = [
    "MAX_WINDOWS",
    "UNPROFILED_STEPS_KEPT",
    "ProfilerBusy",
    "Session",
    "_dispatch_optimizer_step",
    "_worker_name",
    "process_rank",
    "session",
    "warn",
    "worker_name",
]
