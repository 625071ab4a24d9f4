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

import collections
import contextlib
import itertools
import json
import logging
import os
import re
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.config import SessionConfig
from trainprof.files import SESSION_METADATA_KEY, SYNCSITES_SUFFIX, write_text_atomically
from trainprof.gather import GroupHandle
from trainprof.user_code import warn

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.result import Analysis, Finding, Summary
    from trainprof.capture.arrival import ForwardMarks
    from trainprof.capture.memory import MemoryCapture
    from trainprof.capture.syncs import SyncCapture
    from trainprof.trace.sync_sites_file import Timing

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


_ACTIVE: Session | None = None
"""The session whose profiler runs in this process, if any (torch allows one profiler at a time)."""
_ACTIVE_LOCK = threading.Lock()
"""Held while a session claims `_ACTIVE` and while the step hook is installed (threads race there)."""
_STEP_HOOK: Any = None
"""The handle of the process-wide optimizer-step hook (`_dispatch_optimizer_step`), once installed."""

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


class Session:
    """A profiling session around a training loop; see `trainprof.session`.

    At exit `analysis` holds the result, and `summary` and `findings` are its `Summary` and
    `Finding`s. `summary.verdict` always exists: `"not-profiled"` (with `summary.reason` and no
    figures) when nothing was recorded or analysed.
    """

    def __init__(self, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        from trainprof.run_name import shared_run_name

        # Under a launcher every rank's default is the launch's shared name (`trainprof.run`): one
        # folder for the job, as `trainprof analyze` and the cross-rank report expect.
        shared = shared_run_name() if self.config.run_name is None else None
        self._named_run = self.config.run_name is not None or shared is not None
        self.run_dir = Path(self.config.log_dir).expanduser() / (shared or self.config.resolved_run_name())
        """This run's folder: `run_name`, else the launch's shared name under torchrun (or another
        launcher, `trainprof.run_name.shared_run_name`), else a timestamp that gets `-2`, `-3`... when
        taken (decided at start)."""
        self.rank = process_rank()
        self.worker = _worker_name(self.rank)
        self.started_by = "session"
        """How the user started it, for advice that they can follow: `session` (their own `with`
        block), `run` (`trainprof run`, set by `trainprof.run`), `callback` (a framework callback)."""
        self.analysis: Analysis | None = None
        self.findings: list[Finding] = []
        self.summary: Summary = _not_profiled("the session has not ended")
        self.written: dict[str, Path] = {}
        """The files written at exit: `summary`, `report` (per-rank names when the process has a rank);
        on rank 0 of a process group, `ranks_summary` and `ranks_report` (the cross-rank report)."""
        self.cross_rank: CrossRank | None = None
        """On rank 0 of a process group: the cross-rank report from the ranks' gathered summaries."""
        self.windows_written = 0
        """Recorded windows exported so far (each one trace file)."""
        self.steps_ended = 0
        """Steps ended so far (optimizer steps or manual `step()` calls)."""
        self.unprofiled_step_ms: list[float] = []
        """Set at exit: ms of the most recent steps the profiler did not touch (module docstring)."""
        self.unprofiled_timing: Timing | None = None
        """Set at exit with them: how they were timed, `cuda_events` or `host`."""
        self.unprofiled_pre_forward_ms: list[float] = []
        """Set at exit: per un-profiled step, ms from its start to its first module forward, timed as
        `unprofiled_timing` says (`trainprof.capture.arrival`)."""
        self._forward_marks: ForwardMarks | None = None
        self._host_step_ms: collections.deque[float] = collections.deque(maxlen=UNPROFILED_STEPS_KEPT)
        self._step_began: float | None = None  # perf_counter when trainprof's work at the last step end ended
        self._gpu_marks: collections.deque[tuple[int, Any]] | None = None
        """(step, CUDA event recorded as that step began): None without CUDA, or once a mark failed."""
        self._windows: collections.deque[tuple[Path, list[dict[str, Any]]]] = collections.deque(
            maxlen=MAX_WINDOWS
        )
        self._profiler: Any = None
        self._capture: SyncCapture | None = None
        self._memory: MemoryCapture | None = None  # the allocator's state (trainprof.capture.memory)
        self._compile_counters: dict[str, Any] | None = None  # Dynamo's, read as each window ends
        self._thread: int | None = None
        """The thread that started the session: only its optimizer steps end steps."""
        self._pid: int | None = None
        """The process that started the session: a child forked inside a window records nothing."""
        self._primary_optimizer: weakref.ref[Any] | None = None  # the optimizer that ended the last step
        self._same_iteration: weakref.WeakSet[Any] = weakref.WeakSet()  # others that stepped since
        self._manual = False
        self._last_step_by_optimizer = False
        self._running = False
        self._discard = False
        self._failure: tuple[str, BaseException] | None = None
        self._user_error = False
        self._cycle_filter: Any = None
        self._canary: Any = None  # a torch_noise.NoiseCanary when memory is profiled
        self._unwatch: Any = None
        self._nvtx: Any = None
        self._nvtx_depth = 0
        self._nvtx_phase: str | None = None
        self._group = GroupHandle.new()
        self._console_deferred = False  # whether rank 0's console report waits for the cross-rank merge
        self._made_run_dir = False  # whether start() made the run folder (an empty one goes at stop)

    @property
    def trace_files(self) -> list[Path]:
        """The trace files of the last `MAX_WINDOWS` recorded windows, oldest first."""
        return [path for path, _ in self._windows]

    @property
    def sync_sites(self) -> list[dict[str, Any]]:
        """The captured sync sites (JSON form) of those windows, in order."""
        return [site for _, sites in self._windows for site in sites]

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            self.stop(user_error=exc_type is not None, error=exc)
        except KeyboardInterrupt:  # Ctrl-C while the session stops: the user's, not a trainprof error
            self.summary = _not_profiled("interrupted (Ctrl-C) while the session stopped")
            if exc_type is KeyboardInterrupt:
                return False  # a second Ctrl-C: the first goes on, with the user's own traceback
            raise KeyboardInterrupt from None  # shown from the `with` line, not trainprof's frames
        return False  # the user's exception, if any, propagates unchanged

    def start(self) -> Session:
        """Start the profiler and the step hook. A failure warns once and leaves the loop unprofiled."""
        if self._running:
            return self
        try:
            self._start()
        except ProfilerBusy as exc:
            self._step_aside(str(exc), None)
        except _OURS as exc:
            self._step_aside("starting the profiler", exc)
        return self

    def _start(self) -> None:
        global _ACTIVE
        import torch
        from torch.profiler import ProfilerActivity, profile

        with _ACTIVE_LOCK:  # two threads starting sessions at once: exactly one gets the profiler
            if _ACTIVE is not None and _ACTIVE._running and _ACTIVE._pid == os.getpid():
                raise ProfilerBusy("trainprof: another trainprof session is running in this process; this "
                                   "one steps aside (two profilers at once crash torch), training goes on")
            if torch.autograd._profiler_enabled():
                raise ProfilerBusy("trainprof: a torch profiler is already running; the session steps aside "
                                   "so that it keeps recording (two at once crash torch), training goes on")
            _install_step_hook()
            from trainprof.capture.fork_exit import exit_forked_children

            exit_forked_children()  # a child forked from now on would hang at exit in Kineto
            self._running, self._pid, self._thread = True, os.getpid(), threading.get_ident()
            _ACTIVE = self
        config = self.config
        self._claim_run_dir()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            self._gpu_marks = collections.deque(maxlen=UNPROFILED_STEPS_KEPT + 1)
        from trainprof.capture.arrival import ForwardMarks

        self._forward_marks = ForwardMarks(UNPROFILED_STEPS_KEPT)
        from trainprof.capture import torch_noise
        from trainprof.capture.export import export_window

        self._export = lambda profiler: export_window(profiler, self.run_dir, self.worker)
        # torch warns that each cycle's events are cleared: the session exports every cycle itself,
        # so the warning would only puzzle the user. Filtered while the session runs.
        self._cycle_filter = torch_noise.ignore_cycle_warning()
        if config.profile_memory:
            self._canary = torch_noise.NoiseCanary()
        self._profiler = profile(
            activities=activities,
            schedule=_TorchSchedule(config),  # not torch's schedule(): it warns when warmup == 0
            on_trace_ready=self._on_trace_ready,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
        )
        if config.capture_syncs:
            from trainprof.capture.syncs import SyncCapture

            self._capture = SyncCapture()
        from trainprof.capture import memory

        self._memory = memory.MemoryCapture(config.memory_history, config.memory_history_entries)
        memory.watch(self._memory)
        self._nvtx = _nvtx_module()
        self._unwatch = _watch_other_profilers(self)
        with torch_noise.quiet_torch_stderr():
            self._profiler.start()
        self._group.capture()
        self._follow_schedule()

    def _claim_run_dir(self) -> None:
        """Create the run folder; a default name that is taken becomes `<name>-2`, `-3`, ..."""
        if self._named_run:
            self._made_run_dir = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            return
        base = self.run_dir
        for n in itertools.count(1):
            candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                candidate.mkdir(parents=True)
            except FileExistsError:
                continue
            self.run_dir = candidate
            self._made_run_dir = True
            return

    def stop(self, user_error: bool = False, error: BaseException | None = None) -> None:
        """Stop profiling, undo every hook, and (unless the loop raised) analyse and report; `error`,
        the loop's exception if it raised one: an out-of-memory error is explained in the report (it
        is only read, never changed).

        Nothing of trainprof's own making leaves it (rich's `SystemExit` on a closed stdout
        included); a KeyboardInterrupt does, once the profiler is stopped.
        """
        if not self._running:
            return
        if os.getpid() != self._pid:
            self._leave_forked_child()
            return
        try:
            self._stop_and_report(user_error, error)
        finally:
            self._across_ranks()
            self._print_deferred_report()  # where the gather failed or found no other rank
            self._drop_empty_run_dir()

    def _drop_empty_run_dir(self) -> None:
        """A run that wrote nothing (the loop raised or ended early) leaves no empty folder behind;
        under a launcher the folder is the job's, which another rank may still write into."""
        if not self._made_run_dir or self.rank is not None:
            return
        try:
            self.run_dir.rmdir()  # only an empty folder goes
        except OSError:
            pass

    def _stop_and_report(self, user_error: bool, error: BaseException | None = None) -> None:
        self._user_error = user_error
        # Read before the profiler's stop: the allocator's state is then still the error's.
        out_of_memory = user_error and self._record_out_of_memory(error)
        try:
            self._shutdown()  # flushes a partly recorded window through _on_trace_ready
        except _OURS as exc:
            self._step_aside("stopping the profiler", exc)
            return
        if self._failure is not None:
            self._step_aside(*self._failure)
            return
        if user_error and not out_of_memory:
            self.summary = _not_profiled("the training loop raised")
            return
        try:
            self._finish()
        except _OURS as exc:
            self._step_aside("writing the report", exc)

    def _record_out_of_memory(self, error: BaseException | None) -> bool:
        """Whether the loop's `error` is an out-of-memory error, recorded (`capture.memory`)."""
        if self._memory is None or error is None:
            return False
        try:
            optimizer = self._primary_optimizer() if self._primary_optimizer is not None else None
            recording = self.config.action_at(self.steps_ended) in ("record", "save")
            return self._memory.on_error(error, self.steps_ended, recording, optimizer, self.run_dir,
                                         self.worker)
        except _OURS:
            logger.debug("trainprof: recording the out-of-memory error failed", exc_info=True)
            return False

    def _across_ranks(self) -> None:
        """Hand this rank's summary to rank 0 (none when it has no analysis, so that rank 0 need not
        wait for it); on rank 0, write the cross-rank report. Never raises (`trainprof.gather`)."""
        try:
            self._group.capture()
            if not self._group.ready or self.config.gather_timeout_s <= 0:
                return
            from trainprof.analysis.distributed import analysis_summary
            from trainprof.gather import gather_summaries

            rank = self._group.rank
            summary = analysis_summary(self.analysis, rank) if self.analysis is not None else None
            if rank == 0 and summary is None:
                return  # no report of its own to set the others beside
            gathered = gather_summaries(self._group, summary, self.config.gather_timeout_s)
            if gathered is not None:
                self._write_cross_rank(*gathered)
        except _OURS as exc:  # the cross-rank report must never end the run
            logger.debug("trainprof: the cross-rank report failed", exc_info=True)
            warn(f"trainprof: the cross-rank report failed ({type(exc).__name__}: {exc}); each rank's "
                 "own report is written")

    def _write_cross_rank(self, summaries: list[Any], missing: list[int]) -> None:
        """On rank 0: merge the gathered summaries, write and announce the cross-rank report."""
        if len(summaries) < 2:
            warn(f"trainprof: no other rank reported within gather_timeout_s={self.config.gather_timeout_s:g}"
                 " s; no cross-rank report (trainprof analyze on the run folder makes one from the traces)")
            return
        from trainprof.analysis.distributed import cross_rank
        from trainprof.analysis.thresholds import Thresholds
        from trainprof.report.ranks import print_cross_rank, write_cross_rank

        limits = Thresholds()
        self.cross_rank, findings = cross_rank(summaries, limits)
        written = write_cross_rank(self.cross_rank, findings, self.run_dir, self._group.world_size, missing)
        self.written["ranks_summary"], self.written["ranks_report"] = written["summary"], written["report"]
        if self.analysis is not None:  # its own report, now with what the other ranks say
            from trainprof.analysis.core import with_cross_rank
            from trainprof.report import write_reports

            self.analysis = with_cross_rank(self.analysis, 0, self.cross_rank, findings, limits)
            self.findings, self.summary = self.analysis.findings, self.analysis.summary
            self.written.update(write_reports(self.analysis, self.run_dir, tensorboard_scalars=False,
                                              console=False, rank=self.rank))
        if self.config.console:
            self._print_deferred_report()
            self._print(print_cross_rank, self.cross_rank, written["report"])

    def _shutdown(self) -> None:
        """Stop capturing and profiling; every part is attempted, the first error is raised.

        A KeyboardInterrupt in one part still lets the others run, then is raised.
        """
        global _ACTIVE
        self._running = False
        with _ACTIVE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None
        errors: list[BaseException] = []
        for undo in (self._stop_capture, self._stop_profiler, self._remove_cycle_filter,
                     self._remove_watch, self._close_nvtx, self._stop_forward_marks, self._stop_memory):
            try:
                undo()
            except BaseException as exc:  # noqa: BLE001 - every part runs; the first error is raised
                errors.append(exc)
        if errors:
            raise next((e for e in errors if not isinstance(e, _OURS)), errors[0])

    def _leave_forked_child(self) -> None:
        """In a child forked while the session ran: record nothing and leave the parent's profiler
        alone (stopping it here would export the child's copy under the parent's name, or abort)."""
        self._running = False
        self._profiler = None
        self._nvtx = None
        self._capture = None
        self.summary = _not_profiled("a process forked inside the session: only the parent is profiled")
        logger.debug("trainprof: %s", self.summary.reason)

    def _stop_memory(self) -> None:
        if self._memory is not None:
            from trainprof.capture import memory

            memory.watch(None)
            self._memory.stop(self.run_dir, self.worker)

    def _stop_forward_marks(self) -> None:
        if self._forward_marks is not None:
            self._forward_marks.disarm()

    def _remove_cycle_filter(self) -> None:
        entry, self._cycle_filter = self._cycle_filter, None
        if entry is not None:
            from trainprof.capture import torch_noise

            torch_noise.restore(entry)

    def _remove_watch(self) -> None:
        if self._unwatch is not None:
            unwatch, self._unwatch = self._unwatch, None
            unwatch()

    def _stop_capture(self) -> None:
        if self._capture is not None:
            self._capture.deactivate()

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            from trainprof.capture import torch_noise

            profiler, self._profiler = self._profiler, None
            self._mark_unfinished_step(profiler)
            with torch_noise.quiet_torch_stderr():
                profiler.stop()

    def _mark_unfinished_step(self, profiler: Any) -> None:
        """Stopping inside a recorded window exports it with the step that never ended: say so in
        the trace itself, so that re-analysing the run folder drops that step as the session does."""
        from torch.profiler import ProfilerAction

        if profiler.current_action not in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            return
        try:
            profiler.add_metadata_json(SESSION_METADATA_KEY, json.dumps({"steps_ended": self.steps_ended}))
        except Exception:  # the session's own analysis still drops the step
            logger.debug("trainprof: marking the unfinished step failed", exc_info=True)

    def _step_aside(self, what: str, exc: BaseException | None) -> None:
        """A failure inside trainprof: warn once, stop everything, let the training loop run on.

        `exc` None: `what` is the whole message (another profiler runs: not a failure of trainprof).
        """
        self._failure = None
        self._discard = True  # a window flushed while stopping is not exported
        try:
            self._shutdown()
        except _OURS:
            logger.debug("trainprof: error while stepping aside", exc_info=True)
        if exc is None:
            message = what
        else:
            logger.debug("trainprof: %s failed", what, exc_info=exc)
            message = (f"trainprof: {what} failed ({type(exc).__name__}: {exc}); profiling stopped, "
                       "training goes on")
        self.summary = _not_profiled(message)
        warn(message)

    def _yield_to_other_profiler(self) -> None:
        """Another torch profiler is starting (the user's own): stop ours first, warn once."""
        self._step_aside("trainprof: another torch profiler started inside the session; the session "
                         "stopped so that it records (two at once crash torch), training goes on", None)

    # -- steps -------------------------------------------------------------------------------

    def step(self) -> None:
        """End the current step; for loops without an optimizer (see the module docstring)."""
        if not self._manual:
            self._manual = True
            if self._last_step_by_optimizer:
                # This call closes the step that the optimizer just ended: count it once.
                self._last_step_by_optimizer = False
                return
        self._advance()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._manual or threading.get_ident() != self._thread:
            return  # another thread's loop (its own session stepped aside): not this session's steps
        # The first optimizer to step after a step's end ends the next step; another that steps before
        # it steps again is of the same iteration (a GAN's second). One stepping a second time since,
        # or any once the step-ender is gone (replaced: stage-wise fine-tuning), ends a step.
        ender = self._primary_optimizer() if self._primary_optimizer is not None else None
        if ender is not None and optimizer is not ender and optimizer not in self._same_iteration:
            self._same_iteration.add(optimizer)
            return
        self._primary_optimizer, self._same_iteration = weakref.ref(optimizer), weakref.WeakSet()
        self._advance()
        self._last_step_by_optimizer = True

    def _advance(self) -> None:
        if not self._running or os.getpid() != self._pid:
            return
        ended = time.perf_counter()
        self._group.capture()  # a script may create its process group after the session started
        self.steps_ended += 1
        # The step that just ended ran under action_at(steps_ended - 1).
        if self._step_began is not None and self._unprofiled(self.steps_ended - 1):
            self._host_step_ms.append((ended - self._step_began) * 1e3)
        try:
            self._profile_step()
        finally:
            self._mark_gpu()
            self._step_began = time.perf_counter()
            self._mark_forward()

    def _mark_forward(self) -> None:
        """Arm the first-forward mark of the step that begins, when it is un-profiled
        (`trainprof.capture.arrival`); else make sure no mark is armed."""
        marks = self._forward_marks
        if marks is None:
            return
        step = self.steps_ended
        if self._running and self._unprofiled(step):
            marks.arm(step, self._step_began, cuda=self._gpu_marks is not None)
        else:
            marks.disarm()

    def _unprofiled(self, step: int) -> bool:
        """Whether step `step` counts as an un-profiled step: the profiler off, and after the first
        window began (the steps before it are the loop's warm-up: compilation, cuDNN's search, the
        allocator growing; `skip_first` is there to skip them)."""
        config = self.config
        return step >= config.skip_first + config.wait and config.action_at(step) == "none"

    def _mark_gpu(self) -> None:
        """A CUDA event where the GPU begins step `steps_ended`, where it starts or ends an un-profiled
        step, unless the profiler records that step (the event would be in its trace) or the stream is
        being captured into a CUDA graph (an event recorded there would break the user's capture): two
        marks around an un-profiled step time it as the GPU runs it, host lead and all. Any failure
        turns the marks off for the session."""
        step = self.steps_ended
        if (
            self._gpu_marks is None
            or not (self._unprofiled(step) or self._unprofiled(step - 1))
            or self.config.action_at(step) in ("record", "save")
        ):
            return
        try:
            import torch

            if torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                self._gpu_marks.append((step, event))
        except Exception:
            logger.debug("trainprof: CUDA step marks off", exc_info=True)
            self._gpu_marks = None

    def _time_unprofiled_steps(self) -> None:
        """At exit: the un-profiled steps' times from the GPU marks (after the last one is reached),
        else from the host clock (`unprofiled_step_ms`, `unprofiled_timing`)."""
        marks = list(self._gpu_marks or ())
        if self._forward_marks is not None:
            self.unprofiled_pre_forward_ms, _ = self._forward_marks.pre_forward_ms(dict(marks))
        gpu_ms: list[float] = []
        try:
            if len(marks) > 1:
                marks[-1][1].synchronize()
                gpu_ms = [
                    start.elapsed_time(end)
                    for (step, start), (next_step, end) in itertools.pairwise(marks)
                    if next_step == step + 1 and self._unprofiled(step)
                ]
        except Exception:
            logger.debug("trainprof: reading the CUDA step marks failed", exc_info=True)
            gpu_ms = []
        self._gpu_marks = None
        if gpu_ms:
            self.unprofiled_step_ms, self.unprofiled_timing = gpu_ms[-UNPROFILED_STEPS_KEPT:], "cuda_events"
        elif self._host_step_ms:
            self.unprofiled_step_ms, self.unprofiled_timing = list(self._host_step_ms), "host"

    def _profile_step(self) -> None:
        if self._capture is not None:
            self._capture.pause()  # the profiler's own syncs (stopping a trace) are not the user's
        try:
            if self._window_edge(self.steps_ended):
                # torch prints its start/stop lines here (trainprof.capture.torch_noise)
                from trainprof.capture import torch_noise

                with torch_noise.quiet_torch_stderr():
                    self._profiler.step()  # may call _on_trace_ready
                    recording = self.config.action_at(self.steps_ended) in ("record", "save")
                    if self._canary is not None and recording:
                        self._canary.release()  # c10's allocator line, inside this filter
                    elif self._canary is not None:
                        self._canary.arm()  # memory profiling is off again: blocks for the next window
            else:
                self._profiler.step()
            if self._failure is None:
                self._follow_schedule()
        except _OURS as exc:
            self._step_aside("the profiler step", exc)
            return
        if self._failure is not None:
            self._step_aside(*self._failure)

    def _window_edge(self, step: int) -> bool:
        """Whether the profiler step into `step` starts or ends a recorded window (or a warm-up)."""
        before = self.config.action_at(step - 1)
        return before == "save" or before != self.config.action_at(step)

    def _follow_schedule(self) -> None:
        """Capture sync sites exactly during the recorded steps; NVTX ranges per phase and step; the
        allocator's history from the first recorded step (`memory_history=True`)."""
        if self._nvtx is not None:
            self._mark_nvtx()
        if self._memory is not None:
            self._memory.follow(self.config.action_at(self.steps_ended), self.steps_ended)
        if self._capture is None:
            return
        from torch.profiler import ProfilerAction

        action = self._profiler.current_action
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._capture.activate(self._profiler.step_num)
        elif action == ProfilerAction.WARMUP:
            self._capture.prepare()  # its one-off cost lands in the warm-up step, not in a recorded one
        else:
            self._capture.deactivate()

    def _mark_nvtx(self) -> None:
        """Close the last step's NVTX range (and its phase's, when the phase changes), open the next.

        Nsight Systems then shows `trainprof wait|warmup|record` ranges holding `trainprof step N`.
        NVTX needs CUDA; any failure turns NVTX off for the session.
        """
        try:
            action = self.config.action_at(self.steps_ended)
            phase = {"none": "wait", "save": "record"}.get(action, action)
            if self._nvtx_depth == 2:
                self._nvtx.range_pop()
                self._nvtx_depth = 1
            if phase != self._nvtx_phase:
                if self._nvtx_depth == 1:
                    self._nvtx.range_pop()
                    self._nvtx_depth = 0
                self._nvtx.range_push(f"trainprof {phase}")
                self._nvtx_depth, self._nvtx_phase = 1, phase
            self._nvtx.range_push(f"trainprof step {self.steps_ended}")
            self._nvtx_depth = 2
        except Exception:
            logger.debug("trainprof: NVTX ranges off", exc_info=True)
            self._nvtx = None

    def _close_nvtx(self) -> None:
        nvtx, self._nvtx = self._nvtx, None
        while nvtx is not None and self._nvtx_depth > 0:
            self._nvtx_depth -= 1
            nvtx.range_pop()

    # -- outputs -----------------------------------------------------------------------------

    def _on_trace_ready(self, profiler: Any) -> None:
        """Export the window's trace and write the sync sites beside it.

        Runs inside torch's `profiler.step()`/`stop()`: it never raises into torch; a failure is
        kept and handled (one warning, step aside) once torch is done. No analysis here: it runs once
        at exit, out of the training loop's steps.
        """
        if self._failure is not None or self._discard:
            return
        try:
            trace_path = self._export(profiler)  # whole, or nothing under a trace's name (capture.export)
            sites: list[dict[str, Any]] = []
            if self._capture is not None:
                self._capture.deactivate()  # the window is over; nothing may be recorded past it
                sites = [site.to_dict() for site in self._capture.take_sites()]
            self._windows.append((trace_path, sites))
            self.windows_written += 1
            if self._memory is not None:  # the allocator's state as the window ended (never raises)
                self._memory.window_ended(self.run_dir, self.worker, trace_path.name, self.steps_ended)
            from trainprof.capture.compile import dynamo_counters  # its package imports the sync capture

            self._compile_counters = dynamo_counters() or self._compile_counters
            if self._capture is not None or self._compile_counters:
                self._write_sync_sites()
        except BaseException as exc:
            if not isinstance(exc, _OURS):  # Ctrl-C: the user's, raised on (no cut file is left)
                self._discard = True
                raise
            self._failure = ("exporting the trace", exc)

    def _write_sync_sites(self) -> None:
        """`<worker>.syncsites.json` through the type the loader reads it with (`sync_sites_file`)."""
        from trainprof.trace import sync_sites_file as sites_file
        from trainprof.user_code import with_versions

        path = self.run_dir / f"{self.worker}{SYNCSITES_SUFFIX}"
        layout = self._capture.layout if self._capture is not None else None
        document = sites_file.SyncSitesFile(
            worker=self.worker,
            # where library code lived in this run, so the analysis draws the user/library line here too
            code_layout=with_versions(layout) if layout is not None else None,
            sites=[sites_file.site_of(site) for site in self.sync_sites],
            # torch.compile's graph breaks (trainprof.capture.compile)
            compile=sites_file.compile_counters_of(self._compile_counters),
            # written at exit, once the steps after the last window ran
            unprofiled=sites_file.UnprofiledSteps(
                self.unprofiled_step_ms or None, self.unprofiled_timing,
                self.unprofiled_pre_forward_ms or None,
            ),
        )
        write_text_atomically(path, sites_file.encode(document))

    def _write_peaks(self) -> None:
        """The device's measured matmul and copy rates beside the traces (`trainprof.capture.peaks`):
        measured once per device and torch version, after the profiler stopped; nothing on a CPU."""
        from trainprof.capture.peaks import current_device_peaks, write_beside

        peaks = current_device_peaks()
        if peaks is not None:
            write_beside(self.run_dir, self.worker, peaks)

    def _load_finished_steps(self) -> list[Any]:
        """The kept windows' traces, less the step that never ended (a loop that stopped mid-window).

        torch closes the current `ProfilerStep#N` when it stops; step N never ran to its end, so
        counting it would report a step that is only the time between the last step and the exit.
        The loader drops it too, from the mark `_mark_unfinished_step` leaves in the trace.
        """
        from trainprof.trace import load_traces
        from trainprof.trace.load import NoFinishedStep, drop_unfinished_steps

        traces = []
        for path, _ in self._windows:
            with contextlib.suppress(NoFinishedStep):
                traces += load_traces(str(path))
        return [trace for trace in traces if drop_unfinished_steps(trace, self.steps_ended)]

    def _finish(self) -> None:
        """At exit: one analysis of the kept windows, then the reports, then say where files went."""
        out_of_memory = self._memory is not None and self._memory.out_of_memory is not None
        if not self._windows:
            if not (out_of_memory and self._report_out_of_memory_alone()):
                self._say_nothing_recorded()
            return
        if self.config.measure_peaks and not out_of_memory:  # for an offline analysis too; not on a
            self._write_peaks()  # full device: measuring allocates
        self._time_unprofiled_steps()
        if self.unprofiled_step_ms:  # beside the traces, for this analysis and an offline one
            try:
                self._write_sync_sites()
            except OSError as exc:  # the analysis goes on without them
                warn(f"trainprof: could not write the un-profiled step times beside the traces ({exc})")
        if not self.config.analyze:
            self._write_memory(self._windows[-1][0].name, [])
            reason = "analyze=False: traces written, not analysed"
            self.summary = _not_profiled(reason)
            self._say_where(analysed=False)
            return
        traces = self._load_finished_steps()
        self._write_memory(traces[-1].path.name if traces else None, traces)
        if not traces:
            if not (out_of_memory and self._report_out_of_memory_alone()):
                self._say_nothing_recorded()
            return
        from trainprof.analysis import analyze

        try:
            self.analysis = analyze(traces, views=True)  # views: what report.html draws
        except Exception:  # the drawings are extra: the summary and the findings must still come
            logger.warning("trainprof: report.html's drawings failed; the report goes without them",
                           exc_info=True)
            self.analysis = analyze(traces)
        self._report(self.config.tensorboard_scalars)

    def _report(self, tensorboard_scalars: bool) -> None:
        """Write and print the reports of `self.analysis`, then say where files went."""
        self.findings = self.analysis.findings
        self.summary = self.analysis.summary
        from trainprof.report import write_reports

        self.written = write_reports(
            self.analysis,
            self.run_dir,
            tensorboard_scalars=tensorboard_scalars,
            console=False,
            rank=self.rank,
        )
        if self.config.console:
            self._group.capture()
            if self._gathers_here():  # printed once the other ranks' findings are merged in
                self._console_deferred = True
            else:
                from trainprof.report.console import print_report

                self._print(print_report, self.analysis)
        self._say_where(analysed=True)

    def _gathers_here(self) -> bool:
        """Whether this process is rank 0 of a job whose ranks hand it their summaries: its console
        report waits for theirs, so that it leads with what holds the job (a straggler), not with
        what its own trace blames."""
        return self._group.ready and self._group.rank == 0 and self.config.gather_timeout_s > 0

    def _print_deferred_report(self) -> None:
        """The console report `_report` held back on rank 0, now with the other ranks' findings."""
        if not self._console_deferred or self.analysis is None:
            return
        self._console_deferred = False
        from trainprof.report.console import print_report

        self._print(print_report, self.analysis)

    def _write_memory(self, last_trace: str | None, traces: list[Any]) -> None:
        """`<worker>.memory.json` beside the traces (`capture.memory`), its out-of-memory error named
        after `last_trace`, the last window with a finished step; `traces` get what it holds."""
        if self._memory is None:
            return
        try:
            document = self._memory.write(self.run_dir, self.worker, last_trace)
        except OSError as exc:  # the analysis goes on with the capture in memory
            warn(f"trainprof: could not write the allocator's state beside the traces ({exc})")
            document = self._memory.document(self.worker, last_trace)
        for trace in traces:
            trace.memory_file = document

    def _report_out_of_memory_alone(self) -> bool:
        """The loop ran out of memory before a recorded step ended: report the error alone; whether
        there was an error to report (written with `config.analyze`)."""
        self._write_memory(None, [])
        if not self.config.analyze:
            return False
        from trainprof.analysis.core import without_window
        from trainprof.analysis.thresholds import Thresholds

        self.analysis = without_window([self._memory.document(self.worker, None)], Thresholds())
        self._report(tensorboard_scalars=False)
        return True

    def _say_nothing_recorded(self) -> None:
        """The loop ended before a recorded step ended: say so, and how to fix it in the way the
        session was started (`started_by`)."""
        config = self.config
        first = config.skip_first + config.wait + config.warmup
        if self.steps_ended == 0:
            reason = f"no step ended inside the session, so nothing was profiled: {_NO_STEP[self.started_by]}"
        else:
            reason = (f"the loop ended after {self.steps_ended} step(s), before a recorded step ended "
                      f"(recording starts after skip_first + wait + warmup = {first} steps and needs one "
                      f"step to end): nothing was profiled; {_FEWER_STEPS[self.started_by]}")
        self.summary = _not_profiled(reason)
        warn(f"trainprof: {reason}")

    def _say_where(self, analysed: bool) -> None:
        names = [path.name for path in self.trace_files] + [path.name for path in self.written.values()]
        if self.config.console:
            from trainprof.report.console import print_written

            self._print(print_written, self.run_dir, names, self.windows_written, len(self._windows))
        logger.info("trainprof: wrote %s: %s", self.run_dir, ", ".join(names))

    def _print(self, printer: Any, *args: Any) -> None:
        """Print to the console; a closed stdout (`python train.py | head`) only logs.

        rich turns a broken pipe into `SystemExit(1)` (after pointing stdout at /dev/null); the files
        are written by then, and the user's code after the session must run with its own status.
        """
        try:
            printer(*args)
        except _OURS as exc:
            logger.info("trainprof: could not print to the console (%s: %s)", type(exc).__name__, exc)


def _dispatch_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The one optimizer-step hook: hands the step to the running session, if any."""
    session = _ACTIVE
    if session is not None:
        session._on_optimizer_step(optimizer, args, kwargs)


def _install_step_hook() -> None:
    """Install `_dispatch_optimizer_step` once per process (caller holds `_ACTIVE_LOCK`).

    Never removed: see the module docstring. Adding it can still race with another thread that is
    inside its own global optimizer hooks at that moment (a user's); it happens once per process.
    """
    global _STEP_HOOK
    if _STEP_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK = register_optimizer_step_post_hook(_dispatch_optimizer_step)


class _TorchSchedule:
    """`SessionConfig.action_at` as torch.profiler's schedule (step -> ProfilerAction)."""

    def __init__(self, config: SessionConfig) -> None:
        from torch.profiler import ProfilerAction

        self._config = config
        self._actions = {"none": ProfilerAction.NONE, "warmup": ProfilerAction.WARMUP,
                         "record": ProfilerAction.RECORD, "save": ProfilerAction.RECORD_AND_SAVE}

    def __call__(self, step: int) -> Any:
        return self._actions[self._config.action_at(step)]


def _nvtx_module() -> Any:
    """torch.cuda.nvtx when CUDA is present, else None (NVTX raises on a CPU-only build)."""
    import torch

    return torch.cuda.nvtx if torch.cuda.is_available() else None


def _watch_other_profilers(owner: Session) -> Any:
    """While `owner` runs, a torch profiler other than its own that starts makes it step aside first.

    Every torch profiler (torch.profiler.profile and torch.autograd.profiler.profile) enables itself
    through `torch.autograd.profiler.profile._prepare_trace`. Returns the undo.
    """
    from torch.autograd import profiler as autograd_profiler

    cls = autograd_profiler.profile
    original = cls._prepare_trace
    session_ref = weakref.ref(owner)

    def _prepare_trace(prof: Any, *args: Any, **kwargs: Any) -> Any:
        session = session_ref()
        if session is not None and session._running and session._pid == os.getpid():
            ours = getattr(session._profiler, "profiler", None)
            if prof is not ours:
                session._yield_to_other_profiler()
        return original(prof, *args, **kwargs)

    _prepare_trace.__wrapped__ = original  # type: ignore[attr-defined]
    cls._prepare_trace = _prepare_trace

    def undo() -> None:
        if cls.__dict__.get("_prepare_trace") is _prepare_trace:
            cls._prepare_trace = original

    return undo


_NO_STEP = {
    "session": "steps end at each optimizer.step() of a torch.optim optimizer; a loop without one "
               "calls sess.step() once per iteration",
    "run": "steps end at each optimizer.step() of a torch.optim optimizer; a script without one "
           "cannot be profiled by `trainprof run`: wrap its loop in `with trainprof.session() as sess:` "
           "and call sess.step() once per iteration",
    "callback": "the callback ends a step at each of the framework's optimizer steps, and training "
                "ended before the first one",
}
"""Why no step ended, and what to do, by `Session.started_by`."""
_FEWER_STEPS = {
    "session": "run more steps or lower wait/warmup",
    "run": "run more steps or lower --wait/--warmup",
    "callback": "train more steps or lower the callback's wait/warmup",
}
"""What to do when the loop ended before a recorded step ended, by `Session.started_by`."""


def session(
    log_dir: str | os.PathLike[str] = "log",
    run_name: str | None = None,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    skip_first: int = 0,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    **more: Any,
) -> Session:
    """Profile the training loop inside `with trainprof.session(): ...` and report what holds it back.

    `more` takes the other `SessionConfig` fields (capture_syncs, analyze, console,
    tensorboard_scalars). Use `with trainprof.session() as sess:` to reach `sess.step()`,
    `sess.findings` and `sess.summary`.
    """
    unknown = sorted(set(more) - set(SessionConfig.option_names()))
    if unknown:
        raise TypeError(f"session() got unexpected option(s): {', '.join(unknown)}")
    config = SessionConfig(
        log_dir=log_dir,
        run_name=run_name,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        **more,
    )
    return Session(config)
