"""Where the GPU's busy time goes: every kernel's class and work (FLOPs, bytes), per class and per
module the GPU time per step, its share of the step and its throughput against the device's peak,
and the MFU.

The step these shares are of is the GPU time the step's kernels take, not the host's window alone.
In a GPU-bound loop without syncs the host runs ahead: its `ProfilerStep#` window closes long before
the GPU has run the kernels the step launched, while the GPU is still busy with the previous step's.
A step's time here is the longest of its host window, the span of its kernels (first start to last
end: the kernels attributed to it by their launch) and their summed time (kernels overlapping on
several streams):

    host   |--step 2--|--step 3--|                       window: 20.8 ms
    GPU       [------- step 2's kernels -------][------- step 3's kernels -------]   ~50 ms each

(vocab_head on an H200: 20.8 ms windows, ~50 ms of kernels per step, 50.5 ms per step unprofiled.)

Classes: `trainprof.analysis.kernel_classes` (by name, then by the launching op), refined here:
- a GEMM whose name carries no dtype (cuBLASLt's `nvjet_*`) takes its launching op's input dtype;
  an fp32 one runs TF32 when it beats the fp32 peak by `TF32_EVIDENCE`, and stays of unknown dtype
  when no peak tells;
- a kernel launched under a fused attention op (`ATTENTION_OPS`) is that op's attention class;
- unfused attention: a kernel whose launching op reads (or a matrix product that makes) a score
  matrix [.., T, T] inside an attention module (a module whose class path names attention; any
  module when the trace has no module frames), in a trace that runs a softmax over such a matrix,
  and every kernel under SDPA's math fallback;
- a kernel launched in the optimizer step (`Optimizer.step#...`) is `optimizer` unless a GEMM.

An op's FLOPs (or bytes) count once, on its first kernel of the class that carries them (a GEMM
and its split-K reduction share one op). FLOPs recorded by `with_flops` replace the computed ones.

Numbers that can be true (`physical_work`): work its kernels would have done faster than the
datasheet allows is unknown (an embedding's whole table counted as read: 6.5 TB/s on an H100), the
best remaining rate raises the achievable peak where it beats the measured one (a reduction at 4.75
TB/s beside a measured copy of 4.30), so no share of a peak passes 100%; a class's rate is shown only
where its work is known for `throughput_min_known_share` of its time. MFU: against the datasheet's
dense peak of each kernel's dtype, as the field reports it, and against the achievable one beside it.
"""

from __future__ import annotations

import msgspec
import numpy as np

from trainprof.analysis.arrays import numpy_round, unique_inverse
from trainprof.analysis.attribution import OPTIMIZER, KernelOwners
from trainprof.analysis.kernel_classes import (
    ATTENTION_CLASSES,
    ATTENTION_OPS,
    CLASSES,
    GEMM_CLASS_OF_DTYPE,
    GEMM_CLASSES,
    SDPA_MATH_OP,
    KernelClass,
    Work,
    classify_name,
    classify_op,
)
from trainprof.analysis.modules import OwnerCosts
from trainprof.analysis.peaks import MATH_DTYPES, DevicePeaks
from trainprof.analysis.records import Record
from trainprof.analysis.thresholds import MODULE_TABLE_ROWS, Thresholds
from trainprof.analysis.timeline import Timeline
from trainprof.analysis.work import NO_WORK, OpWork, op_work
from trainprof.trace.model import nearest_marked

TF32_EVIDENCE = 1.25
"""An fp32 GEMM whose kernel name does not say TF32 runs TF32 when it beats the fp32 peak by this
factor (fp32 without tensor cores never does: 54 against 50.5 TFLOP/s measured on the H200)."""
ATTENTION_MODULE_WORDS = ("attention", "attn")
"""Words (in any case) that name a module class as attention (`GPT2Attention`, `CausalSelfAttention`)."""


def _class_table(classes) -> np.ndarray:
    """A boolean table over class codes: `table[kernel_class]` masks the kernels of `classes` (a
    lookup per kernel; `np.isin` sorts, ten times the cost on a few thousand kernels)."""
    table = np.zeros(len(CLASSES), dtype=bool)
    table[[c.code for c in classes]] = True
    return table


_FLOPS_CLASSES = _class_table(c for c in CLASSES if c.work is Work.FLOPS)
_BYTES_CLASSES = _class_table(c for c in CLASSES if c.work is Work.BYTES)
_GEMM = _class_table(GEMM_CLASSES)
_DTYPE_CODE: dict[str | None, int] = {dtype: code for code, dtype in enumerate(MATH_DTYPES)}


class ClassRow(Record, frozen=True):
    """One kernel class's GPU time per profiled step and its throughput.

    `step_pct`: of the step's time (the module docstring's step). Throughput over the class's kernels
    whose work is known (`known_pct` of its time): `achieved_tflops` against the matmul peak of each
    kernel's dtype (`peak_pct`, for FLOP classes), `achieved_tb_s` against the copy bandwidth
    (`peak_pct`, for byte classes); None where unknown.
    """

    kernel_class: str
    label: str
    kernels_per_step: float
    gpu_ms_per_step: float
    step_pct: float
    tflop_per_step: float | None
    achieved_tflops: float | None
    gbyte_per_step: float | None
    achieved_tb_s: float | None
    peak_pct: float | None
    known_pct: float


