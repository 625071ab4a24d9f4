"""The session's lifecycle: `Session` starts the profiler and what is captured beside it (sync
sites, the allocator's state, NVTX ranges, the watch for another profiler), stops and undoes every
part, and steps aside on a failure of its own; its steps, timing, outputs and gathering are the
mixins of `hooks`, `timing`, `outputs` and `gathering`."""

from __future__ import annotations

import collections
import itertools
import json
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.config import SessionConfig
from trainprof.files import SESSION_METADATA_KEY
from trainprof.gather import GroupHandle
from trainprof.session import hooks
from trainprof.session.common import (
    _OURS,
    MAX_WINDOWS,
    UNPROFILED_STEPS_KEPT,
    ProfilerBusy,
    _not_profiled,
    _worker_name,
    logger,
    process_rank,
)
from trainprof.session.gathering import Gathering
from trainprof.session.hooks import (
    StepHooks,
    _install_step_hook,
    _nvtx_module,
    _TorchSchedule,
    _watch_other_profilers,
)
from trainprof.session.outputs import Outputs
from trainprof.session.timing import UnprofiledTiming
from trainprof.user_code import warn

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.distributed import CrossRank
    from trainprof.analysis.result import Analysis, Finding, Summary
    from trainprof.capture.arrival import ForwardMarks
    from trainprof.capture.memory import MemoryCapture
    from trainprof.capture.syncs import SyncCapture
    from trainprof.trace.sync_sites_file import Timing


class Session(StepHooks, UnprofiledTiming, Outputs, Gathering):
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
        import torch
        from torch.profiler import ProfilerActivity, profile

        with hooks._ACTIVE_LOCK:  # two threads starting sessions at once: exactly one gets the profiler
            active = hooks._ACTIVE
            if active is not None and active._running and active._pid == os.getpid():
                raise ProfilerBusy("trainprof: another trainprof session is running in this process; this "
                                   "one steps aside (two profilers at once crash torch), training goes on")
            if torch.autograd._profiler_enabled():
                raise ProfilerBusy("trainprof: a torch profiler is already running; the session steps aside "
                                   "so that it keeps recording (two at once crash torch), training goes on")
            _install_step_hook()
            from trainprof.capture.fork_exit import exit_forked_children

            exit_forked_children()  # a child forked from now on would hang at exit in Kineto
            self._running, self._pid, self._thread = True, os.getpid(), threading.get_ident()
            hooks._ACTIVE = self
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

    def _shutdown(self) -> None:
        """Stop capturing and profiling; every part is attempted, the first error is raised.

        A KeyboardInterrupt in one part still lets the others run, then is raised.
        """
        self._running = False
        with hooks._ACTIVE_LOCK:
            if hooks._ACTIVE is self:
                hooks._ACTIVE = None
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
