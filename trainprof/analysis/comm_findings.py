"""Findings on communication, each with the setting that changes it: exposed communication (the
framework's overlap knob for the op that is exposed), gradients synchronised on every micro-batch
of a gradient-accumulation step (no `no_sync()`), and collectives far below their link.

The framework is read from the trace's names (`FRAMEWORKS`); the fix from the first row of `KNOBS`
that fits the framework and the most exposed op. Cut-offs: `thresholds.py`.

One rank's exposed communication is the sum of what three findings could win back, and each
millisecond is at stake in one of them (`hand_over_exposure`): its wait for a straggler (the
straggler's finding), the time a slow collective would save at its link's speed (the slow
collective's), and the rest, which overlap hides (the exposed-communication finding's).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from trainprof.analysis.collectives import Collective, CollectiveStats, CommTotals
from trainprof.analysis.kinds import FindingKind
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.timeline import Timeline
    from trainprof.trace import Trace


class Framework(msgspec.Struct, frozen=True):
    """A distributed framework, known by a name in the trace (`pattern`, a search over names);
    `micro_batch` marks the start of each forward (one per micro-batch) and `synced_ops` are the
    ops that synchronise gradients, for the no_sync check (None: not checked)."""

    name: str
    pattern: str
    micro_batch: str | None = None
    synced_ops: tuple[str, ...] = ()


# First match wins: the more specific frameworks before DDP, which some of them wrap.
FRAMEWORKS: tuple[Framework, ...] = (
    Framework("DeepEP", r"deep_ep"),
    Framework("Megatron", r"megatron/core/distributed"),
    Framework("DeepSpeed", r"(^|/)deepspeed/"),
    Framework("FSDP2", r"^FSDP::|torch/distributed/fsdp/_fully_shard/", r"^FSDP::root_pre_forward$",
              ("reduce_scatter", "all_reduce")),
    Framework("FSDP", r"^FullyShardedDataParallel\.|torch/distributed/fsdp/fully_sharded_data_parallel\.py"),
    Framework("DDP", r"^DistributedDataParallel\.forward$|torch/nn/parallel/distributed\.py",
              r"^DistributedDataParallel\.forward$", ("all_reduce",)),
)


class Knob(msgspec.Struct, frozen=True):
    """The fix for exposed communication of `ops` (a regex over the op) under `framework` (None: any)."""

    framework: str | None
    ops: str
    fix: str


KNOBS: tuple[Knob, ...] = (
    Knob(None, r"^(ep_dispatch|ep_combine|all_to_all)$",
         "Overlap the MoE all-to-all with compute: DeepEP's normal kernels take `async_finish=True` and "
         "`previous_event`, so dispatch and combine run on the communication stream while other "
         "compute runs; its low-latency kernels' `return_recv_hook=True` splits send from receive, so "
         "that two micro-batches overlap (DeepSeek-V3's two-micro-batch overlap, DualPipe); "
         "`Buffer.set_num_sms` sets how many SMs communication takes from compute."),
    Knob("DDP", r"^all_reduce$",
         "DDP all-reduces each gradient bucket as soon as backward fills it, under the rest of "
         "backward; the last buckets (and any bucket that waits for a late rank) stay exposed. Lower "
         "`bucket_cap_mb` (default 25) so that the first buckets start earlier in backward (raise it "
         "when many small all-reduces each pay latency), set `gradient_as_bucket_view=True` to drop the "
         "copy of each gradient into its bucket, `static_graph=True` when the graph is the same every "
         "step; under gradient accumulation wrap every micro-batch but the last in `model.no_sync()`."),
    Knob("FSDP2", r"^all_gather$",
         "FSDP2 (`fully_shard`) all-gathers each block's parameters just before its forward and again "
         "before its backward: prefetch further ahead with `block.set_modules_to_forward_prefetch([...])` "
         "and `set_modules_to_backward_prefetch([...])` (the next blocks), and set "
         "`reshard_after_forward=False` on the blocks whose parameters fit in memory from forward to "
         "backward, which removes their backward all-gather."),
    Knob("FSDP2", r"",
         "FSDP2 (`fully_shard`) reduce-scatters each block's gradients after its backward; the last "
         "block's stays exposed. Larger `fully_shard` units (several blocks each) make fewer, larger "
         "reduce-scatters; under gradient accumulation call `model.set_requires_gradient_sync(False)` "
         "on every micro-batch but the last; `reshard_after_forward=False` removes backward all-gathers."),
    Knob("FSDP", r"",
         "FSDP: `backward_prefetch=BackwardPrefetch.BACKWARD_PRE` and `forward_prefetch=True` issue the "
         "next all-gather before the current block's compute; `sharding_strategy=SHARD_GRAD_OP` keeps "
         "parameters gathered from forward to backward (no backward all-gather); under gradient "
         "accumulation use `model.no_sync()` on every micro-batch but the last."),
    Knob("DeepSpeed", r"",
         "DeepSpeed ZeRO: set `overlap_comm: true` and tune `reduce_bucket_size` and "
         "`allgather_bucket_size` (ZeRO-3: `stage3_prefetch_bucket_size`) so that collectives start "
         "while compute still runs."),
    Knob("Megatron", r"",
         "Megatron: `--overlap-grad-reduce` and `--overlap-param-gather` (with the distributed "
         "optimizer) overlap data-parallel communication with backward and forward; "
         "`--tp-comm-overlap` does it for tensor parallelism."),
    Knob(None, r"",
         "Overlap communication with compute: issue collectives asynchronously (`async_op=True`, on "
         "their own stream) and wait only where the result is needed, bucket small collectives "
         "together, and under gradient accumulation synchronise gradients on the last micro-batch only."),
)


def framework_of(trace: Trace) -> Framework | None:
    """The first of `FRAMEWORKS` whose pattern matches a name in the trace, else None."""
    for framework in FRAMEWORKS:
        if trace.names_matching(re.compile(framework.pattern).search).any():
            return framework
    return None


def knob_for(framework: str | None, op: str | None) -> str:
    """The fix of the first `KNOBS` row for `framework` (or any) whose ops match `op`."""
    for knob in KNOBS:
        if knob.framework in (None, framework) and re.search(knob.ops, op or ""):
            return knob.fix
    raise AssertionError("KNOBS ends with a row for any framework and op")


class OpExposure(Record, frozen=True):
    """One op's exposed communication per step (ms)."""

    op: str
    exposed_ms_per_step: float


