"""What a session writes for TensorBoard beside its traces: per-step scalars, and the findings and the
report as text (TensorBoard's text plugin renders Markdown). trainprof's own tab, which shows the
run's report.html, is `trainprof.report.tensorboard_plugin`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.busy import StepBusy
    from trainprof.analysis.result import Analysis, Step

# TensorBoard tag -> its value for a step, from the `Step` and its GPU-busy row (`busy.StepBusy`, None
# without GPU work); a None value is not written. Values are the analysis's, not recomputed.
SCALARS: dict[str, Callable[[Step, StepBusy | None], float | None]] = {
    "trainprof/step_time_ms": lambda step, _: step.times.duration_ms,
    # the step as the GPU ran it: longer than the host's window where the host ran ahead
    "trainprof/gpu_step_ms": lambda _, busy: busy.step_ms if busy is not None else None,
    "trainprof/gpu_busy_pct": lambda step, _: step.times.gpu_busy_pct,
    "trainprof/syncs_per_step": lambda step, _: step.syncs.count,
    "trainprof/kernels_per_step": lambda step, _: step.times.kernel_count,
    "trainprof/mfu_pct": lambda _, busy: busy.mfu_pct if busy is not None else None,  # datasheet peak
    "trainprof/mfu_achievable_pct": lambda _, busy: busy.mfu_achievable_pct if busy is not None else None,
}
GPU_TAGS = frozenset({"trainprof/gpu_busy_pct", "trainprof/syncs_per_step", "trainprof/kernels_per_step"})
"""Tags measured only on a GPU: not written for a step of a trace without GPU work (a CPU run), where
they would chart flat zero lines of what was never measured."""
UNPROFILED_TAG = "trainprof/unprofiled_step_ms"
"""The session's un-profiled step (`Summary.unprofiled_step_ms`), one value at the last step."""
IDLE_TAG = "trainprof/gpu_idle_ms/"
"""Prefix of the per-step GPU-idle scalars, one per cause (`launch`, `sync`, ...) and `one_off`."""
FINDINGS_TAG = "trainprof/findings"
REPORT_TAG = "trainprof/report"


def idle_scalars(step: Step) -> dict[str, float]:
    """A step's GPU-idle ms by cause, by TensorBoard tag (empty when the trace has no GPU work)."""
    if step.idle is None:
        return {}
    scalars = {IDLE_TAG + cause.key: ms for cause, ms in step.idle.costs.items()}
    scalars[IDLE_TAG + "one_off"] = step.idle.one_off_ms
    return scalars


def _busy_rows(analysis: Analysis) -> list[StepBusy | None]:
    """Per step of `analysis.steps` (one trace's steps after another's), its `busy.StepBusy` or None."""
    rows: list[StepBusy | None] = []
    for trace in analysis.traces:
        by_number = {row.number: row for row in trace.busy.steps} if trace.busy is not None else {}
        rows += [by_number.get(number) for number in trace.step_numbers]
    return rows


def findings_markdown(analysis: Analysis) -> str:
    """The findings as a Markdown list, most severe and costly first, each with its fix."""
    from trainprof.report.markdown import escape

    findings = _format.top_findings(analysis, _format.MARKDOWN_FINDINGS)
    if not findings:
        return f"**{escape(analysis.summary.verdict)}**: no findings."
    lines = [f"**{escape(analysis.summary.verdict)}**", ""]
    labelled = _format.source_labels(findings)
    for finding in findings:
        source = f" ({_format.source_of(finding, findings)})" if labelled else ""
        lines.append(f"- **{escape(finding.severity)}**{escape(source)}: {escape(finding.title)}")
        if finding.fix:
            lines.append(f"  - fix: {escape(finding.fix)}")
    return "\n".join(lines)


def write_scalars(analysis: Analysis, run_dir: str | Path, step_offset: int = 0) -> bool:
    """Write one scalar per step and tag (those of `SCALARS` that were measured, and GPU idle by
    cause), at the step's
    number plus `step_offset` (a framework's own x-axis), and at the last step the un-profiled step
    (where the session timed it) and the findings and report.md as text; False when tensorboard is
    not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return False
    from trainprof.report.markdown import render_markdown

    # A random suffix: the event file's name (time, host, pid) cannot be guessed and a link planted
    # in the run folder at that name (which the writer would follow) never met.
    writer = SummaryWriter(str(run_dir), filename_suffix=f".{os.urandom(8).hex()}")
    try:
        for step, busy in zip(analysis.steps, _busy_rows(analysis), strict=True):
            at = step.times.number + step_offset
            on_gpu = step.idle is not None  # None: the trace has no GPU work
            for tag, value_of in SCALARS.items():
                value = value_of(step, busy) if on_gpu or tag not in GPU_TAGS else None
                if value is not None:
                    writer.add_scalar(tag, value, global_step=at)
            for tag, ms in idle_scalars(step).items():
                writer.add_scalar(tag, ms, global_step=at)
        last = max((step.times.number for step in analysis.steps), default=0) + step_offset
        if analysis.summary.unprofiled_step_ms is not None:
            writer.add_scalar(UNPROFILED_TAG, analysis.summary.unprofiled_step_ms, global_step=last)
        writer.add_text(FINDINGS_TAG, findings_markdown(analysis), global_step=last)
        writer.add_text(REPORT_TAG, render_markdown(analysis), global_step=last)
    finally:
        writer.close()
    return True

