"""One rule for every finding's severity: the GPU time per step the finding could win back.

A finding that costs the GPU nothing (a sync while the GPU is busy anyway, a one-off warm-up) ranks
below one that holds back every step, whatever the host time involved. Cut-offs: `thresholds.py`
(`severity_high_step_share`, `severity_medium_step_share`).
"""

from __future__ import annotations

from trainprof.analysis.thresholds import Thresholds


def severity_for(gpu_ms_per_step: float, step_ms: float, thresholds: Thresholds) -> str:
    """`high`, `medium` or `low` for a finding that could win back `gpu_ms_per_step` of a `step_ms` step."""
    share = gpu_ms_per_step / step_ms if step_ms > 0 else 0.0
    if share >= thresholds.severity_high_step_share:
        return "high"
    if share >= thresholds.severity_medium_step_share:
        return "medium"
    return "low"
