"""The analysis' vocabulary as types: finding kinds (with the one registry of their meanings),
severities, verdicts and GPU-idle cause keys.

Each is a `Literal` of the strings the JSON form carries, so `summary.json` and `analyze --json` keep
their strings, and a kind, verdict or severity the code spells wrong (or renames) fails the type
check (`make typecheck`) instead of a user's dashboard. `KINDS` is the registry a finding's kind must
be in (`Finding` refuses any other); docs/findings.md is generated from it
(`python -m trainprof.analysis.kinds > docs/findings.md`, held current by tests/test_vocabulary.py).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

FindingKind = Literal[
    "sync_point",
    "launch_overhead",
    "host_bound",
    "input_bound",
    "blocking_runtime_call",
    "recurring_warmup",
    "communication_wait",
    "profiler_overhead",
    "one_off",
    "profiler_slowdown",
    "recompile",
    "graph_breaks",
    "compile_coverage",
    "memory_peak",
    "memory_fragmentation",
    "out_of_memory",
    "straggler",
    "profiler_skew",
    "exposed_communication",
    "no_sync_missing",
    "slow_collective",
    "fsdp_host",
    "gemm_precision",
    "unfused_attention",
    "fusible_layers",
    "memory_bound_kernels",
    "gemm_shape",
    "attention_choice",
    "recomputation",
    "copies_and_casts",
    "cpu_only",
    "top_kernels",
    "module_costs",
]
"""A finding's `kind`: one of `KINDS`' keys."""

Severity = Literal["high", "medium", "low", "info"]
"""A finding's `severity`, most urgent first (`SEVERITY_ORDER`)."""

SEVERITY_ORDER: dict[Severity, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}

VerdictLabel = Literal[
    "gpu-bound",
    "communication-bound",
    "launch-bound",
    "sync-bound",
    "blocking-call-bound",
    "warm-up-bound",
    "input-bound",
    "host-bound",
    "rank-wait-bound",
    "mixed",
    "unknown",
    "cpu-only",
]
"""What bounds one trace's steps (`verdict.Verdict.label`). The summary's verdict is one of these,
`straggler: rank R`, or (a session that recorded nothing) `not-profiled`."""

CauseKey = Literal["launch", "sync", "blocking", "warmup", "input", "host", "comm", "unknown", "profiler"]
"""A GPU-idle cause's name in JSON keys and reports (`causes.Cause.key`, in `Cause` order)."""

Group = Literal["idle", "compile", "memory", "ranks", "communication", "busy", "table"]


class KindInfo(NamedTuple):
    """What a finding kind means, the question it answers (`group`) and the module that makes it."""

    group: Group
    module: str
    meaning: str


GROUPS: dict[Group, str] = {
    "idle": "Why the GPU waits (GPU-idle time the fix wins back)",
    "compile": "torch.compile",
    "memory": "Memory (bytes, not GPU time)",
    "ranks": "Across ranks",
    "communication": "Communication",
    "busy": "Where the busy time goes (GPU time the fix saves)",
    "table": "Tables (facts, no fix)",
}
"""The groups of `KINDS`, in the order docs/findings.md lists them."""

