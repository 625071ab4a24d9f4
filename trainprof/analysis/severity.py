"""One rule for every finding's severity: the GPU time per step the finding could win back, over the
trace's judged step (`step_basis.StepBasis.judged_ms`: one step per trace, so one bar for "high" for
its idle and its busy findings alike).

A finding that costs the GPU nothing (a sync while the GPU is busy anyway, a one-off warm-up) ranks
below one that holds back every step, whatever the host time involved. Cut-offs: `thresholds.py`
(`severity_high_step_share`, `severity_medium_step_share`).

What each kind counts as `Finding.gpu_ms_per_step`:
- a GPU-idle cause (host_bound, input_bound, blocking_runtime_call, recurring_warmup,
  communication_wait, launch_overhead): the steady-state GPU-idle ms per step of that cause;
- a sync point: the GPU idle it causes, not the host time blocked in it: the idle while the host
  waits (the queue has drained), plus the refill after it, at most the lead the host had
  (`syncs.SyncPoint.gpu_cost_us`);
- a recompile: the GPU idle while compiling, per step;
- a straggler: the other ranks' exposed wait for it, per step (at most its excess work);
- a slow collective: the part of its rank's exposed communication that the link's bandwidth would
  win back; exposed communication: the communication no compute hides, per step, less what the
  straggler and slow-collective findings hold of it (`comm_findings.hand_over_exposure`);
  gradients synced on every micro-batch (no_sync_missing): the exposed part of the early
  micro-batches' syncs;
- the findings on GPU-busy waste (gemm_precision, unfused_attention, fusible_layers,
  memory_bound_kernels, gemm_shape, attention_choice, recomputation, copies_and_casts): the
  predicted saving of GPU time per step (`busy_findings`); torch.compile that compiled little
  (compile_coverage): what fusing its eager memory-bound kernels would win at least;
- profiler overhead and one-off costs: 0, since an un-profiled run in its steady state does not
  pay them (the finding still says how much the profiled steps lost);
- memory (memory_peak, memory_fragmentation): 0 (it buys a larger batch or model, not GPU time in
  this step: the finding gives bytes);
- out_of_memory: none (None): the run ended. It is `high` and ranked before every other finding
  (`FIRST_KINDS`), whatever GPU time the others could win back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainprof.analysis.kinds import SEVERITY_ORDER, FindingKind, Severity
from trainprof.analysis.thresholds import Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.records import Finding

IDLE_KINDS: frozenset[FindingKind] = frozenset({
    "host_bound", "launch_overhead", "input_bound", "blocking_runtime_call", "recurring_warmup",
    "communication_wait", "sync_point", "recompile", "graph_breaks", "fsdp_host",
})
"""Kinds whose `gpu_ms_per_step` is GPU-idle time (a GPU-idle cause, a sync point, a recompile, graph
breaks' eager gaps): what the profiler's host cost can inflate (`StepBasis.idle_gain`)."""

FIRST_KINDS: frozenset[FindingKind] = frozenset({"out_of_memory"})
"""Kinds ranked before every other finding: the loop did not survive them."""

ONE_OFF_KINDS: frozenset[FindingKind] = frozenset({"one_off"})
"""Kinds whose cost is paid once: ranked after every steady-state finding of the same severity."""


def severity_for(gpu_ms_per_step: float, judged_step_ms: float, thresholds: Thresholds) -> Severity:
    """`high`, `medium` or `low` for a finding that could win back `gpu_ms_per_step` of a step: the
    trace's `StepBasis.judged_ms` (a finding across ranks: the ranks' median step)."""
    share = gpu_ms_per_step / judged_step_ms if judged_step_ms > 0 else 0.0
    if share >= thresholds.severity_high_step_share:
        return "high"
    if share >= thresholds.severity_medium_step_share:
        return "medium"
    return "low"


def finding_order(finding: Finding) -> tuple[bool, int, bool, float, float]:
    """The findings' sort key: `FIRST_KINDS` first; then the most severe; within a severity,
    steady-state findings before one-off ones, then the most GPU time per step at stake, then the
    most cost."""
    return (
        finding.kind not in FIRST_KINDS,
        SEVERITY_ORDER[finding.severity],
        finding.kind in ONE_OFF_KINDS,
        -(finding.gpu_ms_per_step or 0.0),
        -finding.cost_ms,
    )
