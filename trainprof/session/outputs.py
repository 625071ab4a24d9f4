"""The session's outputs: each window's trace and sync sites as it ends, and at exit the analysis,
the reports and the line that says where the files went (or why nothing was recorded)."""

from __future__ import annotations

import contextlib
from typing import Any

from trainprof.files import SYNCSITES_SUFFIX, write_text_atomically
from trainprof.session.common import _OURS, _not_profiled, logger
from trainprof.user_code import warn


class Outputs:
    """The `Session`'s files and reports (`Session` holds the state)."""

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
