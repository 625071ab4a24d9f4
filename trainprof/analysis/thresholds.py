"""Every number that decides a verdict or a finding, in one table, each with its reason; and the
sizes of the ranked lists the analysis keeps.

The analysis reads them through `Thresholds`; a caller overrides any of them by name:
`analyze(path, thresholds={"gpu_bound_busy_pct": 90})` or
`trainprof analyze PATH --threshold gpu_bound_busy_pct=90`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import msgspec


class Threshold(msgspec.Struct, frozen=True):
    """One named cut-off: its default value and why it has that value."""

    name: str
    value: float
    reason: str


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "gpu_bound_busy_pct",
        80.0,
        "At 80% GPU busy (time-weighted over the steps) the idle time is a minor share of the step: "
        "faster kernels pay more than removing gaps, so the step is GPU-bound.",
    ),
    Threshold(
        "comm_bound_share",
        0.3,
        "When collective kernels are at least 30% of the GPU's busy time in a GPU-bound step, "
        "communication (or waiting for another rank inside it) is what the step is bound by.",
    ),
    Threshold(
        "dominant_cause_margin",
        1.5,
        "The steady-state GPU-idle cause with the most time names the verdict only when it has at "
        "least 1.5x the time of the runner-up; closer than that, the verdict is `mixed` and names both.",
    ),
    Threshold(
        "long_launch_us",
        1000.0,
        "A kernel launch costs the host 2-50 µs. One over 1 ms while the GPU is idle is not launch "
        "overhead: it is the kernel's first use loading its module (lazy loading) or the library's "
        "initialisation, counted as library warm-up.",
    ),
    Threshold(
        "warmup_call_min_ms",
        10.0,
        "A cuDNN/cuBLAS/MIOpen op call on the host counts as library warm-up (algorithm search, "
        "handle creation) only if it lasts at least 10 ms: steady-state calls take µs to a few ms.",
    ),
    Threshold(
        "warmup_call_ratio",
        10.0,
        "...and it is either the first call of its op on its thread or at least 10x the median call "
        "of the same op: a later call that slow is searching again (a new shape under "
        "cudnn.benchmark).",
    ),
    Threshold(
        "finding_min_idle_share",
        0.1,
        "A GPU-idle cause gets its own finding when it costs at least 10% of the profiled step time "
        "(or is the verdict): below that, fixing it cannot speed the step up by more than ~10%.",
    ),
    Threshold(
        "severity_high_step_share",
        0.2,
        "A finding is `high` when the GPU time per step it could win back (`Finding.gpu_ms_per_step`) is "
        "at least 20% of the step: fixing it alone makes the step at least 1.25x faster...",
    ),
    Threshold(
        "severity_medium_step_share",
        0.05,
        "...`medium` from 5% (a gain a benchmark can tell from run-to-run noise of a few percent), "
        "`low` below: worth knowing, not worth ranking above the ones that move the step.",
    ),
    Threshold(
        "one_off_min_ms",
        1.0,
        "One-off costs (context creation, library warm-up) under 1 ms in total are not worth a finding.",
    ),
    Threshold(
        "one_off_named_share",
        0.05,
        "A verdict leaves one-off costs out (an un-profiled run pays them once, not every step); from "
        "5% of the recorded steps' time (as `severity_medium_step_share`: what a reader would see in "
        "the step time) the headline says that it does, and how much they took.",
    ),

    Threshold(
        "profiler_overhead_min_share",
        0.05,
        "GPU idle while the profiler's own code runs (trainprof's hooks, torch.profiler) never names the "
        "verdict; it gets a `low` finding from 5% of the profiled step time: from there the recorded "
        "steps are noticeably slower than un-profiled ones. Below, it shows only as `idle_profiler_ms`.",
    ),
    Threshold(
        "profiler_slowdown_min_share",
        0.15,
        "When the recorded steps are at least 15% longer than the session's un-profiled steps of the "
        "same loop, the profiler's host cost has changed the step: the verdict is judged again on the "
        "un-profiled step and the GPU-idle findings together claim no more than it leaves idle. "
        "Below 15%, step-to-step spread (a few %) and the profiler's small cost blur together.",
    ),
    Threshold(
        "profiler_first_launch_ratio",
        3.0,
        "The trace's first kernel launch counts as profiler overhead (its start-up: CUPTI instruments "
        "the first launch of a window) when it takes at least 3x the median launch; every recorded "
        "H200 window here shows 4-20x.",
    ),
    Threshold(
        "tiny_kernel_pct",
        50.0,
        "When at least half the kernels run shorter than their own launch call, the GPU finishes each "
        "before the host issues the next: a `many tiny kernels` finding even if launches are not the "
        "dominant idle cause...",
    ),
    Threshold(
        "tiny_kernel_busy_pct",
        80.0,
        "...provided the GPU is less than 80% busy (else the tiny kernels are hidden behind long ones).",
    ),
    Threshold(
        "memory_family_min_share",
        0.3,
        "A tensor family (the logits and the loss, attention scores; else the activations) gets a "
        "memory finding when it holds at least 30% of the peak: its fix then lowers the peak by about "
        "a third or more, enough for a larger batch.",
    ),
    Threshold(
        "memory_pressure_share",
        0.8,
        "Activations alone get a memory finding (recompute them: activation checkpointing) only when "
        "the peak holds at least 80% of the device's memory: their fix costs about a third more "
        "compute, worth it only when memory limits the batch or the model.",
    ),
    Threshold(
        "memory_min_saving_device_share",
        0.02,
        "...and only when its fix would save at least 2% of the device's memory (2.8 GB on an H200): "
        "less buys no noticeably larger batch.",
    ),
    Threshold(
        "headroom_reserve_share",
        0.05,
        "The memory headroom counts on 95% of the device's memory: the rest goes to the CUDA context "
        "(0.5-1 GiB), cuBLAS and NCCL workspaces, and the caching allocator's rounding and "
        "fragmentation at the limit (it frees its cache and retries before it fails, so little is "
        "lost there). benchmarks/memory_checks.py runs the largest batch it predicts.",
    ),
    Threshold(
        "fragmentation_min_share",
        0.15,
        "Fragmentation sets the memory peak when at least 15% of the allocator's largest reserved "
        "total held no tensor at the largest allocated one (cached blocks too small or split for the "
        "requests): below, the cache is the usual rounding and reuse; with expandable segments the "
        "reserve stays within a few percent of the tensors. It needs the reserve at "
        "`memory_pressure_share` of the device, or the allocator retrying its cudaMalloc calls: a "
        "cache on a device with room to spare limits nothing.",
    ),
    Threshold(
        "exposed_comm_min_share",
        0.05,
        "Communication that no compute hides gets a finding from 5% of the step time (or whenever the "
        "trace is communication-bound): from there hiding it is a gain a benchmark can tell from noise.",
    ),
    Threshold(
        "exposed_comm_straggler_share",
        0.5,
        "When at least half of a rank's exposed communication is its wait for the straggler, the "
        "exposed-communication finding points at the straggler instead of the overlap knobs: a "
        "bucket size or prefetch setting cannot hide a wait for a late rank.",
    ),
    Threshold(
        "slow_collective_min_bytes",
        1048576.0,
        "A collective is held to its link's bandwidth only from 1 MiB: below, its time is latency "
        "(NCCL's LL protocols reach a fraction of the link on small messages by design)...",
    ),
    Threshold(
        "slow_collective_link_share",
        0.25,
        "...and is slow below 25% of the link's bandwidth per direction: tuned NCCL reaches 70-90% of "
        "NVLink on large all-reduces (nccl-tests), so a quarter means a wrong transport or topology.",
    ),
    Threshold(
        "busy_finding_min_step_share",
        0.03,
        "A finding on GPU-busy waste (fp32 GEMMs, unfused attention, unfused norms and activations, "
        "slow GEMM shapes) is made when what its fix wins back is at least 3% of the step: below, "
        "the gain is within a benchmark's run-to-run noise.",
    ),
    Threshold(
        "mfu_min_flops_known_share",
        0.5,
        "The MFU counts the FLOPs it knows (GEMMs and attention from recorded shapes, convolutions "
        "where `with_flops` recorded them); when kernels of unknown FLOPs (convolutions without "
        "them, kernels of unknown class) hold more than half of the compute time, the MFU would be "
        "a small fraction of the real one (0.0% on a ResNet): it is unknown instead.",
    ),
    Threshold(
        "host_work_min_share",
        0.5,
        "Host-bound time is named as a kind of host work (an optimizer on the CPU, offload: "
        "`host_work.HOST_WORK`) only when the functions of that kind hold at least half of it: else "
        "the generic fix fits the rest better.",
    ),
    Threshold(
        "host_optimizer_max_launch_share",
        0.05,
        "An optimizer on GPU tensors launches a kernel from most of its math ops (mul_, lerp_, addcdiv_); "
        "one on CPU tensors launches none, only its copies to and from the device: at most 5% of its "
        "step's ops launching GPU work means it steps on the host.",
    ),
    Threshold(
        "compile_min_compiled_share",
        0.5,
        "torch.compile that runs less than half of the model's forward and backward GPU time in "
        "compiled regions leaves most of its work eager: a `compile_coverage` finding says where.",
    ),
    Threshold(
        "recompute_memory_margin_share",
        0.1,
        "Checkpointed layers are advised off only while the predicted peak stays under 90% of the "
        "device's memory: the caching allocator's fragmentation and a longer batch take the rest.",
    ),
    Threshold(
        "throughput_min_known_share",
        0.5,
        "A kernel class's (or module's) achieved TFLOP/s or TB/s is its counted work over the time of "
        "the kernels that carry it; where those hold less than half of its time, the rate describes "
        "a sliver of it (flash attention at 4,570 TFLOP/s on a TraceLens trace whose FLOPs were known "
        "for 2.7% of the attention time): the rate and its share of the peak are unknown instead.",
    ),
    Threshold(
        "gemm_shape_max_rate_share",
        0.5,
        "A GEMM with an unaligned or skinny shape is slow when it runs at under half the FLOP rate of "
        "the trace's well-shaped GEMMs of its dtype (the dtype's peak without them): cuBLAS's "
        "fallback kernels for unaligned dims run at 10-15% of the H200's bf16 peak.",
    ),
    Threshold(
        "memory_bound_max_bandwidth_share",
        0.5,
        "Memory-bound kernels (norms, elementwise, copies) of a module are slow when they move their "
        "bytes at under half the device's copy bandwidth (ATen's elementwise kernels reach 90-100%).",
    ),
    Threshold(
        "straggler_min_excess_ms",
        5.0,
        "A rank is the straggler when its non-communication time per step exceeds the other ranks' "
        "median by at least 5 ms...",
    ),
    Threshold(
        "straggler_min_excess_fraction",
        0.15,
        "...and by at least 15% of the median step: smaller differences are noise between ranks.",
    ),
    Threshold(
        "fsdp_host_min_share",
        0.05,
        "FSDP2's hooks get a finding when the GPU idles inside them 5% of the step or more: from there "
        "removing part of them is a gain a benchmark can tell from noise (the GPU idled 22-50 ms "
        "inside them in 219-262 ms steps of a Llama 1.1B on one H200, 2026-11-28).",
    ),
    Threshold(
        "fsdp_reshard_min_share",
        0.01,
        "`reshard_after_forward=False` is named as the FSDP2 fix when the backward's all-gathers (their "
        "hook's GPU-idle time and copy kernels) are 1% of the step or more; below, the backward gathers "
        "next to nothing (1.2 ms of a 244 ms step with it set, one H200, 2026-11-28).",
    ),
    Threshold(
        "straggler_own_cause_ratio",
        2.0,
        "A late rank's host time in one (cause, frame) is a cause of its own when it is at least twice "
        "the other ranks' median there: the profiler's cost per op makes the same frames 1.2-1.6x "
        "longer on the rank it slows most (2 and 4 gloo ranks on the CPU, 2026-11-28), while a sleep "
        "or a one-rank input or logging cost has no counterpart on the others.",
    ),
    Threshold(
        "straggler_min_work_share",
        0.05,
        "On a CPU-only trace a late rank has more work only when its recorded FLOPs are at least 5% "
        "more than the others': its ops' times also grow when ranks contend for the host's cores.",
    ),
)

DEFAULTS: Mapping[str, float] = MappingProxyType({t.name: t.value for t in THRESHOLDS})

# How much of each ranked list the result keeps: they bound the size of summary.json and of the
# findings' evidence, and decide no verdict and no finding's severity.
TOP_ROWS = 10
"""Rows of the top-kernels, top-ops and top-host-ops tables (the reports show fewer)."""
HOLDERS_SCANNED = 40
"""Holders of GPU-idle time looked at, largest first, for the steady ones kept and the one-off ones."""
HOLDERS_KEPT = 12
"""Steady-state holders of GPU-idle time kept per trace (`gpu_idle_holders`)."""
FINDING_HOLDERS = 6
"""Holders listed in an idle-cause finding's evidence."""
HOST_FUNCTIONS_KEPT = 8
"""Python functions holding `host` idle time kept per trace (`gpu_idle_host_functions`)."""
LOOP_HOLDERS_KEPT = 24
"""Holders of the loop thread's time kept per trace for comparing ranks (`rank_work.RankWork.host`):
a rank's one-rank cause is among its largest; the rest of a few kB summary goes to the ops."""
RANK_OPS_KEPT = 12
"""Matrix-product and attention op shapes kept per trace (`rank_work.RankWork.ops`): what names an
uneven batch or sequence length across ranks."""
HOST_FUNCTIONS_IN_TITLE = 3
"""Python functions a host-bound finding's title names (its evidence lists them all)."""
HOST_FUNCTION_STACK_FRAMES = 6
"""Named frames of a host function's stack, innermost first: enough to reach the user's call."""
LAUNCH_REGIONS_KEPT = 5
"""Owners of tiny kernels kept in the launch totals and the launch finding's evidence."""
ONE_OFF_FINDINGS_KEPT = 4
"""One-off costs that get a finding each, largest first: more repeat the same advice (profile later)."""
MODULE_TABLE_ROWS = 30
"""Rows of the module-costs finding's tables: a GPT-2 has ~15 module class paths, a ResNet ~10."""
TOP_OPS_PER_OWNER = 6
"""Ops listed per owner (module or function) of tiny kernels."""
GRAPH_BREAK_SITES_KEPT = 8
"""Graph-break sites (Dynamo's resume functions) kept in the compile figures."""
LARGEST_ALLOCATIONS_KEPT = 8
"""Allocations alive at the memory peak kept, largest first (report.html lists them)."""
OPTIMIZER_SHARDS_QUOTED = 8
"""Ranks the out-of-memory finding quotes sharding the optimizer state over (ZeRO-1, FSDP) when the trace
does not say how many there are: a node of 8 GPUs; sharded over N ranks, (N - 1) / N of it is freed."""
ACTIVATION_MODULES_KEPT = 8
"""Module class paths kept in the activations-by-module breakdown of the memory peak, largest first (a
Llama has ~6 module classes holding activations: its attention, MLP, norms, the head)."""
MEMORY_SERIES_POINTS = 400
"""Points of the memory-over-time series, which report.html draws ~1,000 pixels wide: of each of 200
slices of the events its lowest and highest total, so the peak and the valleys survive."""
COMPILE_IDS_IN_TITLE = 3
"""Compile ids a recompile finding's title names (its evidence lists them all)."""
COLLECTIVES_KEPT = 4096
"""Collectives kept per trace for the cross-rank match (a DeepSeek-V3 expert-parallel step has
~500: dispatch and combine per MoE layer, forward and backward)."""
CROSS_RANK_COLLECTIVES_KEPT = 512
"""Matched collectives listed in the cross-rank report (the longest waits first)."""

