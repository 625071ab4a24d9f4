"""Question 7: which GPU work is communication, and what each collective moved, how fast.

A kernel is communication when its name says so (`COMM_KERNELS`: NCCL and RCCL, MSCCL, the
expert-parallel libraries DeepEP (both its `deep_ep::` and `dpsk::ep::` names), HybridEP, UCCL-EP,
TensorRT-LLM's MoE all-to-all, pplx-kernels, mori and NVSHMEM, torch's symmetric memory, the custom
all-reduce kernels), or when the innermost op around its launch is a collective
(`COLLECTIVE_OPS`: `record_param_comms`, `c10d::...`, `_c10d_functional::...`), which catches a
library's kernel whatever it is called. A trace with no GPU work communicates on the host: gloo
runs each collective on a thread of its own (`gloo:all_reduce` ranges, `HOST_COLLECTIVES`).

Per collective (`Collective`): its op (from its host record, `record_param_comms`, else its
kernel's name: `COLLECTIVE_KINDS`), the message's bytes (the record's element count times the
element's size), its duration, and its bus bandwidth as nccl-tests defines it
(`doc/PERFORMANCE.md`), so that one number compares with the link whatever the op and group size:

    algbw = bytes / duration_us
    busbw = algbw * factor(op, n)      all_reduce 2(n-1)/n; all_gather, reduce_scatter,
                                       all_to_all (n-1)/n; broadcast, reduce, send/recv 1

On one rank's trace a collective's duration includes its wait for the ranks that arrived after
it; across ranks (`trainprof.analysis.distributed`) the shortest duration of one collective, the
last arriver's, is its transfer time.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from trainprof.analysis.arrays import distinct, median
from trainprof.analysis.links import Link
from trainprof.analysis.name_patterns import GuardedSearch
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import COLLECTIVES_KEPT
from trainprof.trace.model import NESTING_SLACK_US

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.intervals import Coverage
    from trainprof.analysis.timeline import Timeline
    from trainprof.trace import EventTable, Trace


class KernelFamily(msgspec.Struct, frozen=True):
    """Kernels whose name matches `pattern` (a search, ignoring case) carry `library`'s communication."""

    library: str
    pattern: str
    what: str


# First match names the library.
COMM_KERNELS: tuple[KernelFamily, ...] = (
    KernelFamily("MSCCL", r"msccl", "MSCCL / MSCCL++ kernels (Microsoft's NCCL extensions)"),
    KernelFamily("RCCL", r"rccl", "RCCL's own kernel names (ROCm; most RCCL kernels keep NCCL's)"),
    KernelFamily("NCCL", r"nccl", "NCCL's collective and point-to-point kernels (ncclDevKernel_*, "
                 "ncclKernel_*); RCCL keeps the names, and the trace's GPU tells them apart"),
    # DeepEP's kernels live in `deep_ep::` in its public releases and in `dpsk::ep::` in DeepSeek's own
    # build (deepseek-ai/profile-data's training and prefill traces, 2025-02); `\b` keeps out the
    # `cdpsk::ep::` CUB scan kernels of the sampler in those traces.
    KernelFamily("DeepEP", r"\b(deep_ep|dpsk::ep)::(intranode|internode|internode_ll)::",
                 "DeepEP's expert-parallel dispatch and combine (and their notify barriers, `dispatch_ll`/"
                 "`combine_ll` of its low-latency mode): the all-to-all traffic of MoE layers, over NVLink "
                 "and RDMA; its layout kernel (`::cuda::get_dispatch_layout`) is compute"),
    KernelFamily("HybridEP", r"\bhybrid_ep::",
                 "DeepEP's HybridEP (Megatron-LM's MoE token dispatcher): dispatch, combine and their "
                 "device syncs over NVLink and RDMA"),
    KernelFamily("UCCL-EP", r"\buccl::(\w+::)*\w*(dispatch|combine)",
                 "UCCL-EP's expert-parallel dispatch and combine (DeepEP's interface over a CPU proxy)"),
    KernelFamily("TensorRT-LLM MoE all-to-all",
                 r"moea2a(dispatch|combine)kernel|\bmoe_?comm|alltoallv?_?kernel",
                 "TensorRT-LLM / FlashInfer MoE all-to-all (`moeA2ADispatchKernel`, `moeA2ACombineKernel`)"),
    KernelFamily("pplx-kernels", r"\bpplx::", "pplx-kernels' MoE all-to-all dispatch and combine"),
    KernelFamily("mori", r"\bmori::", "AMD mori's expert-parallel dispatch and combine"),
    KernelFamily("NVSHMEM", r"nvshmem", "NVSHMEM's device-initiated transfers and barriers"),
    KernelFamily("torch symmetric memory", r"(one_shot|two_shot|multimem)_all_reduce|symm_mem",
                 "torch.distributed._symmetric_memory's all-reduce and barrier kernels"),
    KernelFamily("custom all-reduce", r"cross_device_reduce|allreduce_fusion|userbuffers",
                 "vLLM / SGLang custom all-reduce, TensorRT-LLM / FlashInfer fused all-reduce, "
                 "Transformer Engine userbuffers"),
)

