"""What a finding's figures are, with their units and scope: what `Finding.count` counts, what
`Finding.cost_ms` measures, and whether `Finding.gpu_ms_per_step` is a time at stake (`FIGURES`).

Every report says them in these words, and the JSON beside the numbers (`count_of`, `cost_of`):

- `gpu_ms_per_step`: "ms of GPU time per step" the fix could win back, with `gpu_step_pct` "% of the
  step" (of its trace's judged step: `step_basis.StepBasis.judged_ms`); left out where the finding
  is about bytes (memory findings, whose titles give them) or its cost is paid once or by the
  profiler alone (0 per step by design);

- `per_step`: `count` over the recorded steps, said with what it counts (`kernels per step`); left
  out where `count` is the steps themselves or one event;
- `cost_ms`: said with what it measures and over what (`ms of CPU time blocked in the syncs, over
  the recorded steps`); left out where it repeats the gain (a busy finding's saving times the
  steps) or is no time at all.
"""

from __future__ import annotations

from typing import NamedTuple


class Figures(NamedTuple):
    """One kind's figures in words (module docstring)."""

    count_of: str | None
    """What `count` counts (and `per_step` per step), plural; None: not worth a reader's time."""
    cost_of: str | None
    """What `cost_ms` is, with its scope; None: it is not shown (no time, or the gain again)."""
    gain: bool = True
    """Whether `gpu_ms_per_step` is GPU time at stake worth showing (False: a finding about memory,
    or one paid once or by the profiler alone, whose time per step is 0 by design)."""
    count_one: str | None = None
    """`count_of` for one (`1 sync per step`)."""


_IDLE = "ms of GPU idle time, over the recorded steps"
# A busy finding's cost_ms is its saving per step times the steps: the gain again, not shown.
_SAVING = Figures("kernels", None, count_one="kernel")

FIGURES: dict[str, Figures] = {
    "sync_point": Figures(
        "syncs", "ms of CPU time blocked in the syncs, over the recorded steps", count_one="sync"),
    "host_bound": Figures(None, _IDLE),
    "input_bound": Figures(None, _IDLE),
    "blocking_runtime_call": Figures(None, _IDLE),
    "recurring_warmup": Figures(None, _IDLE),
    "communication_wait": Figures(None, _IDLE),
    "profiler_overhead": Figures(None, _IDLE, gain=False),
    "launch_overhead": Figures(
        "kernels shorter than their launch", "ms of GPU idle time while launching, over the recorded steps",
        count_one="kernel shorter than its launch"),
    "recompile": Figures(None, "ms of host time compiling, over the recorded steps"),
    "graph_breaks": Figures(
        "compiled regions", "ms of GPU idle time in the eager code between them, over the recorded steps",
        count_one="compiled region"),
    "compile_coverage": Figures(
        "calls of the compiled model", "ms of GPU time in kernels that ran eagerly, over the recorded steps",
        count_one="call of the compiled model"),
    "fsdp_host": Figures(None, "ms of GPU idle time in FSDP2's hooks, over the recorded steps"),
    "exposed_communication": Figures(None, "ms of exposed communication, over the recorded steps"),
    "no_sync_missing": Figures(
        "early gradient collectives",
        "ms of collectives before the last micro-batch, over the recorded steps",
        count_one="early gradient collective"),
    "slow_collective": Figures("calls", "ms of the collective's time per step", count_one="call"),
    "straggler": Figures(None, "ms per step of its work beyond the other ranks'"),
    "profiler_skew": Figures(None, None),
    "profiler_slowdown": Figures(None, "ms the profiler added, over the recorded steps", gain=False),
    "one_off": Figures(None, "ms of GPU idle time, once", gain=False),
    "cpu_only": Figures(None, "ms of host time in the steps, over the recorded steps"),
    "top_kernels": Figures(
        "kernels", "ms of GPU time in kernels, over the recorded steps", count_one="kernel"),
    "module_costs": Figures(
        "kernels", "ms of GPU time in the modules' kernels, over the recorded steps", count_one="kernel"),
    "memory_peak": Figures(None, None, gain=False),
    "memory_fragmentation": Figures(None, None, gain=False),
    "out_of_memory": Figures(None, None, gain=False),
    "gemm_precision": _SAVING,
    "unfused_attention": _SAVING,
    "fusible_layers": _SAVING,
    "memory_bound_kernels": _SAVING,
    "gemm_shape": _SAVING,
    "attention_choice": _SAVING,
    "recomputation": _SAVING,
    "copies_and_casts": _SAVING,
}
"""Each finding kind's figures in words. A kind not listed shows none of them (`UNKNOWN`)."""

UNKNOWN = Figures(None, None)
"""The figures of a kind `FIGURES` does not list: none shown (a test holds every kind to a row)."""


def figures_of(kind: str) -> Figures:
    """`FIGURES[kind]`, or `UNKNOWN`."""
    return FIGURES.get(kind, UNKNOWN)
