"""Gathering: each rank's summary handed to rank 0 through the process group's store
(`trainprof.gather`), and rank 0's cross-rank report."""

from __future__ import annotations

from typing import Any

from trainprof.session.common import _OURS, logger
from trainprof.user_code import warn


class Gathering:
    """The `Session`'s cross-rank report (`Session` holds the state)."""

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