class ModuleRow(Record, frozen=True):
    """One `nn.Module` class path's kernels (its own, as `trainprof.analysis.modules` counts them):
    GPU time per step, share of the step, its largest kernel class, and its throughput
    (`achieved_tflops` / `flops_peak_pct` over its FLOP kernels, `achieved_tb_s` / `bytes_peak_pct`
    over its memory-bound kernels; None where unknown)."""

    module: str
    path: str
    gpu_ms_per_step: float
    step_pct: float
    top_class: str
    achieved_tflops: float | None
    flops_peak_pct: float | None
    achieved_tb_s: float | None
    bytes_peak_pct: float | None


class StepBusy(Record, frozen=True, rename={"number": "step"}):
    """One step's GPU time and MFU: `step_ms` (the module docstring's step time: host window, span
    of its kernels or their summed time, the longest), `kernel_ms` (summed), `model_tflop` (GEMM and
    attention FLOPs, convolutions' where recorded), `mfu_pct` (against the datasheet's dense peaks;
    None without FLOPs or a datasheet), `mfu_achievable_pct` (against the achievable peaks)."""

    number: int
    window_ms: float
    kernel_span_ms: float
    kernel_ms: float
    step_ms: float
    model_tflop: float | None
    mfu_pct: float | None
    mfu_achievable_pct: float | None = None


class BusyBreakdown(Record, frozen=True):
    """Where one trace's GPU busy time goes (module docstring); JSON `trace.traces[].gpu_busy`.

    `step_ms`: mean step time (the longest of host window, kernel span and summed kernel time);
    `mfu_pct`: model FLOPs at the datasheet's dense peak of their dtype over the step time, as the
    field reports MFU (None when unknown), `mfu_achievable_pct` the same at the achievable peaks
    (`peaks.matmul_tflops`: measured, or the trace's best kernels), `mfu_dtype`: the dtype holding
    most of them, `mfu_peak_tflops` and `mfu_achievable_tflops` its two peaks; `flops_known_pct`: the
    share of the compute time whose FLOPs are counted (`flops_known_share`); `peaks`: the ceilings
    used and their source.
    """

    step_ms: float
    window_ms: float
    kernel_ms_per_step: float
    model_tflop_per_step: float | None
    mfu_pct: float | None
    mfu_dtype: str | None
    flops_known_pct: float | None
    peaks: DevicePeaks | None
    classes: list[ClassRow]
    modules: list[ModuleRow]
    steps: list[StepBusy]
    mfu_achievable_pct: float | None = None
    mfu_peak_tflops: float | None = None
    mfu_achievable_tflops: float | None = None


class KernelWork(msgspec.Struct):
    """Per kernel launched inside the profiled steps (rows of `timeline.kernels` in `rows`): its
    class, work and owner, for `busy_breakdown` and the findings on busy time (`busy_findings`).

    `kernel_class`: `KernelClass.code`; `dtype`: index into `MATH_DTYPES` (-1 none); `flops`,
    `bytes`: counted once per op (0 elsewhere; NaN never; 0 too for work its kernels would have done
    faster than the datasheet allows: `physical_work`); `ideal_us`: `flops` at the achievable peak
    of `dtype`, `datasheet_us` at its datasheet peak (0 when unknown); `op`: cpu_op row of the
    launching op (-1); `signature`: index into `works` (the op's shape signature, -1 none);
    `attention_op`: cpu_op row of the fused attention op (or SDPA math op) it runs under (-1);
    `module`: index into `owners.modules` (-1); `module_group`: index into `module_paths` (class
    paths; -1); `phase`: `attribution.PHASES` codes.
    """

    rows: np.ndarray
    step: np.ndarray
    phase: np.ndarray
    dur_us: np.ndarray
    kernel_class: np.ndarray
    dtype: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    ideal_us: np.ndarray
    datasheet_us: np.ndarray
    op: np.ndarray
    signature: np.ndarray
    works: list[OpWork]
    attention_op: np.ndarray
    module: np.ndarray
    module_group: np.ndarray
    module_paths: list[str]
    steps: int
    step_ms: float
    peaks: DevicePeaks | None
    has_scores_softmax: bool
    carried: dict = msgspec.field(default_factory=dict)
    """`carries`'s masks, by kind, computed once."""

    def carries(self, kind: Work) -> np.ndarray:
        """A mask over the kernels: of a class bound by `kind` (FLOPs or bytes) whose op's amount of
        it is known (counted on this kernel or a sibling of the same op)."""
        cached = self.carried.get(kind)
        if cached is None:
            amount = self.flops if kind is Work.FLOPS else self.bytes
            cached = _carrying(kind, self.kernel_class, self.op, amount)
            self.carried[kind] = cached
        return cached

    def of_class(self, *classes: KernelClass) -> np.ndarray:
        """A mask over the kernels: those of any of `classes`."""
        return _class_table(classes)[self.kernel_class]

    def per_step_ms(self, mask: np.ndarray) -> float:
        """The summed GPU time of the kernels in `mask`, per profiled step (ms)."""
        return float(self.dur_us[mask].sum()) / 1e3 / max(self.steps, 1)

    def peak_of(self, dtype: str) -> float | None:
        """FLOP/s of `dtype`'s matmul peak, or None."""
        return self.peaks.flops_per_s(dtype) if self.peaks is not None else None