class ExposureHeld(Record, frozen=True):
    """Exposed communication whose GPU time is at stake in another finding: its kind (`straggler`:
    the wait for it; `slow_collective`), its op (None for the wait) and the ms per step."""

    kind: FindingKind
    op: str | None
    ms_per_step: float


class ExposedCommDetails(Record, frozen=True):
    """The exposed-communication finding's evidence: communication, exposed and hidden per step,
    the exposed time by op (most first), the framework the fix is for, and the exposed time other
    findings hold (`held_elsewhere`: the finding's GPU time at stake is what they leave)."""

    comm_ms_per_step: float
    exposed_ms_per_step: float
    hidden_pct: float | None
    step_ms: float
    by_op: list[OpExposure]
    framework: str | None
    held_elsewhere: list[ExposureHeld] = msgspec.field(default_factory=list)
    predicted_step_ms: float | None = None
    """The step with all the exposed communication this finding holds hidden: the most its knobs can
    win (a step's last collective has no compute left to hide under)."""
    judged_step_ms: float | None = None
    """The trace's judged step (`StepBasis.judged_ms`): its severity is its gain over it."""


def exposed_comm_finding(
    comm: CommTotals, basis: StepBasis, comm_bound: bool, rank: int | None, steps: int, thresholds: Thresholds
) -> Finding | None:
    """Communication no compute hides, with the knob that hides it: from `exposed_comm_min_share`
    of the host's step window, or whenever the trace is `communication-bound` (`comm_bound`: then
    even when all of it is hidden, so that the verdict never stands without its finding); judged
    against the trace's judged step (`basis`)."""
    step_ms = basis.window_ms
    exposed_ms_per_step, comm_ms_per_step = comm.exposed_ms_per_step, comm.comm_ms_per_step
    hidden_pct, framework, stats = comm.hidden_pct, comm.framework, comm.ops
    if step_ms <= 0 or (exposed_ms_per_step <= 0 and not comm_bound):
        return None
    share = exposed_ms_per_step / step_ms
    if share < thresholds.exposed_comm_min_share and not comm_bound:
        return None
    by_op: dict[str, float] = {}
    for row in stats:
        by_op[row.op] = by_op.get(row.op, 0.0) + row.exposed_ms_per_step
    ordered = sorted(by_op.items(), key=lambda kv: -kv[1])
    ranked = [OpExposure(op, round(ms, 4)) for op, ms in ordered if ms > 0]
    top = ranked[0].op if ranked else None
    # Shares, not ms: a collective launched in one step may run on past its end, so the ops'
    # exposed times need not add up to the step's.
    total = sum(row.exposed_ms_per_step for row in ranked)
    listed = ", ".join(f"{row.op} {100 * row.exposed_ms_per_step / total:.0f}%" for row in ranked[:3])
    hidden = f"{hidden_pct:.0f}%" if hidden_pct is not None else "none"
    return Finding(
        kind="exposed_communication",
        title=(
            f"Communication exposed {exposed_ms_per_step:.1f} ms/step ({100 * share:.0f}% of the step): "
            f"{hidden} of {comm_ms_per_step:.1f} ms/step hidden under compute"
            + (f"; exposed {listed}" if listed else "")
        ),
        severity=severity_for(exposed_ms_per_step, basis.judged_ms, thresholds),
        op=top,
        where=Where(),
        count=steps,
        per_step=1.0,
        cost_ms=round(exposed_ms_per_step * steps, 4),
        fix=knob_for(framework, top),
        rank=rank,
        cause="collectives running while no compute runs (including any wait for a late rank)",
        gpu_ms_per_step=round(exposed_ms_per_step, 4),
        details=ExposedCommDetails(
            comm_ms_per_step=round(comm_ms_per_step, 4),
            exposed_ms_per_step=round(exposed_ms_per_step, 4),
            hidden_pct=hidden_pct,
            step_ms=round(step_ms, 4),
            by_op=ranked,
            framework=framework,
            predicted_step_ms=round(step_ms - exposed_ms_per_step, 4),
            judged_step_ms=round(basis.judged_ms, 4),
        ),
    )