COLLECTIVE_OPS = re.compile(r"^(record_param_comms$|c10d::(?!wait)|_?c10d_functional::(?!wait))")
"""Ops that launch communication: a kernel launched with one of them innermost is a collective's."""
HOST_COLLECTIVES = re.compile(r"^gloo:")
"""Host ranges that are a collective's transfer (gloo's worker threads), on traces with no GPU work."""
_NOT_COMPUTE = re.compile(r"^(record_param_comms$|c10d::|_?c10d_functional::|gloo:|nccl:)|(^|::)wait")
"""Host ops that are no compute: a collective's enqueue, or a wait for one."""


def is_comm_kernel(name: str) -> bool:
    """Whether a kernel's name is one of `COMM_KERNELS`'."""
    if name.isascii():  # lowercased, the lowercase patterns match as re.IGNORECASE does
        lowered = name.lower()
        return any(search.found_in(lowered) for search in _comm_kernel_searches())
    # Rare: re's cache keeps them. str.lower differs from re.IGNORECASE beyond ASCII (`ſ` is `s`).
    return any(re.search(family.pattern, name, re.IGNORECASE) for family in COMM_KERNELS)


@functools.cache
def _comm_kernel_searches() -> tuple[GuardedSearch, ...]:
    """`COMM_KERNELS`' patterns, each behind its literal test: gpt2_clean's 66 kernel names are
    tried in 0.4 ms, against 1.6 by one regex of them all (first call, 2-core machine, 2026-11-25)."""
    return tuple(GuardedSearch(family.pattern) for family in COMM_KERNELS)


def comm_library(name: str, rocm: bool) -> str:
    """The library of a communication kernel or host range by its name (`COMM_KERNELS`); NCCL's
    names on ROCm are RCCL's. A kernel recognised by its launching op only: `c10d`."""
    if HOST_COLLECTIVES.match(name):
        return "gloo"
    for family in COMM_KERNELS:
        if re.search(family.pattern, name, re.IGNORECASE):
            return "RCCL" if rocm and family.library == "NCCL" else family.library
    return "c10d"


class CollectiveKind(msgspec.Struct, frozen=True):
    """A collective op: names matching `pattern` (kernel names, c10d's collective names, gloo
    ranges), its bus-bandwidth factor for `n` ranks, and which element count is its size (nccl-tests'
    convention: all_gather's is the gathered output, reduce_scatter's the whole input)."""

    op: str
    pattern: str
    bus_factor: Callable[[int], float]
    size_from: str  # "in" or "out"


def _ring(n: int) -> float:
    return (n - 1) / n


# First match wins: `reduce_scatter` and `all_reduce` before `reduce`, `all_gather` before `gather`.
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = (
    CollectiveKind("reduce_scatter", r"reduce_?scatter", _ring, "in"),
    CollectiveKind("all_reduce", r"all_?reduce", lambda n: 2 * (n - 1) / n, "in"),
    CollectiveKind("all_gather", r"all_?gather", _ring, "out"),
    CollectiveKind("all_to_all", r"all_?to_?all|\ba2a", _ring, "in"),
    CollectiveKind("ep_dispatch", r"dispatch", _ring, "in"),
    CollectiveKind("ep_combine", r"combine", _ring, "in"),
    CollectiveKind("broadcast", r"broadcast|bcast", lambda n: 1.0, "in"),
    CollectiveKind("reduce", r"reduce", lambda n: 1.0, "in"),
    CollectiveKind("gather", r"gather", _ring, "out"),
    CollectiveKind("scatter", r"scatter", _ring, "in"),
    CollectiveKind("send_recv", r"send|recv", lambda n: 1.0, "in"),
    CollectiveKind("barrier", r"barrier", lambda n: 0.0, "in"),
)
_KIND_BY_OP = {kind.op: kind for kind in COLLECTIVE_KINDS}
OTHER_OP = "other"

