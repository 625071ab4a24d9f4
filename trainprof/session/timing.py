"""Un-profiled timing: the steps the profiler did not touch, timed between CUDA events recorded
where each step begins (else on the host), and the first forward of each (`capture.arrival`)."""

from __future__ import annotations

import itertools

from trainprof.session.common import UNPROFILED_STEPS_KEPT, logger


class UnprofiledTiming:
    """The `Session`'s timing of its un-profiled steps (`Session` holds the state)."""

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