class NoSyncDetails(Record, frozen=True):
    """The no_sync finding's evidence: micro-batches (forwards) per step, how many of them
    synchronised gradients, and the gradient collectives' time and exposed time per step outside
    the last micro-batch."""

    framework: str
    micro_batches_per_step: float
    synced_micro_batches_per_step: float
    extra_comm_ms_per_step: float
    extra_exposed_ms_per_step: float


_NO_SYNC_FIX = {
    "DDP": "Under gradient accumulation, run every micro-batch but the last inside `with model.no_sync():` "
    "(accelerate: `with accelerator.accumulate(model):`; Lightning and the HF Trainer do it with "
    "their accumulation settings): gradients then accumulate locally and are all-reduced once per step.",
    "FSDP2": "Under gradient accumulation, call `model.set_requires_gradient_sync(False)` before every "
    "micro-batch but the last and `set_requires_gradient_sync(True)` before the last: gradients are "
    "reduce-scattered once per step.",
}


def no_sync_finding(
    timeline: Timeline,
    calls: list[Collective],
    framework: Framework | None,
    basis: StepBasis,
    rank: int | None,
    thresholds: Thresholds,
) -> Finding | None:
    """Gradients synchronised after every micro-batch of a step that runs several forwards: the
    framework's gradient collectives launched before the step's last forward began; judged against
    the trace's judged step (`basis`)."""
    if framework is None or framework.micro_batch is None or not calls:
        return None
    trace = timeline.trace
    marks = trace.events["user_annotation"]
    is_mark = trace.names_matching(re.compile(framework.micro_batch).search)[marks.name]
    starts = marks.start_us[is_mark]
    step_index = timeline.step_of(starts)
    forwards = {timeline.steps[i].number: np.sort(starts[step_index == i] - timeline.steps[i].start_us)
                for i in range(len(timeline.steps))}
    steps = [number for number, offsets in forwards.items() if len(offsets) > 1]
    if not steps:
        return None
    synced = [c for c in calls if c.op in framework.synced_ops and c.step in forwards]
    early = [c for c in synced if len(forwards[c.step]) > 1 and c.launch_offset_us < forwards[c.step][-1]]
    if not early:
        return None
    n = len(timeline.steps)
    # Micro-batch windows that synced: a collective's window is the forwards begun before its launch.
    windows = len({(c.step, int(np.searchsorted(forwards[c.step], c.launch_offset_us, side="right")))
                   for c in synced if c.step in steps})
    extra_ms = sum(c.duration_us for c in early) / 1e3 / n
    exposed_ms = sum(c.exposed_us for c in early) / 1e3 / n
    micro = sum(len(offsets) for offsets in forwards.values()) / n
    return Finding(
        kind="no_sync_missing",
        title=(
            f"Gradients are synchronised on {windows / n:.1f} of {micro:.1f} micro-batches per step: "
            f"{extra_ms:.1f} ms/step of {'/'.join(framework.synced_ops)} before the last micro-batch "
            f"({exposed_ms:.1f} ms/step exposed)"
        ),
        severity=severity_for(exposed_ms, basis.judged_ms, thresholds),
        op=framework.synced_ops[0],
        where=Where(),
        count=len(early),
        per_step=round(len(early) / n, 2),
        cost_ms=round(sum(c.duration_us for c in early) / 1e3, 4),
        fix=_NO_SYNC_FIX[framework.name],
        rank=rank,
        cause="gradient accumulation without no_sync(): every micro-batch all-reduces its gradients",
        gpu_ms_per_step=round(exposed_ms, 4),
        details=NoSyncDetails(
            framework=framework.name,
            micro_batches_per_step=round(micro, 2),
            synced_micro_batches_per_step=round(windows / n, 2),
            extra_comm_ms_per_step=round(extra_ms, 4),
            extra_exposed_ms_per_step=round(exposed_ms, 4),
        ),
    )