def _carrying(kind: Work, kernel_class: np.ndarray, op: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """`KernelWork.carries`, from the arrays: kernels of a class bound by `kind` whose op's amount of
    it is known (on this kernel, or on a sibling launched by the same op)."""
    table = _FLOPS_CLASSES if kind is Work.FLOPS else _BYTES_CLASSES
    counted = np.zeros(int(op.max(initial=-1)) + 2, dtype=bool)  # per cpu_op row; last: -1
    counted[op[amount > 0]] = True
    counted[-1] = False
    return table[kernel_class] & ((amount > 0) | counted[op])


def kernel_work(timeline: Timeline, owners: KernelOwners, peaks: DevicePeaks | None) -> KernelWork:
    """Classify and weigh every kernel launched inside the profiled steps (module docstring)."""
    trace = timeline.trace
    rows = np.flatnonzero(timeline.kernel_step >= 0)
    n = len(rows)
    dur = timeline.kernels.dur_us[rows]
    kernel_class, dtype = _classes_by_name(trace, timeline.kernels.name[rows])
    op = owners.launch_op[rows] if len(owners.launch_op) else np.full(n, -1, dtype=np.int64)
    signature, works = _signatures(trace, op)
    op_work = _OpArrays.of(works, signature, trace, op)

    # Kernels whose name says nothing: their op's class.
    other = np.flatnonzero((kernel_class == KernelClass.OTHER.code) & (op >= 0))
    kernel_class[other] = _op_classes(trace, op[other])
    _gemm_dtypes(kernel_class, dtype, op_work, dur, peaks)

    # Kernels under a fused attention op (or SDPA's math fallback) are its attention.
    attention_op = _ancestor_ops(trace, owners, op, set(ATTENTION_OPS) | {SDPA_MATH_OP})
    under = np.flatnonzero(attention_op >= 0)
    kernel_class[under] = _op_classes(trace, attention_op[under], attention=True)

    # Unfused attention: score matrices inside attention modules, in a trace with a score softmax.
    module = owners.module[rows] if len(owners.module) else np.full(n, -1, dtype=np.int64)
    in_attention = _in_attention_module(owners, module)
    scores = op_work.scores & in_attention
    has_scores_softmax = bool((scores & (kernel_class == KernelClass.REDUCTION.code)).any())
    if has_scores_softmax:
        unfused = scores & (attention_op < 0) & _UNFUSED_CANDIDATES[kernel_class]
        kernel_class[unfused] = KernelClass.ATTENTION_UNFUSED.code
        dtype[unfused & (dtype < 0)] = op_work.dtype[unfused & (dtype < 0)]

    # The optimizer step's kernels (GEMMs aside), and collectives.
    optimizer = (owners.phase[rows] == OPTIMIZER) if len(owners.phase) else np.zeros(n, dtype=bool)
    optimizer &= ~_GEMM[kernel_class] & (kernel_class != KernelClass.COMMUNICATION.code)
    kernel_class[optimizer] = KernelClass.OPTIMIZER.code
    kernel_class[timeline.kernel_is_comm[rows]] = KernelClass.COMMUNICATION.code

    flops = _count_flops(trace, kernel_class, dtype, op, attention_op, op_work)
    bytes_moved = np.zeros(n)
    first = _first_of_each(op, _BYTES_CLASSES[kernel_class] & np.isfinite(op_work.bytes))
    bytes_moved[first] = op_work.bytes[first]
    groups = _work_groups(signature, op, kernel_class)
    flops, bytes_moved, peaks = physical_work(kernel_class, dtype, flops, bytes_moved, op, groups, dur, peaks)
    ideal_us = _at_peak(flops, dtype, peaks.flops_per_s if peaks else None)
    datasheet_us = _at_peak(flops, dtype, peaks.datasheet_flops_per_s if peaks else None)

    paths: dict[str, int] = {}
    group_of_ref = np.asarray(
        [paths.setdefault(ref.class_path, len(paths)) for ref in owners.modules] + [-1], dtype=np.int64
    )
    return KernelWork(
        rows=rows,
        step=timeline.kernel_step[rows],
        phase=owners.phase[rows] if len(owners.phase) else np.zeros(n, dtype=np.int8),
        dur_us=dur,
        kernel_class=kernel_class,
        dtype=dtype,
        flops=flops,
        bytes=bytes_moved,
        ideal_us=ideal_us,
        datasheet_us=datasheet_us,
        op=op,
        signature=signature,
        works=works,
        attention_op=attention_op,
        module=module,
        module_group=group_of_ref[module],
        module_paths=list(paths),
        steps=len(timeline.steps),
        step_ms=0.0,
        peaks=peaks,
        has_scores_softmax=has_scores_softmax,
    )


def _at_peak(flops: np.ndarray, dtype: np.ndarray, rate_of) -> np.ndarray:
    """Per kernel, µs its FLOPs take at `rate_of(dtype)` FLOP/s (0 where either is unknown)."""
    if rate_of is None:
        return np.zeros(len(flops))
    peak = np.array([rate_of(d) or np.nan for d in MATH_DTYPES] + [np.nan])
    return np.nan_to_num(flops / peak[dtype.astype(np.int64)] * 1e6, nan=0.0)


def _work_groups(signature: np.ndarray, op: np.ndarray, kernel_class: np.ndarray) -> np.ndarray:
    """Per kernel, the group whose work and time are weighed together: its op's shape signature,
    else its op call, else the kernel alone; and its class (an op's work counts on its first kernel
    of a class that carries it: a class's rate is read from its own kernels' time alone)."""
    signatures = int(signature.max(initial=-1)) + 1
    ops = int(op.max(initial=-1)) + 1
    alone = signatures + ops + np.arange(len(op))
    group = np.where(signature >= 0, signature, np.where(op >= 0, signatures + op, alone))
    return group * len(CLASSES) + kernel_class


def physical_work(
    kernel_class: np.ndarray,
    dtype: np.ndarray,
    flops: np.ndarray,
    bytes_moved: np.ndarray,
    op: np.ndarray,
    groups: np.ndarray,
    dur: np.ndarray,
    peaks: DevicePeaks | None,
) -> tuple[np.ndarray, np.ndarray, DevicePeaks | None]:
    """The counted work that a GPU can have done, and the achievable peaks it shows.

    Per group of kernels (`groups`: one op signature, weighed over all its calls), its FLOPs (or
    bytes) over the time of the kernels that carry them is its rate. A rate above the device's
    datasheet peak of its dtype (or memory bandwidth) is no measurement: the count is wrong (an
    embedding's whole table counted as read, a FLOP count of the wrong layout) or the data came
    from cache; that work is set to 0, unknown, and no share of a peak is read from it. The best
    remaining rate per dtype (and for bytes) that beats the achievable peak replaces it: a
    measurement is a floor of what the device does (`DevicePeaks.raised`)."""
    if peaks is None or not len(groups):
        return flops, bytes_moved, peaks
    flops, bytes_moved = flops.copy(), bytes_moved.copy()
    tflops = dict(peaks.matmul_tflops)
    copy_tb_s = peaks.copy_tb_s
    raised: dict[str, float] = {}
    for kind, amount in ((Work.FLOPS, flops), (Work.BYTES, bytes_moved)):
        carrying = _carrying(kind, kernel_class, op, amount)
        if not carrying.any():
            continue
        ids, of = unique_inverse(groups[carrying])
        done = np.bincount(of, weights=amount[carrying], minlength=len(ids))
        took_us = np.bincount(of, weights=dur[carrying], minlength=len(ids))
        group_dtype = np.full(len(ids), -1, dtype=np.int64)
        np.maximum.at(group_dtype, of, np.where(amount[carrying] > 0, dtype[carrying], -1).astype(np.int64))
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(took_us > 0, done / took_us * 1e6, np.inf)
        if kind is Work.FLOPS:
            ceiling = np.array([peaks.datasheet_flops_per_s(d) or np.inf for d in MATH_DTYPES] + [np.inf])
            limit = ceiling[group_dtype]
        else:
            limit = np.full(len(ids), peaks.datasheet_bytes_per_s or np.inf)
        impossible = (rate > limit) & (done > 0)
        if impossible.any():
            amount[np.isin(groups, ids[impossible])] = 0.0
        possible = ~impossible & (done > 0) & np.isfinite(rate)
        if kind is Work.FLOPS:
            for code, name in enumerate(MATH_DTYPES):
                best = rate[possible & (group_dtype == code)]
                if len(best) and best.max() / 1e12 > tflops.get(name, np.inf):
                    raised[name] = round(float(best.max()) / 1e12, 1)
        elif possible.any() and copy_tb_s and rate[possible].max() / 1e12 > copy_tb_s:
            raised["copy"] = round(float(rate[possible].max()) / 1e12, 3)
    achievable = {name: raised.get(name, rate) for name, rate in tflops.items()}
    peaks = msgspec.structs.replace(
        peaks,
        matmul_tflops={name: achievable[name] for name in MATH_DTYPES if name in achievable},
        copy_tb_s=raised.get("copy", copy_tb_s),
        raised=raised,
    )
    return flops, bytes_moved, peaks


_UNFUSED_CANDIDATES = _class_table(
    (*GEMM_CLASSES, KernelClass.REDUCTION, KernelClass.ELEMENTWISE, KernelClass.COPY)
)
_FUSED_ATTENTION = _class_table(c for c in ATTENTION_CLASSES if c is not KernelClass.ATTENTION_UNFUSED)


class _OpArrays(msgspec.Struct):
    """Per kernel, its launching op's `OpWork` fields (NaN, -1 or False where unknown); FLOPs recorded
    by `with_flops` replace the computed ones, and a FLOP-bound op (matrix product, convolution)
    has no bytes: its transposes and casts are not memory-bound work of their own."""

    flops: np.ndarray
    bytes: np.ndarray
    dtype: np.ndarray
    scores: np.ndarray

    @staticmethod
    def of(works: list[OpWork], signature: np.ndarray, trace, op: np.ndarray) -> _OpArrays:
        flops = np.array([w.flops for w in works] + [np.nan])[signature]
        cpu_ops = trace.events["cpu_op"]
        if cpu_ops.value is not None and len(cpu_ops) and len(op):
            recorded = np.where(op >= 0, cpu_ops.value[np.clip(op, 0, None)], np.nan)
            flops = np.where(np.isfinite(recorded), recorded, flops)
        moved = np.array([w.bytes for w in works] + [np.nan])[signature]
        moved[_ops_of_class(trace, op, Work.FLOPS)] = np.nan
        return _OpArrays(
            flops=flops,
            bytes=moved,
            dtype=np.array([_DTYPE_CODE.get(w.dtype, -1) for w in works] + [-1], dtype=np.int8)[signature],
            scores=np.array([w.scores for w in works] + [False])[signature],
        )


def _classes_by_name(trace, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel, its class code and GEMM dtype code from its name; each distinct name once."""
    if not len(names):
        return np.zeros(0, np.int16), np.zeros(0, np.int8)
    name_ids, name_of = unique_inverse(names)
    named = [classify_name(trace.names[i]) for i in name_ids.tolist()]
    kernel_class = np.asarray([c.code for c, _ in named], dtype=np.int16)[name_of]
    dtype = np.asarray([_DTYPE_CODE.get(d, -1) for _, d in named], dtype=np.int8)[name_of]
    return kernel_class, dtype


def _op_classes(trace, rows: np.ndarray, attention: bool = False) -> np.ndarray:
    """The class codes of the kernels launched under the cpu_ops `rows` (each distinct op name once):
    `classify_op`'s, or with `attention`, the attention op's implementation (`ATTENTION_OPS`; SDPA's
    math fallback: unfused)."""
    if not len(rows):
        return np.zeros(0, np.int16)
    names, of = unique_inverse(trace.events["cpu_op"].name[rows])
    classes = [
        (ATTENTION_OPS[name].kernel_class if name in ATTENTION_OPS else KernelClass.ATTENTION_UNFUSED)
        if attention
        else classify_op(name)
        for name in (trace.names[i] for i in names.tolist())
    ]
    return np.asarray([c.code for c in classes], dtype=np.int16)[of]


def _gemm_dtypes(
    kernel_class: np.ndarray,
    dtype: np.ndarray,
    op_work: _OpArrays,
    dur: np.ndarray,
    peaks: DevicePeaks | None,
) -> None:
    """GEMMs whose name gives no dtype take their op's input dtype; an fp32 one is TF32 only when it
    beats the fp32 peak by `TF32_EVIDENCE`, and stays of unknown dtype without a peak to tell.
    Updates `kernel_class` and `dtype` in place."""
    unknown = (kernel_class == KernelClass.GEMM.code) & (op_work.dtype >= 0)
    dtype[unknown] = op_work.dtype[unknown]
    fp32 = unknown & (op_work.dtype == _DTYPE_CODE["fp32"])
    if fp32.any():
        fp32_peak = peaks.flops_per_s("fp32") if peaks is not None else None
        if fp32_peak is None:
            dtype[fp32] = -1
        else:
            rate = op_work.flops / np.maximum(dur, 1e-3) * 1e6
            dtype[fp32 & (rate > TF32_EVIDENCE * fp32_peak)] = _DTYPE_CODE["tf32"]
    for name, gemm_class in GEMM_CLASS_OF_DTYPE.items():
        kernel_class[unknown & (dtype == _DTYPE_CODE[name])] = gemm_class.code


def _count_flops(
    trace,
    kernel_class: np.ndarray,
    dtype: np.ndarray,
    op: np.ndarray,
    attention_op: np.ndarray,
    op_work: _OpArrays,
) -> np.ndarray:
    """Per kernel, the FLOPs it carries: its op's (a fused attention kernel: its attention op's), on
    the first kernel of each op; sets the fused attention kernels' dtype to their op's."""
    fused = _FUSED_ATTENTION[kernel_class]
    owner = np.where(fused & (attention_op >= 0), attention_op, op)
    owner_flops = op_work.flops.copy()
    if fused.any():
        signature, works = _signatures(trace, owner[fused])
        owner_flops[fused] = np.array([w.flops for w in works] + [np.nan])[signature]
        dtype[fused] = np.array([_DTYPE_CODE.get(w.dtype, -1) for w in works] + [-1], dtype=np.int8)[
            signature
        ]
    flops = np.zeros(len(op))
    first = _first_of_each(owner, _FLOPS_CLASSES[kernel_class] & np.isfinite(owner_flops))
    flops[first] = owner_flops[first]
    return flops


def _signatures(trace, op: np.ndarray) -> tuple[np.ndarray, list[OpWork]]:
    """Per kernel, an index into a list of distinct op shape signatures (op name, input dims, input
    dtypes) and that list's `OpWork`s (-1: no op or nothing recorded). An LLM's ops repeat per layer
    and per step: a few hundred signatures for thousands of kernels, each decoded and weighed once."""
    signature = np.full(len(op), -1, dtype=np.int64)
    cpu_ops, inputs = trace.events["cpu_op"], trace.op_inputs
    launched = np.flatnonzero(op >= 0)
    if inputs is None or cpu_ops.inputs is None or not len(launched):
        return signature, []
    rows, row_of = unique_inverse(op[launched])
    slots = cpu_ops.inputs[rows].tolist()
    names = cpu_ops.name[rows].tolist()
    index: dict[tuple[int, bytes], int] = {}
    of_row = np.fromiter(
        (index.setdefault(key, len(index)) for key in zip(names, inputs.keys(slots), strict=True)),
        dtype=np.int64,
        count=len(rows),
    )
    _, first = np.unique(of_row, return_index=True)  # each signature's first row (numbered in that order)
    first_slot = np.asarray(slots, dtype=np.int64)[first]
    first_name = np.asarray(names, dtype=np.int64)[first].tolist()
    dims, types = inputs.decode(first_slot)
    works = [
        op_work(trace.names[name], d, t) if d is not None else NO_WORK
        for name, d, t in zip(first_name, dims, types, strict=True)
    ]
    signature[launched] = of_row[row_of]
    return signature, works


def _ops_of_class(trace, op: np.ndarray, kind: Work) -> np.ndarray:
    """Per kernel: its launching op's own class (`classify_op`) is bound by `kind`."""
    has = op >= 0
    found = np.zeros(len(op), dtype=bool)
    if not has.any():
        return found
    names, of = unique_inverse(trace.events["cpu_op"].name[op[has]])
    bound = np.asarray([classify_op(trace.names[i]).work is kind for i in names.tolist()])
    found[has] = bound[of]
    return found


def _ancestor_ops(trace, owners: KernelOwners, op: np.ndarray, names: set[str]) -> np.ndarray:
    """Per kernel, the cpu_op row of the innermost op named in `names` around its launch (itself
    included), or -1."""
    found = np.full(len(op), -1, dtype=np.int64)
    cpu_ops = trace.events["cpu_op"]
    ids = [trace.name_id(name) for name in names]
    ids = [i for i in ids if i >= 0]
    if not ids or not len(owners.op_parent):
        return found
    marked = np.isin(cpu_ops.name, ids)
    if not marked.any():
        return found
    ancestor = nearest_marked(owners.op_parent, marked)
    has = op >= 0
    found[has] = ancestor[op[has]]
    return found


def _in_attention_module(owners: KernelOwners, module: np.ndarray) -> np.ndarray:
    """Per kernel: inside an attention module (a class path naming attention); every kernel when the
    trace has no module frames (no `with_stack`), since nothing then says where attention is."""
    if not owners.modules:
        return np.ones(len(module), dtype=bool)
    lowered = [ref.class_path.lower() for ref in owners.modules]
    named = np.asarray([any(word in path for word in ATTENTION_MODULE_WORDS) for path in lowered] + [False])
    return named[module]


def _first_of_each(op: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Positions of the first kernel of each distinct op among those in `mask` (op -1: every one)."""
    at = np.flatnonzero(mask)
    if not len(at):
        return at
    keyed = op[at]
    _, first = np.unique(keyed, return_index=True)
    keep = np.zeros(len(at), dtype=bool)
    keep[first] = True
    keep[keyed < 0] = True
    return at[keep]


def busy_breakdown(
    timeline: Timeline, work: KernelWork, costs: OwnerCosts, thresholds: Thresholds
) -> BusyBreakdown:
    """Per step, class and module: GPU time, shares, throughput and MFU (module docstring). Sets
    `work.step_ms` (the mean step time the findings' shares are of). The MFU is unknown (None)
    when the kernels whose FLOPs it counts hold less than `mfu_min_flops_known_share` of the
    compute time (`flops_known_share`): it would be a fraction of the real one."""
    steps = timeline.steps
    n = len(steps)
    window = np.array([s.end_us - s.start_us for s in steps])
    starts = np.full(n, np.inf)
    ends = np.full(n, -np.inf)
    kernels = timeline.kernels
    np.minimum.at(starts, work.step, kernels.start_us[work.rows])
    np.maximum.at(ends, work.step, kernels.end_us[work.rows])
    span = np.where(ends > starts, ends - starts, 0.0)
    summed = np.bincount(work.step, weights=work.dur_us, minlength=n)
    step_us = np.maximum(np.maximum(window, span), summed)
    achievable = np.bincount(work.step, weights=work.ideal_us, minlength=n)
    datasheet = np.bincount(work.step, weights=work.datasheet_us, minlength=n)
    model = np.bincount(work.step, weights=work.flops * _FLOPS_CLASSES[work.kernel_class], minlength=n)
    known_share = flops_known_share(work)
    enough = (known_share or 0.0) >= thresholds.mfu_min_flops_known_share
    total_us = float(step_us.sum())
    work.step_ms = total_us / 1e3 / max(n, 1)

    def mfu(ideal: np.ndarray, i: int | None = None) -> float | None:
        if not enough or ideal.sum() <= 0:
            return None
        over = float(step_us.sum()) if i is None else float(step_us[i])
        return round(100.0 * float(ideal.sum() if i is None else ideal[i]) / over, 2) if over > 0 else None

    step_rows = [
        StepBusy(
            number=s.number,
            window_ms=round(float(window[i]) / 1e3, 4),
            kernel_span_ms=round(float(span[i]) / 1e3, 4),
            kernel_ms=round(float(summed[i]) / 1e3, 4),
            step_ms=round(float(step_us[i]) / 1e3, 4),
            model_tflop=round(float(model[i]) / 1e12, 4) if model[i] > 0 else None,
            mfu_pct=mfu(datasheet, i),
            mfu_achievable_pct=mfu(achievable, i),
        )
        for i, s in enumerate(steps)
    ]
    mfu_dtype = None
    if enough and achievable.sum() + datasheet.sum() > 0:
        counted = (work.ideal_us > 0) | (work.datasheet_us > 0)
        by_dtype = np.bincount(
            work.dtype[counted].astype(np.int64), weights=work.flops[counted], minlength=len(MATH_DTYPES)
        )
        mfu_dtype = MATH_DTYPES[int(by_dtype.argmax())]
    peaks = work.peaks
    return BusyBreakdown(
        step_ms=numpy_round(work.step_ms, 4),
        window_ms=numpy_round(float(window.sum()) / 1e3 / max(n, 1), 4),
        kernel_ms_per_step=numpy_round(float(summed.sum()) / 1e3 / max(n, 1), 4),
        model_tflop_per_step=round(float(model.sum()) / 1e12 / max(n, 1), 4) if model.sum() > 0 else None,
        mfu_pct=mfu(datasheet),
        mfu_dtype=mfu_dtype,
        flops_known_pct=round(100.0 * known_share, 2) if known_share is not None else None,
        peaks=peaks,
        classes=_class_rows(work, thresholds),
        modules=_module_rows(work, costs, thresholds),
        steps=step_rows,
        mfu_achievable_pct=mfu(achievable),
        mfu_peak_tflops=peaks.datasheet_tflops.get(mfu_dtype) if peaks and mfu_dtype else None,
        mfu_achievable_tflops=peaks.matmul_tflops.get(mfu_dtype) if peaks and mfu_dtype else None,
    )


def flops_known_share(work: KernelWork) -> float | None:
    """The share of the compute time (kernels of the FLOP-bound classes, and those of unknown
    class) whose FLOPs the analysis counts; None without such kernels. Unfused attention is left
    out: its matrix products are GEMMs with known FLOPs, its masks and softmax carry none."""
    compute = _COMPUTE_CLASSES[work.kernel_class]
    compute_us = float(work.dur_us[compute].sum())
    if compute_us <= 0:
        return None
    return float(work.dur_us[compute & work.carries(Work.FLOPS)].sum()) / compute_us


_COMPUTE_CLASSES = _class_table(
    c for c in CLASSES
    if (c.work is Work.FLOPS and c is not KernelClass.ATTENTION_UNFUSED) or c is KernelClass.OTHER
)


class _Throughput(msgspec.Struct):
    """Per group of kernels (a class, a module): FLOPs and bytes over the time of the kernels whose
    ops carry them (an op's work counts on one of its kernels; its siblings' time counts too)."""

    tflops: np.ndarray
    flops_peak_pct: np.ndarray
    tb_s: np.ndarray
    bytes_peak_pct: np.ndarray
    flops_known_us: np.ndarray
    bytes_known_us: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    flops_class_us: np.ndarray
    bytes_class_us: np.ndarray

    def shown(self, thresholds: Thresholds) -> tuple[np.ndarray, np.ndarray]:
        """Per group, whether its FLOP rate and its byte rate describe it: their work is known for at
        least `throughput_min_known_share` of the time of its kernels of FLOP (byte) classes."""
        least = thresholds.throughput_min_known_share
        with np.errstate(divide="ignore", invalid="ignore"):
            return (
                self.flops_known_us >= least * self.flops_class_us,
                self.bytes_known_us >= least * self.bytes_class_us,
            )

    @staticmethod
    def of(work: KernelWork, group: np.ndarray, groups: int) -> _Throughput:
        """Throughput of each group (`group`: per kernel, 0..groups-1, or -1 for none)."""
        keep = group >= 0
        g = group[keep]

        def total(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
            chosen = values[keep] if mask is None else np.where(mask[keep], values[keep], 0.0)
            return np.bincount(g, weights=chosen, minlength=groups)

        flop_kernels, byte_kernels = work.carries(Work.FLOPS), work.carries(Work.BYTES)
        flop_us, byte_us = total(work.dur_us, flop_kernels), total(work.dur_us, byte_kernels)
        flops, ideal, moved = (
            total(work.flops, flop_kernels),
            total(work.ideal_us, flop_kernels),
            total(work.bytes, byte_kernels),
        )
        copy = work.peaks.bytes_per_s if work.peaks is not None else None
        with np.errstate(divide="ignore", invalid="ignore"):
            tflops = np.where((flop_us > 0) & (flops > 0), flops / flop_us / 1e6, np.nan)
            flops_pct = np.where((flop_us > 0) & (ideal > 0), 100.0 * ideal / flop_us, np.nan)
            rate = np.where((byte_us > 0) & (moved > 0), moved / byte_us * 1e6, np.nan)
        return _Throughput(
            tflops=tflops,
            flops_peak_pct=flops_pct,
            tb_s=rate / 1e12,
            bytes_peak_pct=100.0 * rate / copy if copy else np.full(groups, np.nan),
            flops_known_us=flop_us,
            bytes_known_us=byte_us,
            flops=flops,
            bytes=moved,
            flops_class_us=total(work.dur_us, _FLOPS_CLASSES[work.kernel_class]),
            bytes_class_us=total(work.dur_us, _BYTES_CLASSES[work.kernel_class]),
        )


def _figure(value: float, digits: int) -> float | None:
    return None if not np.isfinite(value) else round(float(value), digits)


def _class_rows(work: KernelWork, thresholds: Thresholds) -> list[ClassRow]:
    steps = max(work.steps, 1)
    step_ms = work.step_ms or 1.0
    codes = work.kernel_class.astype(np.int64)
    class_us = np.bincount(codes, weights=work.dur_us, minlength=len(CLASSES))
    counts = np.bincount(codes, minlength=len(CLASSES))
    rates = _Throughput.of(work, codes, len(CLASSES))
    flops_shown, bytes_shown = rates.shown(thresholds)
    out = []
    for code in np.argsort(-class_us, kind="stable").tolist():
        if not counts[code]:
            continue
        kernel_class = CLASSES[code]
        gpu_ms = float(class_us[code]) / 1e3 / steps
        flop_class = kernel_class.work is Work.FLOPS
        shown = flops_shown[code] if flop_class else bytes_shown[code]
        tflops = _figure(rates.tflops[code], 2) if shown else None
        tb_s = _figure(rates.tb_s[code], 3) if shown else None
        known_us = rates.flops_known_us[code] if flop_class else rates.bytes_known_us[code]
        out.append(
            ClassRow(
                kernel_class=kernel_class.key,
                label=kernel_class.label,
                kernels_per_step=round(float(counts[code]) / steps, 1),
                gpu_ms_per_step=round(gpu_ms, 4),
                step_pct=round(100.0 * gpu_ms / step_ms, 2),
                tflop_per_step=round(float(rates.flops[code]) / 1e12 / steps, 4) if tflops else None,
                achieved_tflops=tflops,
                gbyte_per_step=round(float(rates.bytes[code]) / 1e9 / steps, 4) if tb_s else None,
                achieved_tb_s=tb_s,
                peak_pct=_figure(rates.flops_peak_pct[code] if flop_class else rates.bytes_peak_pct[code], 1)
                if shown
                else None,
                known_pct=round(100.0 * float(known_us) / max(float(class_us[code]), 1e-9), 1),
            )
        )
    return out


def _module_rows(work: KernelWork, costs: OwnerCosts, thresholds: Thresholds) -> list[ModuleRow]:
    if not work.module_paths:
        return []
    steps = max(work.steps, 1)
    step_ms = work.step_ms or 1.0
    labels = {row.module_path: row.label for row in costs.rows if row.module_path is not None}
    groups = len(work.module_paths)
    grouped = work.module_group >= 0
    group_us = np.bincount(work.module_group[grouped], weights=work.dur_us[grouped], minlength=groups)
    # Each group's largest class: one (group, class) table.
    pair = work.module_group[grouped] * len(CLASSES) + work.kernel_class[grouped]
    by_class = np.bincount(pair, weights=work.dur_us[grouped], minlength=groups * len(CLASSES))
    top_class = by_class.reshape(groups, len(CLASSES)).argmax(axis=1)
    rates = _Throughput.of(work, work.module_group, groups)
    flops_shown, bytes_shown = rates.shown(thresholds)
    out = []
    for group in np.argsort(-group_us, kind="stable")[:MODULE_TABLE_ROWS].tolist():
        if group_us[group] <= 0:
            continue
        path = work.module_paths[group]
        gpu_ms = float(group_us[group]) / 1e3 / steps
        out.append(
            ModuleRow(
                module=labels.get(path, path.rsplit("/", 1)[-1]),
                path=path,
                gpu_ms_per_step=round(gpu_ms, 4),
                step_pct=round(100.0 * gpu_ms / step_ms, 2),
                top_class=CLASSES[int(top_class[group])].label,
                achieved_tflops=_figure(rates.tflops[group], 2) if flops_shown[group] else None,
                flops_peak_pct=_figure(rates.flops_peak_pct[group], 1) if flops_shown[group] else None,
                achieved_tb_s=_figure(rates.tb_s[group], 3) if bytes_shown[group] else None,
                bytes_peak_pct=_figure(rates.bytes_peak_pct[group], 1) if bytes_shown[group] else None,
            )
        )
    return out