# How much the report views keep (`trainprof.analysis.views`, drawn by report.html): they bound the
# file's size, and decide nothing.
TIMELINE_EVENTS_PER_LANE = 3000
"""Blocks per timeline lane (a stream, or the GPU-idle row): past this, the events closest together
are drawn as one block (`N kernels`), so the largest gaps stay visible at every zoom."""
OP_TABLE_ROWS = 150
"""Rows of the op table (ops by GPU time, then host time): a GPT-2 step runs ~120 distinct ops."""
KERNEL_TABLE_ROWS = 150
"""Rows of the kernel table (kernels by GPU time)."""
FLAME_GRAPH_NODES = 2500
"""Nodes of the host-stack flame graph, the largest by host or GPU time (a child is never larger
than its parent, so the kept nodes form a tree)."""


class Thresholds:
    """The thresholds in force for one analysis: the defaults, with the caller's overrides.

    Read a value as an attribute: `thresholds.gpu_bound_busy_pct`.
    """

    def __init__(self, overrides: Mapping[str, float] | None = None):
        values = dict(DEFAULTS)
        for name, value in (overrides or {}).items():
            if name not in DEFAULTS:
                raise ValueError(f"unknown threshold {name!r}; known: {', '.join(sorted(DEFAULTS))}")
            try:
                values[name] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"threshold {name} must be a number, got {value!r}") from None
            if not math.isfinite(values[name]):
                raise ValueError(f"threshold {name} must be a finite number, got {value!r}")
        self._values = values

    def __getattr__(self, name: str) -> float:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def overridden(self) -> dict[str, float]:
        """The values that differ from the defaults (for the report's record of what was used)."""
        return {k: v for k, v in self._values.items() if v != DEFAULTS[k]}

    def as_dict(self) -> dict[str, float]:
        """All values in force."""
        return dict(self._values)


def parse_threshold_args(items: list[str]) -> dict[str, float]:
    """`["NAME=VALUE", ...]` (the CLI's `--threshold`) as a dict; ValueError names a malformed item."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--threshold takes NAME=VALUE, got {item!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--threshold {name.strip()}: {value!r} is not a number") from None
        if not math.isfinite(out[name.strip()]):
            raise ValueError(f"--threshold {name.strip()}: {value!r} is not a finite number")
    Thresholds(out)  # unknown names fail here, with the list of known ones
    return out