class SlowCollectiveDetails(Record, frozen=True):
    """The slow-collective finding's evidence: the op's statistics (bus bandwidth, link), and
    whether its durations are transfer times measured across ranks or one rank's (which include
    the wait for the ranks that arrived later)."""

    collective: CollectiveStats
    across_ranks: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; the statistics in their own JSON form."""
        return {**msgspec.to_builtins(self), "collective": self.collective.to_dict()}


# The checks for a collective far below its link, in the vendor's own tools: RCCL reads NCCL's
# variables (NCCL_DEBUG, NCCL_P2P_DISABLE, ...), its topology tools are ROCm's.
SLOW_COLLECTIVE_FIXES = {
    "NCCL": (
        "Check the transport NCCL chose (NCCL_DEBUG=INFO: NVLink/P2P against SHM or sockets; "
        "NCCL_P2P_DISABLE and NCCL_IB_DISABLE unset), the topology (`nvidia-smi topo -m`: "
        "GPUs behind one PCIe switch or on different sockets) and the NICs the job uses "
        "(NCCL_IB_HCA, NCCL_SOCKET_IFNAME); bucket small collectives into larger ones."
    ),
    "RCCL": (
        "Check the transport RCCL chose (NCCL_DEBUG=INFO, which RCCL reads: xGMI/P2P against SHM or "
        "sockets; NCCL_P2P_DISABLE and NCCL_IB_DISABLE unset), the topology (`rocm-smi --showtopo` "
        "or `amd-smi topology`: GPUs outside one xGMI hive or on different sockets) and the NICs the "
        "job uses (NCCL_IB_HCA, NCCL_SOCKET_IFNAME); bucket small collectives into larger ones."
    ),
}


def slow_collective_findings(
    stats: list[CollectiveStats],
    step_ms: float,
    exposed_ms_per_step: float,
    across_ranks: bool,
    rank: int | None,
    rocm: bool,
    thresholds: Thresholds,
) -> list[Finding]:
    """Ops whose median bus bandwidth is below `slow_collective_link_share` of their link, on
    messages of at least `slow_collective_min_bytes` (smaller ones are latency-bound). What they
    could win back comes out of the rank's exposed communication (`exposed_ms_per_step`), which
    they share: an op's exposed time may count a collective that ran on past its step's end.
    Judged only `across_ranks` (on the last arriver's transfer times); from one rank's own times
    an `info` finding, with no gain claimed. `rocm`: the fix names RCCL's and ROCm's tools."""
    findings = []
    exposed_left = exposed_ms_per_step
    for row in stats:
        if row.busbw_gbps is None or row.link is None or row.link_pct is None or not row.median_bytes:
            continue
        if row.median_bytes < thresholds.slow_collective_min_bytes:
            continue
        if row.link_pct >= 100 * thresholds.slow_collective_link_share:
            continue
        # Only exposed time costs the step; at the link's speed most of it would go. On one rank
        # alone a collective's time is its transfer plus its wait for later ranks, and a rank that
        # waits in every call looks like a slow link: judged across ranks only, else said as a fact.
        won_ms = max(min(row.exposed_ms_per_step, exposed_left), 0.0) * (1 - row.link_pct / 100)
        if across_ranks:
            exposed_left -= won_ms
        measured = "across ranks (the last arriver's time)" if across_ranks else (
            "at best, on this rank alone: its times include any wait for later ranks, so a slow link "
            "and a late rank look the same (analyse every rank's trace together to tell)"
        )
        findings.append(
            Finding(
                kind="slow_collective",
                title=(
                    f"{row.op} ({row.library}, {row.group_size} ranks, median "
                    f"{row.median_bytes / 2**20:.1f} MiB) "
                    f"reaches {row.busbw_gbps:.1f} GB/s bus bandwidth, {row.link_pct:.0f}% of the "
                    f"{row.link.kind} link's {row.link.gbps:.0f} GB/s, measured {measured}"
                ),
                severity=severity_for(won_ms, step_ms, thresholds) if across_ranks else "info",
                op=row.op,
                where=Where(),
                count=0,
                per_step=row.calls_per_step,
                cost_ms=round(row.ms_per_step, 4),
                fix=SLOW_COLLECTIVE_FIXES["RCCL" if rocm else "NCCL"],
                rank=rank,
                cause="a collective far below its link's bandwidth",
                gpu_ms_per_step=round(won_ms, 4) if across_ranks else None,
                details=SlowCollectiveDetails(collective=row, across_ranks=across_ranks),
            )
        )
    return findings


def hand_over_exposure(findings: list[Finding], thresholds: Thresholds) -> list[Finding]:
    """`findings` with each exposed-communication finding's GPU time at stake less the exposed time
    that other findings hold (module docstring): first its rank's exposed wait for the straggler
    (`distributed.RankRow.exposed_wait_ms_per_step`), then what the slow collectives of its rank
    (or across ranks) would win back. When the wait is most of it (`exposed_comm_straggler_share`),
    the finding says so and its fix points at the straggler instead of the overlap knobs."""
    straggler = next((f for f in findings if f.kind == "straggler"), None)
    waits = {row.rank: row.exposed_wait_ms_per_step for row in straggler.details.ranks} if straggler else {}
    slow = [f for f in findings if f.kind == "slow_collective"]
    return [
        _net_of_held(
            finding,
            straggler,
            waits.get(finding.rank, 0.0) if finding.rank is not None else 0.0,
            [s for s in slow if s.rank in (None, finding.rank)],
            thresholds,
        )
        if finding.kind == "exposed_communication"
        else finding
        for finding in findings
    ]


def _net_of_held(
    finding: Finding, straggler: Finding | None, wait_ms: float, slow: list[Finding], thresholds: Thresholds
) -> Finding:
    details = finding.details
    exposed = details.exposed_ms_per_step
    left = exposed
    held: list[ExposureHeld] = []
    words: list[str] = []
    if straggler is not None and straggler.rank != finding.rank and wait_ms > 0 and left > 0:
        taken = min(left, wait_ms)
        held.append(ExposureHeld("straggler", None, round(taken, 4)))
        words.append(f"{taken:.1f} ms/step of it waiting for rank {straggler.rank}, the straggler")
        left -= taken
    for other in slow:
        taken = min(left, other.gpu_ms_per_step or 0.0)
        if taken > 0:
            held.append(ExposureHeld("slow_collective", other.op, round(taken, 4)))
            words.append(f"{taken:.1f} ms/step of it what the slow {other.op} would save")
            left -= taken
    if not held:
        return finding
    left = max(left, 0.0)
    changes: dict[str, Any] = {}
    waited = held[0].ms_per_step if held[0].kind == "straggler" else 0.0
    if straggler is not None and waited >= thresholds.exposed_comm_straggler_share * exposed:
        changes = {
            "fix": (
                f"Most of this rank's exposed communication ({waited:.1f} of {exposed:.1f} ms/step) is "
                f"its wait inside collectives for rank {straggler.rank}, the straggler: balance what "
                f"rank {straggler.rank} does (the straggler finding) first; no bucket size or overlap "
                "setting hides a wait for a late rank."
            ),
            "cause": f"waiting inside collectives for rank {straggler.rank}, the straggler",
        }
    see = "those findings" if len(held) > 1 else "that finding"
    return msgspec.structs.replace(
        finding,
        title=f"{finding.title} ({'; '.join(words)}: see {see})",
        severity=severity_for(left, details.judged_step_ms or details.step_ms, thresholds),
        gpu_ms_per_step=round(left, 4),
        details=msgspec.structs.replace(
            details, held_elsewhere=held, predicted_step_ms=round(details.step_ms - left, 4)
        ),
        **changes,
    )