# c10d's element type names (record_param_comms' `dtype`) -> bytes per element.
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1,
    "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}


def collective_op(name: str) -> str:
    """The op of a kernel name, c10d collective name or gloo range (`COLLECTIVE_KINDS`), else `other`."""
    lowered = name.lower()
    for kind in COLLECTIVE_KINDS:
        if re.search(kind.pattern, lowered):
            return kind.op
    return OTHER_OP


def bus_bandwidth_gbps(
    op: str, message_bytes: int | None, duration_us: float, ranks: int | None
) -> float | None:
    """nccl-tests' bus bandwidth in GB/s (module docstring); None without a size, group or time."""
    kind = _KIND_BY_OP.get(op)
    if kind is None or not message_bytes or not ranks or ranks < 2 or duration_us <= 0:
        return None
    return message_bytes / (duration_us * 1e3) * kind.bus_factor(ranks)


# ---- which spans are communication -------------------------------------------------------------


class CommSpans(msgspec.Struct):
    """A trace's communication: one span per communication kernel (`kernel` its row of the
    timeline's kernels), or per host collective range on a trace with no GPU work (`on_host`,
    `kernel` -1); `name` indexes `Trace.names`. Sorted by start."""

    start_us: np.ndarray
    end_us: np.ndarray
    name: np.ndarray
    kernel: np.ndarray
    on_host: bool

    def __len__(self) -> int:
        return len(self.start_us)


def comm_kernel_mask(
    trace: Trace, kernels: EventTable, calls: EventTable, kernel_call: np.ndarray
) -> np.ndarray:
    """Per kernel, whether it is communication: by its name, or by the collective op it was
    launched from (the innermost op around its launch call)."""
    is_comm = trace.names_matching(is_comm_kernel, among=kernels.name)[kernels.name]
    collective_ops = trace.names_matching(COLLECTIVE_OPS.match)
    if not collective_ops.any() or not len(calls):
        return is_comm
    ops = trace.events["cpu_op"]
    around = ops.select(collective_ops[ops.name])
    from trainprof.analysis.intervals import Coverage

    # Only launches inside some collective op's span can have one innermost: look up their ops alone.
    candidates = np.flatnonzero(~is_comm & (kernel_call >= 0))
    call = kernel_call[candidates]
    inside = Coverage(around.start_us, around.end_us).covered(calls.start_us[call], calls.end_us[call])
    candidates = candidates[inside >= calls.dur_us[call] - NESTING_SLACK_US]
    if candidates.size:
        from trainprof.analysis.kernels import ops_around_calls

        op_name = ops_around_calls(trace, calls, kernel_call[candidates])
        is_comm[candidates[op_name >= 0]] = collective_ops[op_name[op_name >= 0]]
    return is_comm


def comm_spans(trace: Trace, kernels: EventTable, kernel_is_comm: np.ndarray) -> CommSpans:
    """The trace's communication spans (`CommSpans`): its communication kernels, or, on a trace
    with no kernels at all, its host collectives."""
    if len(kernels):
        rows = np.flatnonzero(kernel_is_comm)
        return CommSpans(
            kernels.start_us[rows], kernels.end_us[rows], kernels.name[rows], rows, on_host=False
        )
    host = [trace.events[c] for c in ("user_annotation", "cpu_op")]
    is_host_comm = trace.names_matching(HOST_COLLECTIVES.match)
    picked = [table.select(is_host_comm[table.name]) for table in host]
    start = np.concatenate([t.start_us for t in picked])
    order = np.argsort(start, kind="stable")
    return CommSpans(
        start[order],
        np.concatenate([t.end_us for t in picked])[order],
        np.concatenate([t.name for t in picked])[order],
        np.full(len(order), -1, dtype=np.int64),
        on_host=True,
    )


