"""Per-step scalars for TensorBoard, written beside the traces of the run."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis

# TensorBoard tag -> the step's field (values are the analysis's, not recomputed).
SCALARS = {
    "trainprof/step_time_ms": attrgetter("times.duration_ms"),
    "trainprof/gpu_busy_pct": attrgetter("times.gpu_busy_pct"),
    "trainprof/syncs_per_step": attrgetter("syncs.count"),
    "trainprof/kernels_per_step": attrgetter("times.kernel_count"),
}


def write_scalars(analysis: Analysis, run_dir: str | Path, step_offset: int = 0) -> bool:
    """Write one scalar per step and tag, at the step's number plus `step_offset` (a framework's own
    x-axis); False when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return False
    writer = SummaryWriter(str(run_dir))
    try:
        for step in analysis.steps:
            for tag, field in SCALARS.items():
                writer.add_scalar(tag, field(step), global_step=step.times.number + step_offset)
    finally:
        writer.close()
    return True