KINDS: dict[FindingKind, KindInfo] = {
    "sync_point": KindInfo(
        "idle", "syncs", "a CPU-GPU synchronization: the host waits for the GPU, whose queue then drains"
    ),
    "launch_overhead": KindInfo(
        "idle", "launch", "many tiny kernels: the GPU waits while the host launches them"
    ),
    "host_bound": KindInfo(
        "idle", "idle_findings", "GPU idle while the host runs other code (Python, logging), by function"
    ),
    "input_bound": KindInfo(
        "idle", "idle_findings", "GPU idle while the host waits for the next batch (DataLoader, data prep)"
    ),
    "blocking_runtime_call": KindInfo(
        "idle", "idle_findings",
        "GPU idle inside blocking runtime calls (allocation, free, stream creation, synchronous copies); "
        "names `torch.cuda.empty_cache()` at your line when it is behind the allocator's calls",
    ),
    "recurring_warmup": KindInfo(
        "idle", "idle_findings", "GPU idle in library warm-up that recurs in several steps"
    ),
    "communication_wait": KindInfo(
        "idle", "idle_findings", "GPU idle inside host-side collectives, waiting for other ranks"
    ),
    "profiler_overhead": KindInfo(
        "idle", "idle_findings", "GPU idle in the profiler's own code, which an un-profiled run does not pay"
    ),
    "one_off": KindInfo("idle", "idle_findings", "a one-time cost inside the window (first use, warm-up)"),
    "profiler_slowdown": KindInfo(
        "idle", "profiler_cost", "the recorded steps much longer than the session's un-profiled ones"
    ),
    "fsdp_host": KindInfo(
        "idle", "fsdp_host",
        "FSDP2's hooks holding the host while the GPU idles, with what `reshard_after_forward=False` "
        "would win and cost",
    ),
    "recompile": KindInfo("compile", "compile", "torch.compile compiling in every step"),
    "graph_breaks": KindInfo(
        "compile", "compile", "torch.compile's graph breaks and the eager gaps between its graphs"
    ),
    "compile_coverage": KindInfo(
        "compile", "compile", "torch.compile that compiled nothing, or little, of the model's GPU work"
    ),
    "memory_peak": KindInfo(
        "memory", "memory", "a tensor family dominating the memory peak, its fix and the memory it saves"
    ),
    "memory_fragmentation": KindInfo(
        "memory", "fragmentation", "the allocator's cache, not the tensors, sets the peak"
    ),
    "out_of_memory": KindInfo(
        "memory", "oom",
        "the loop ran out of GPU memory: what held it, how the failing step differed, each fix's saving; "
        "always first",
    ),
    "straggler": KindInfo("ranks", "stragglers", "a rank the others wait for, and what it was doing"),
    "profiler_skew": KindInfo(
        "ranks", "stragglers",
        "ranks with the same work and no cause of their own, one of which fell behind only while "
        "recorded: no straggler",
    ),
    "exposed_communication": KindInfo(
        "communication", "comm_findings", "communication no compute hides, with the framework's knob"
    ),
    "no_sync_missing": KindInfo(
        "communication", "comm_findings", "gradients all-reduced on every micro-batch of an accumulation"
    ),
    "slow_collective": KindInfo(
        "communication", "comm_findings", "a collective far below its link's bandwidth"
    ),
    "gemm_precision": KindInfo("busy", "busy_findings", "GEMMs in fp32 without TF32"),
    "unfused_attention": KindInfo(
        "busy", "busy_findings", "attention as matmul + softmax over [B, H, T, T], or SDPA's math fallback"
    ),
    "fusible_layers": KindInfo(
        "busy", "busy_findings", "norms, gated MLPs, RoPE that `fused_layers.swap` replaces"
    ),
    "memory_bound_kernels": KindInfo(
        "busy", "busy_findings", "norms, casts, elementwise kernels far below the copy bandwidth"
    ),
    "gemm_shape": KindInfo("busy", "busy_findings", "unaligned or skinny GEMMs"),
    "attention_choice": KindInfo(
        "busy", "busy_findings",
        "an SDPA call site off its fastest path: a causal-shaped mask instead of `is_causal=True`, a "
        "slower backend than one the trace measured",
    ),
    "recomputation": KindInfo(
        "busy", "busy_findings",
        "the forward recomputed in backward by activation checkpointing, and how many layers the memory "
        "headroom lets go",
    ),
    "copies_and_casts": KindInfo(
        "busy", "busy_findings", "copies and casts a fix removes, by what makes them"
    ),
    "cpu_only": KindInfo("table", "host_ops", "no GPU work recorded: the host ops that take the step"),
    "top_kernels": KindInfo("table", "kernels", "the kernels and ops with the most GPU time"),
    "module_costs": KindInfo("table", "modules", "GPU time and kernels by `nn.Module` and function"),
}
"""Every finding kind: its group, the `trainprof.analysis` module that makes it, and its meaning."""


def is_kind(name: str) -> bool:
    """Whether `name` is a registered finding kind."""
    return name in KINDS


def findings_table() -> str:
    """docs/findings.md: every finding kind, by group, from `KINDS`."""
    lines = [
        "# Finding kinds",
        "",
        "Generated from `trainprof/analysis/kinds.py`",
        "(`python -m trainprof.analysis.kinds > docs/findings.md`); a test holds it to the registry.",
        "A finding's `details` by kind: `trainprof/analysis/result.py`.",
    ]
    for group, heading in GROUPS.items():
        lines += ["", f"## {heading}", "", "| kind | made by | meaning |", "|---|---|---|"]
        for kind, info in KINDS.items():
            if info.group == group:
                lines.append(f"| `{kind}` | `trainprof.analysis.{info.module}` | {info.meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(findings_table(), end="")