def compute_spans(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the work communication can hide under: the other kernels; on the host
    (no GPU work), the ops that are neither a collective's enqueue nor a wait for one."""
    if not timeline.comm.on_host:
        kernels, compute = timeline.kernels, ~timeline.kernel_is_comm
        return kernels.start_us[compute], kernels.end_us[compute]
    ops = timeline.trace.events["cpu_op"]
    keep = ~timeline.trace.names_matching(_NOT_COMPUTE.search)[ops.name]
    return ops.start_us[keep], ops.end_us[keep]


# ---- per collective ----------------------------------------------------------------------------


class Collective(Record, frozen=True):
    """One collective inside a step: the step's number, its `index` among the step's collectives of
    the same group size (launch order: the same collective has the same index on every rank of its
    group), its op and library, the group's size and the message's bytes (None: not recorded), its
    duration and the part of it no compute overlapped (`exposed_us`)."""

    step: int
    index: int
    op: str
    library: str
    group_size: int | None
    bytes: int | None
    duration_us: float
    exposed_us: float
    launch_offset_us: float
    """When the host launched it (for gloo: when it began), from its step's start."""
    start_offset_us: float
    """When it began to run, from its step's start (on its rank's clock)."""


def collectives(timeline: Timeline, compute: Coverage) -> list[Collective]:
    """The collectives of a trace's steps, in launch order per step (at most `COLLECTIVES_KEPT`)."""
    trace, spans = timeline.trace, timeline.comm
    if not len(spans):
        return []
    if spans.on_host:
        step = timeline.step_of(spans.start_us)
        launched_at = spans.start_us
        records = np.full(len(spans), -1, dtype=np.int64)
    else:
        step = timeline.kernel_step[spans.kernel]
        call = timeline.kernel_call[spans.kernel]
        calls = timeline.calls
        launched = call >= 0  # a kernel without its host launch (a CUDA-only trace): its own start
        launched_at = spans.start_us.copy()
        launched_at[launched] = calls.start_us[call[launched]]
        records = _records_of_launches(trace, calls, call)
    rocm = _is_rocm(trace)
    order = np.lexsort((launched_at, step))
    order = order[step[order] >= 0][:COLLECTIVES_KEPT]
    exposed = (spans.end_us - spans.start_us) - compute.covered(spans.start_us, spans.end_us)
    world = (trace.distributed_info or {}).get("world_size")
    out: list[Collective] = []
    index_in_step: dict[tuple[int, int | None], int] = defaultdict(int)
    names = trace.names
    for row in order.tolist():
        window = timeline.steps[int(step[row])]
        kernel_name = names[int(spans.name[row])]
        op, group, size = _described(trace.collective_calls, int(records[row]), kernel_name)
        if group is None and isinstance(world, int):
            group = world
        out.append(
            Collective(
                step=window.number,
                index=index_in_step[(window.number, group)],
                op=op,
                library=comm_library(kernel_name, rocm),
                group_size=group,
                bytes=size,
                duration_us=round(float(spans.end_us[row] - spans.start_us[row]), 3),
                exposed_us=round(max(float(exposed[row]), 0.0), 3),
                launch_offset_us=round(float(launched_at[row]) - window.start_us, 3),
                start_offset_us=round(float(spans.start_us[row]) - window.start_us, 3),
            )
        )
        index_in_step[(window.number, group)] += 1
    return out


def is_rocm_device(device: str | None) -> bool:
    """Whether a trace's GPU (`deviceProperties[].name`) is AMD's: its collectives are RCCL's."""
    return isinstance(device, str) and device.startswith("AMD")


def _is_rocm(trace: Trace) -> bool:
    return is_rocm_device(trace.device_properties[0].get("name") if trace.device_properties else None)


def _records_of_launches(trace: Trace, calls: EventTable, call: np.ndarray) -> np.ndarray:
    """Per launch call (-1: none), the row of `trace.collective_calls` whose span on the same thread
    encloses it (the collective's host record), else -1."""
    found = np.full(len(call), -1, dtype=np.int64)
    records = trace.collective_calls
    if records is None or not len(records):
        return found
    for thread in distinct(records.thread).tolist():
        mine = np.flatnonzero(records.thread == thread)
        rows = np.flatnonzero((call >= 0) & (calls.thread[np.clip(call, 0, None)] == thread))
        if not rows.size:
            continue
        at = np.searchsorted(records.start_us[mine], calls.start_us[call[rows]], side="right") - 1
        ends = records.end_us[mine[np.clip(at, 0, None)]]
        ok = (at >= 0) & (ends + NESTING_SLACK_US >= calls.end_us[call[rows]])
        found[rows[ok]] = mine[at[ok]]
    return found


def _described(records: Any, row: int, kernel_name: str) -> tuple[str, int | None, int | None]:
    """(op, group size, bytes) from the collective's host record when found, else from the name."""
    if row < 0:
        return collective_op(kernel_name), None, None
    op = collective_op(records.collective[row])
    if op == OTHER_OP:
        op = collective_op(kernel_name)
    group = int(records.group_size[row])
    kind = _KIND_BY_OP.get(op)
    counts = records.out_nelems if kind is not None and kind.size_from == "out" else records.in_nelems
    count = int(counts[row])
    element = DTYPE_BYTES.get(records.dtype[row] or "")
    size = count * element if count >= 0 and element is not None else None
    return op, (group if group > 0 else None), size


# ---- per op ------------------------------------------------------------------------------------


class CollectiveStats(Record, frozen=True):
    """One op's collectives (per library and group size) over the profiled steps: calls per step,
    the median message, time and exposed time per step, the bus bandwidth of the calls with a
    known size (GB/s; `collective_stats` says which), the link and its share."""

    op: str
    library: str
    group_size: int | None
    calls_per_step: float
    median_bytes: int | None
    ms_per_step: float
    exposed_ms_per_step: float
    busbw_gbps: float | None
    link: Link | None
    link_pct: float | None
    """`busbw_gbps` as a percentage of the link's bandwidth per direction."""

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; the link in its own JSON form."""
        return {**msgspec.to_builtins(self), "link": self.link.to_dict() if self.link is not None else None}


def collective_stats(
    calls: list[Collective],
    steps: int,
    link_of: Callable[[int | None], Link | None],
    across_ranks: bool = False,
) -> list[CollectiveStats]:
    """Per (op, library, group size), the `CollectiveStats` of `calls` over `steps` steps, most time
    first.

    Bus bandwidth: `across_ranks`, each call's duration is its transfer time (measured across ranks:
    `distributed.cross_rank`) and the median over the calls is taken; from one rank's durations,
    which include its waits for later ranks, the best call's (the one it waited least in), an upper
    bound on the transfer time.
    """
    groups: dict[tuple, list[int]] = defaultdict(list)
    for position, call in enumerate(calls):
        groups[(call.op, call.library, call.group_size)].append(position)
    n = max(steps, 1)
    rows = []
    for (op, library, group), members in groups.items():
        sizes = [calls[i].bytes for i in members if calls[i].bytes]
        bandwidths = [
            bw for i in members
            if (bw := bus_bandwidth_gbps(op, calls[i].bytes, calls[i].duration_us, group)) is not None
        ]
        link = link_of(group)
        busbw = None
        if bandwidths:
            busbw = round(median(bandwidths) if across_ranks else max(bandwidths), 2)
        rows.append(
            CollectiveStats(
                op=op,
                library=library,
                group_size=group,
                calls_per_step=round(len(members) / n, 2),
                median_bytes=int(median(sizes)) if sizes else None,
                ms_per_step=round(sum(calls[i].duration_us for i in members) / 1e3 / n, 4),
                exposed_ms_per_step=round(sum(calls[i].exposed_us for i in members) / 1e3 / n, 4),
                busbw_gbps=busbw,
                link=link,
                link_pct=None if busbw is None or link is None else round(100 * busbw / link.gbps, 1),
            )
        )
    rows.sort(key=lambda row: -row.ms_per_step)
    return rows


class CommTotals(msgspec.Struct):
    """One trace's communication over its steps: where it ran (`on_host`: gloo on a trace with no
    GPU work), ms per step, exposed ms per step and the hidden share (`overlap`), the framework
    found, the collectives by op (`CollectiveStats`) and one by one (`calls`, for the cross-rank
    match; left out of the JSON form). `visible_gpus`: GPUs the trace lists (for the link)."""

    on_host: bool
    comm_ms_per_step: float
    exposed_ms_per_step: float
    hidden_pct: float | None
    collectives_per_step: float
    visible_gpus: int
    framework: str | None
    ops: list[CollectiveStats]
    calls: list[Collective]

    def to_dict(self) -> dict[str, Any]:
        """The trace's `communication` object (`trainprof.analysis.result`); `calls` left out."""
        return {
            "on_host": self.on_host,
            "comm_ms_per_step": self.comm_ms_per_step,
            "exposed_ms_per_step": self.exposed_ms_per_step,
            "hidden_pct": self.hidden_pct,
            "collectives_per_step": self.collectives_per_step,
            "visible_gpus": self.visible_gpus,
            "framework": self.framework,
            "ops": [row.to_dict() for row in self.ops],
        }


