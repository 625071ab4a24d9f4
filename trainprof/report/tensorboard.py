"""Per-step scalars for TensorBoard, written beside the traces of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# TensorBoard tag -> step field of the analysis (values are the analysis's, not recomputed).
SCALARS = {
    "trainprof/step_time_ms": "duration_ms",
    "trainprof/gpu_busy_pct": "gpu_busy_pct",
    "trainprof/syncs_per_step": "sync_count",
    "trainprof/kernels_per_step": "kernel_count",
}


def write_scalars(analysis: dict[str, Any], run_dir: str | Path) -> bool:
    """Write one scalar per step and tag; False when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return False
    writer = SummaryWriter(str(run_dir))
    try:
        for step in analysis.get("steps") or []:
            for tag, key in SCALARS.items():
                value = step.get(key)
                if value is not None and step.get("step") is not None:
                    writer.add_scalar(tag, value, global_step=int(step["step"]))
    finally:
        writer.close()
    return True
