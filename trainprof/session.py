"""The profiler's lifecycle around an unchanged training loop.

    with trainprof.session():
        train()

Steps are found by themselves: every `optimizer.step()` ends one (torch's global optimizer step
hook). `Session.step()` is for loops without an optimizer; once it is called, the session steps
manually only, and a first manual call right after an optimizer-ended step closes that same step,
so a loop calling both `opt.step(); sess.step()` (either order) counts each step once.

Files (run dir = `log_dir/run_name/`, worker W = `[rankR_]host_pid`):
- `W.<time_ns>.pt.trace.json.gz`: each recorded window, for TensorBoard's PyTorch Profiler tab;
- `W.syncsites.json`: the captured call sites of synchronizing calls (DEVELOPING.md);
- at exit: `summary.json` (the analysis), `report.md`, and TensorBoard scalars (`events.out...`).

This module imports no torch at import time: `import trainprof` stays cheap.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.config import SessionConfig

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis import Analysis
    from trainprof.capture.syncs import SyncCapture

logger = logging.getLogger("trainprof")

SYNCSITES_SUFFIX = ".syncsites.json"
TRACE_SUFFIX = ".pt.trace.json.gz"


def worker_name() -> str:
    """This process's name in file names: `rank<R>_<host>_<pid>`, or `<host>_<pid>` without a rank.

    No dots: a trace's worker is its file name up to the first `.` (trainprof.trace), and
    TensorBoard's profiler plugin reads `<node>_<pid>` from it.

    The rank comes from an initialised torch.distributed group, else from env RANK / LOCAL_RANK, so
    ranks never overwrite each other's files even before (or without) a process group.
    """
    rank: int | None = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
    except Exception:  # a broken distributed setup must not stop profiling
        rank = None
    if rank is None:
        for variable in ("RANK", "LOCAL_RANK"):
            value = os.environ.get(variable, "").strip()
            if value.isdigit():
                rank = int(value)
                break
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "host"
    name = f"{host}_{os.getpid()}"
    return f"rank{rank}_{name}" if rank is not None else name


# The text of torch.profiler's once-per-process warning at the start of a second cycle.
_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"

class Session:
    """A profiling session around a training loop; see `trainprof.session`.

    After a recorded window (and at exit) `findings`, `summary` and `analysis` hold the result.
    """

    def __init__(self, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        self.run_dir = Path(self.config.log_dir) / self.config.resolved_run_name()
        self.worker = worker_name()
        self.analysis: Analysis | None = None
        self.findings: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.trace_files: list[Path] = []
        """The trace files this session wrote, one per recorded window."""
        self.steps_ended = 0
        """Steps ended so far (optimizer steps or manual `step()` calls)."""
        self.sync_sites: list[dict[str, Any]] = []
        """All captured sync sites (JSON form), in order."""
        self._profiler: Any = None
        self._capture: SyncCapture | None = None
        self._optimizer_hook: Any = None
        self._primary_optimizer: weakref.ref[Any] | None = None
        self._manual = False
        self._last_step_by_optimizer = False
        self._running = False
        self._failure: tuple[str, BaseException] | None = None
        self._user_error = False
        self._cycle_filter: Any = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.stop(user_error=exc_type is not None)
        return False  # the user's exception, if any, propagates unchanged

    def start(self) -> Session:
        """Start the profiler and the step hook. A failure warns once and leaves the loop unprofiled."""
        if self._running:
            return self
        try:
            self._start()
        except Exception as exc:
            self._step_aside("starting the profiler", exc)
        return self

    def _start(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        config = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._export = tensorboard_trace_handler(str(self.run_dir), worker_name=self.worker, use_gzip=True)
        # torch warns that each cycle's events are cleared: the session exports every cycle itself,
        # so the warning would only puzzle the user. Filtered while the session runs.
        warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning)
        self._cycle_filter = warnings.filters[0]
        self._profiler = profile(
            activities=activities,
            schedule=schedule(
                wait=config.wait,
                warmup=config.warmup,
                active=config.active,
                repeat=config.repeat,
                skip_first=config.skip_first,
            ),
            on_trace_ready=self._on_trace_ready,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
        )
        if config.capture_syncs:
            from trainprof.capture.syncs import SyncCapture

            self._capture = SyncCapture()
        self._running = True
        self._profiler.start()
        self._optimizer_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._follow_schedule()

    def stop(self, user_error: bool = False) -> None:
        """Stop profiling, remove every hook, and (unless the loop raised) analyse and report."""
        try:
            self._remove_optimizer_hook()
        except Exception:
            logger.debug("trainprof: removing the optimizer step hook failed", exc_info=True)
        if not self._running:
            return
        self._user_error = user_error
        try:
            self._shutdown()  # flushes a partly recorded window through _on_trace_ready
        except Exception as exc:
            self._step_aside("stopping the profiler", exc)
            return
        if self._failure is not None:
            self._step_aside(*self._failure)
            return
        if user_error:
            return
        try:
            self._finish()
        except Exception as exc:
            self._step_aside("writing the report", exc)

    def _shutdown(self) -> None:
        """Stop capturing and profiling; every part is attempted, the first error is raised.

        The optimizer hook stays (inert once not running) until `stop()`: this may run inside that
        hook, and torch iterates its hook dict while calling it.
        """
        self._running = False
        errors: list[BaseException] = []
        for undo in (self._stop_capture, self._stop_profiler, self._remove_cycle_filter):
            try:
                undo()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _remove_optimizer_hook(self) -> None:
        if self._optimizer_hook is not None:
            hook, self._optimizer_hook = self._optimizer_hook, None
            hook.remove()

    def _remove_cycle_filter(self) -> None:
        if self._cycle_filter is not None:
            entry, self._cycle_filter = self._cycle_filter, None
            if entry in warnings.filters:
                warnings.filters.remove(entry)

    def _stop_capture(self) -> None:
        if self._capture is not None:
            self._capture.deactivate()

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()

    def _step_aside(self, what: str, exc: BaseException) -> None:
        """A failure inside trainprof: warn once, stop everything, let the training loop run on."""
        self._failure = None
        try:
            self._shutdown()
        except Exception:
            logger.debug("trainprof: error while stepping aside", exc_info=True)
        logger.debug("trainprof: %s failed", what, exc_info=exc)
        warnings.warn(
            f"trainprof: {what} failed ({type(exc).__name__}: {exc}); profiling stopped, training goes on",
            RuntimeWarning,
            stacklevel=4,
        )

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
        if self._manual:
            return
        # With several optimizers, the first one to step defines the step.
        if self._primary_optimizer is None:
            self._primary_optimizer = weakref.ref(optimizer)
        elif self._primary_optimizer() is not optimizer:
            return
        self._advance()
        self._last_step_by_optimizer = True

    def _advance(self) -> None:
        if not self._running:
            return
        self.steps_ended += 1
        if self._capture is not None:
            self._capture.pause()  # the profiler's own syncs (stopping a trace) are not the user's
        try:
            self._profiler.step()  # may call _on_trace_ready
            if self._failure is None:
                self._follow_schedule()
        except Exception as exc:
            self._step_aside("the profiler step", exc)
            return
        if self._failure is not None:
            self._step_aside(*self._failure)

    def _follow_schedule(self) -> None:
        """Capture sync sites exactly during the recorded steps."""
        if self._capture is None:
            return
        from torch.profiler import ProfilerAction

        if self._profiler.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._capture.activate(self._profiler.step_num)
        else:
            self._capture.deactivate()

    # -- outputs -----------------------------------------------------------------------------

    def _on_trace_ready(self, profiler: Any) -> None:
        """Export the window's trace, write the sync sites beside it, and analyse it.

        Runs inside torch's `profiler.step()`/`stop()`: it never raises into torch; a failure is
        kept and handled (one warning, step aside) once torch is done.
        """
        if self._failure is not None:
            return
        try:
            before = set(self.run_dir.glob(f"{self.worker}.*{TRACE_SUFFIX}"))
            self._export(profiler)
            written = sorted(set(self.run_dir.glob(f"{self.worker}.*{TRACE_SUFFIX}")) - before)
            if not written:
                raise RuntimeError(f"no trace file appeared in {self.run_dir}")
            trace_path = written[-1]
            self.trace_files.append(trace_path)
            if self._capture is not None:
                self._capture.deactivate()  # the window is over; nothing may be recorded past it
                self.sync_sites.extend(site.to_dict() for site in self._capture.take_sites())
                self._write_sync_sites()
            if self.config.analyze and not self._user_error:
                self._analyze([trace_path])
        except Exception as exc:
            self._failure = ("exporting or analysing the trace", exc)

    def _write_sync_sites(self) -> None:
        path = self.run_dir / f"{self.worker}{SYNCSITES_SUFFIX}"
        layout = self._capture.layout if self._capture is not None else None
        payload = {
            "version": 2,
            "worker": self.worker,
            # where library code lived in this run, so the analysis draws the user/library line here too
            "code_layout": layout.to_dict() if layout is not None else None,
            "sites": self.sync_sites,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(path)

    def _analyze(self, trace_paths: list[Path]) -> None:
        from trainprof.analysis import analyze

        if len(trace_paths) == 1:
            # The trace loader reads `W.syncsites.json` beside the trace (written just before).
            analysis = analyze(str(trace_paths[0]))
        else:
            from trainprof.trace import load_traces

            traces = [trace for path in trace_paths for trace in load_traces(str(path))]
            analysis = analyze(traces)
        self.analysis = analysis
        self.findings = [_as_dict(finding) for finding in analysis.findings]
        self.summary = dict(_as_dict(analysis.summary))

    @property
    def report_dir(self) -> Path:
        """Where summary.json, report.md and the scalars go: the run folder, except for rank R > 0,
        whose report goes into `run_dir/rank<R>/` so that ranks sharing a run folder (torchrun,
        `trainprof run`) never overwrite each other's."""
        rank = re.match(r"rank(\d+)_", self.worker)
        if rank is not None and int(rank.group(1)) > 0:
            return self.run_dir / f"rank{rank.group(1)}"
        return self.run_dir

    def _finish(self) -> None:
        """At exit: the analysis of every window, then summary.json, report.md, scalars, console."""
        if not self.config.analyze or not self.trace_files:
            return
        if len(self.trace_files) > 1:
            self._analyze(self.trace_files)
        assert self.analysis is not None
        from trainprof.report import write_reports

        self.report_dir.mkdir(parents=True, exist_ok=True)
        write_reports(
            self.analysis.to_dict(),
            self.report_dir,
            tensorboard_scalars=self.config.tensorboard_scalars,
            console=self.config.console,
        )


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    to_dict = getattr(value, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return dict(vars(value))


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