def comm_totals(
    on_host: bool,
    comm_ms: list[float],
    exposed_ms: list[float],
    calls: list[Collective],
    device: str | None,
    visible_gpus: int,
    framework: str | None,
) -> CommTotals:
    """A trace's (or a process's windows') `CommTotals` from its steps' communication and exposed
    ms and its collectives; the link of each group from `device` and `visible_gpus`."""
    from trainprof.analysis.links import link_for

    n = max(len(comm_ms), 1)
    comm, exposed = sum(comm_ms), sum(exposed_ms)
    return CommTotals(
        on_host=on_host,
        comm_ms_per_step=round(comm / n, 4),
        exposed_ms_per_step=round(exposed / n, 4),
        hidden_pct=round(100 * (1 - exposed / comm), 2) if comm > 0 else None,
        collectives_per_step=round(len(calls) / n, 2),
        visible_gpus=visible_gpus,
        framework=framework,
        ops=collective_stats(calls, len(comm_ms), lambda group: link_for(device, visible_gpus, group)),
        calls=calls,
    )


class CommWait(Record, frozen=True):
    """How much of one rank's collectives, by its own trace alone, is waiting for other ranks.

    Per (op, library, group size) the call with the highest bus bandwidth is taken as all transfer
    and every call of at least `slow_collective_min_bytes` as its bytes at that rate plus a wait
    (smaller ones are latency, counted as transfer). That holds where the best call reaches
    `slow_collective_link_share` of its link (or the link is unknown: gloo, a GPU missing from
    `links.LINKS`): a rank that waits in every call (its peer is late by the same amount in each
    step) never shows a best call that fast, and its ops are `undecided` (a slow link and a late
    rank look the same from one rank; across ranks `distributed` tells them apart)."""

    exposed_wait_ms_by_step: dict[int, float]
    """Per step number, the waits' exposed part (what no compute ran beside)."""
    undecided: list[str]
    """Ops whose waits this rank's trace cannot tell from their transfers."""
    best_link_pct: float | None
    """Of the undecided ops, the best call's bus bandwidth in % of its link (the highest)."""


def comm_wait(
    calls: list[Collective], link_of: Callable[[int | None], Link | None], min_bytes: float, link_share: float
) -> CommWait:
    """The `CommWait` of one trace's collectives (class docstring); `link_of(group size)` their link."""
    groups: dict[tuple, list[Collective]] = defaultdict(list)
    for call in calls:
        if call.bytes and call.bytes >= min_bytes and call.duration_us > 0:
            groups[(call.op, call.library, call.group_size)].append(call)
    waits: dict[int, float] = defaultdict(float)
    undecided: list[str] = []
    best_pct: float | None = None
    for (op, _, group), members in groups.items():
        best = max(members, key=lambda c: c.bytes / c.duration_us)
        link = link_of(group)
        busbw = bus_bandwidth_gbps(op, best.bytes, best.duration_us, group)
        if link is not None and busbw is not None and busbw < link_share * link.gbps:
            undecided.append(op)
            pct = 100 * busbw / link.gbps
            best_pct = pct if best_pct is None else max(best_pct, pct)
            continue
        rate = best.bytes / best.duration_us  # bytes per µs
        for call in members:
            wait = max(call.duration_us - call.bytes / rate, 0.0)
            waits[call.step] += min(wait, call.exposed_us) / 1e3
    return CommWait(
        exposed_wait_ms_by_step={step: round(ms, 4) for step, ms in waits.items()},
        undecided=sorted(set(undecided)),
        best_link_pct=round(best_pct, 1) if best_pct is not None else None,
    )
