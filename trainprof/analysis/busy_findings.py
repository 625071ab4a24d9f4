"""Findings on GPU-busy waste: GPU time the step spends on work a known fix does faster, each with
the GPU ms per step at stake, the fix, and the gain predicted from the device's measured (or listed)
throughputs (`trainprof.analysis.peaks`). Shares and severities are of the step as the GPU runs it
(`busy.py`'s step time: a host that runs ahead does not shrink it).

- `gemm_precision`: GEMMs in fp32 without TF32. At the dtype a fix gives, the same GEMMs take
  max(t * peak_fp32 / peak_new, FLOPs / peak_new): they keep their efficiency against the peak
  (at most 100%). Fixes: bf16 autocast (fp16 and a GradScaler on a GPU without bf16), or TF32.
- `unfused_attention`: attention as matmul + softmax (+ mask, dropout, casts) over [.., T, T] score
  matrices (eager attention, SDPA's math fallback). A fused kernel does the same FLOPs at the best
  rate a fused attention call site of the trace measured, else at `FUSED_ATTENTION_PEAK_SHARE` of
  the 16-bit peak. The math fallback gets the reasons the trace shows.
- `fusible_layers`: what `fused_layers.swap(model)` would replace, and its predicted saving
  (`trainprof.analysis.fusion`).
- `memory_bound_kernels`: memory-bound kernels (norms, elementwise, copies) outside what swap
  replaces, in modules that move their bytes at under `memory_bound_max_bandwidth_share` of the
  copy bandwidth: at stake, their time above their bytes at the copy bandwidth (torch.compile fuses
  them, which saves more: fewer bytes).
- `gemm_shape`: GEMMs with a dim not 16-byte aligned (a vocabulary of 50,257) or skinny (fewer than
  `SKINNY_GEMM_ROWS` rows or columns) running at under `gemm_shape_max_rate_share` of the rate of
  the trace's well-shaped GEMMs of their dtype: at stake, their time above that rate.
- `attention_choice`: an SDPA call site given an explicit mask over [T, T] scores with is_causal
  False, where a causal mask is `is_causal=True` (the kernel then skips the masked half of the
  scores and reads no mask): at stake, its time above the same FLOPs at the measured rate of a
  causal call of the same shapes in the trace, else above the causal half of the scores at its own
  measured rate, plus the mask's preparation inside SDPA; and a call site on a slower backend where
  the trace measured a faster one on the same shapes (`attention.attention_sites`).
- `recomputation`: the forward recomputed in backward by activation checkpointing (`recompute`):
  at stake, its measured time, all of it where the memory it saves fits the headroom the trace
  shows (or is not recorded), else the share of its segments (layers) that fit.
- `copies_and_casts`: the copy-and-cast kernels a fix removes, by maker (`copies`), outside what swap
  replaces: autocast's weight casts repeated per micro-batch (at stake: all but one of each weight's
  k casts a step, (1 - 1/k) of their time), the model's own dtype casts and their gradients, a
  torch.cat onto an empty cache, `.contiguous()` copies (their measured time).

Each is made when its gain is at least `busy_finding_min_step_share` of the step; its severity is
`severity.severity_for` of that gain. No peaks for the device: no prediction, no finding.
"""

from __future__ import annotations

import math

import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.attention import AttentionSite
from trainprof.analysis.busy import BusyBreakdown, KernelWork
from trainprof.analysis.copies import COPY_KINDS, KINDS, CopyKernels
from trainprof.analysis.fusion import SwapPrediction
from trainprof.analysis.kernel_classes import GEMM_CLASSES, SDPA_MATH_OP, KernelClass, Work
from trainprof.analysis.kinds import FindingKind
from trainprof.analysis.modules import OwnerCosts
from trainprof.analysis.peaks import MATH_DTYPES
from trainprof.analysis.recompute import Recomputation
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.thresholds import TOP_ROWS, Thresholds
from trainprof.trace import Trace

FUSED_ATTENTION_PEAK_SHARE = 0.4
"""The rate a fused attention kernel reaches, as a share of the 16-bit matmul peak, FLOPs counted as
torch counts them: cuDNN's SDPA ran GPT-2's attention (B4 H12 T2048 D64, causal, bf16) at 323
TFLOP/s, 40% of the H200's 804 (tests/fixtures/busy/gpt2_attention/sdpa, 2026-11-25)."""
SKINNY_GEMM_ROWS = 64
"""A GEMM with fewer rows or columns than this (tokens per call in decoding, a small batch) cannot
fill the tensor cores' tiles: it reads its weights for little arithmetic."""
ALIGNMENT_BYTES = 16
"""cuBLAS's fast GEMM kernels need every dim's rows 16-byte aligned (8 bf16 elements); others run
`*_align1` kernels (GPT-2's 50,257-token head: 96 TFLOP/s against 718 for its other GEMMs, H200)."""
PAD_MULTIPLE = 64
"""What an unaligned dim is padded to: aligned for every dtype, and whole tiles."""
KERNEL_FLOOR_US = 2.5
"""The shortest a kernel runs on current GPUs, however little it moves (an empty kernel: ~2 µs on an
H200): a kernel's time above its bytes at the copy bandwidth counts from here."""
_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class Prediction(Record, frozen=True):
    """One fix's predicted effect: the math dtype it gives the GEMMs, their GPU ms per step before
    and after, and the step time it leads to."""

    fix: str
    dtype: str
    gpu_ms_per_step: float
    predicted_gpu_ms_per_step: float
    saved_ms_per_step: float
    predicted_step_ms: float


class PrecisionDetails(Record, frozen=True):
    """The fp32-GEMM finding's evidence: their GPU time, FLOPs and rate per step, and each fix's
    prediction (`predictions`, best first), against `peaks` (which source)."""

    gemm_ms_per_step: float
    gemm_tflop_per_step: float | None
    achieved_tflops: float | None
    step_ms: float
    predictions: list[Prediction]
    peaks: str


class AttentionDetails(Record, frozen=True):
    """The unfused-attention finding's evidence: the unfused kernels' GPU time and FLOPs per step,
    a score matrix's shape, the modules, the fused kernel's predicted time and rate, SDPA math
    fallback calls per step and the reasons the trace shows for them."""

    unfused_ms_per_step: float
    attention_tflop_per_step: float
    score_shape: list[int] | None
    modules: list[str]
    fused_ms_per_step: float
    fused_tflops: float
    sdpa_math_calls_per_step: float
    fallback_reasons: list[str]
    step_ms: float
    predicted_step_ms: float
    peaks: str


class FusionDetails(Record, frozen=True):
    """The fusible-layers finding's evidence: swap's prediction (`trainprof.analysis.fusion`)."""

    swap: SwapPrediction
    step_ms: float
    predicted_step_ms: float
    peaks: str


class MemoryBoundModule(Record, frozen=True):
    """A module's memory-bound kernels: GPU ms per step, bytes moved, rate against the copy
    bandwidth, and what they would take at it (`KERNEL_FLOOR_US` at least a kernel)."""

    module: str
    gpu_ms_per_step: float
    gbyte_per_step: float
    achieved_tb_s: float
    bandwidth_pct: float
    floor_ms_per_step: float


class MemoryBoundDetails(Record, frozen=True):
    """The memory-bound finding's evidence: the slow modules, most time at stake first (their time
    less `floor_ms_per_step`: their bytes at the copy bandwidth, at least `KERNEL_FLOOR_US` a kernel)."""

    modules: list[MemoryBoundModule]
    copy_tb_s: float
    step_ms: float
    peaks: str


class GemmShape(Record, frozen=True):
    """One slow GEMM shape: its op, (batch, M, N, K), dtype, calls and GPU ms per step, rate, the
    reference rate, and why it is slow (`unaligned` dims, `skinny`)."""

    op: str
    batch: int
    m: int
    n: int
    k: int
    dtype: str
    calls_per_step: float
    gpu_ms_per_step: float
    achieved_tflops: float
    reference_tflops: float
    unaligned: list[int]
    skinny: bool
    module: str | None


class GemmShapeDetails(Record, frozen=True):
    """The GEMM-shape finding's evidence: the slow shapes, most time at stake first."""

    shapes: list[GemmShape]
    step_ms: float
    peaks: str


def busy_findings(
    trace: Trace,
    work: KernelWork,
    breakdown: BusyBreakdown,
    swap: SwapPrediction | None,
    swapped: np.ndarray,
    costs: OwnerCosts,
    rank: int | None,
    limits: Thresholds,
    copies: CopyKernels | None = None,
    sites: list[AttentionSite] | None = None,
    recompute: tuple[Recomputation | None, np.ndarray] | None = None,
) -> list[Finding]:
    """Every finding on GPU-busy waste for one trace (module docstring); `swapped`: per kernel of
    `work`, whether swap would replace it; `copies`: the copy kernels' makers (`copies`); `sites`:
    the attention call sites (`attention`); `recompute`: the recomputed forward and its kernels."""
    if work.peaks is None or not len(work.rows) or work.step_ms <= 0:
        return []
    context = _Context(trace, work, costs, rank, limits)
    found = [
        _precision(context),
        _attention(context, sites or []),
        _attention_choice(context, sites or []),
        _fusion(context, swap, swapped),
        _memory_bound(context, swapped),
        _gemm_shapes(context),
        _copies(context, copies, swapped) if copies is not None else None,
        _recomputation(context, *recompute) if recompute is not None and recompute[0] is not None else None,
    ]
    return [finding for finding in found if finding is not None]


class _Context:
    """What every rule reads: the trace, its kernels' work, owners' labels, and the cut-offs."""

    def __init__(
        self, trace: Trace, work: KernelWork, costs: OwnerCosts, rank: int | None, limits: Thresholds
    ):
        self.trace, self.work, self.rank, self.limits = trace, work, rank, limits
        self.owners = {row.module_path: row for row in costs.rows if row.module_path is not None}
        self.steps = max(work.steps, 1)
        self.peaks_label = work.peaks.label if work.peaks is not None else ""

    def share(self, ms: float) -> str:
        """`ms` as a share of the step: `42%`."""
        return f"{100 * ms / self.work.step_ms:.0f}%"

    def worth(self, saved_ms: float) -> bool:
        return saved_ms >= self.limits.busy_finding_min_step_share * self.work.step_ms

    def label(self, group: int) -> str:
        """Module group `group`'s label: its owner's, else the last part of its class path."""
        path = self.work.module_paths[group]
        owner = self.owners.get(path)
        return owner.label if owner is not None else path.rsplit("/", 1)[-1]

    def _module_us(self, mask: np.ndarray) -> np.ndarray:
        """GPU µs of the kernels in `mask` per module group (empty when none has a module)."""
        groups = self.work.module_group[mask]
        keep = groups >= 0
        return np.bincount(groups[keep], weights=self.work.dur_us[mask][keep])

    def module_of(self, mask: np.ndarray) -> tuple[str | None, Where]:
        """The module (class path) holding most of the GPU time of the kernels in `mask`: its label and
        its `forward`'s place."""
        total = self._module_us(mask)
        if not len(total):
            return None, Where()
        group = int(total.argmax())
        owner = self.owners.get(self.work.module_paths[group])
        label = self.label(group)
        return label, Where(
            file=owner.file if owner else None, line=owner.line if owner else None, function=label
        )

    def labels_of(self, mask: np.ndarray) -> list[str]:
        """The modules holding the kernels in `mask`, most GPU time first."""
        total = self._module_us(mask)
        return [self.label(int(g)) for g in np.argsort(-total, kind="stable") if total[g] > 0]

    def finding(
        self,
        kind: FindingKind,
        title: str,
        saved_ms: float,
        mask: np.ndarray,
        fix: str,
        where: Where,
        details: Record,
        op: str | None = None,
        cause: str | None = None,
    ) -> Finding:
        count = int(mask.sum())
        return Finding(
            kind=kind,
            title=title,
            severity=severity_for(saved_ms, self.work.step_ms, self.limits),
            op=op,
            where=where,
            count=count,
            per_step=round(count / self.steps, 2),
            cost_ms=round(saved_ms * self.steps, 4),
            fix=fix,
            rank=self.rank,
            details=details,
            cause=cause,
            gpu_ms_per_step=round(saved_ms, 4),
        )


def _precision(context: _Context) -> Finding | None:
    work = context.work
    fp32 = work.of_class(KernelClass.GEMM_FP32)
    fp32_peak = work.peak_of("fp32")
    if not fp32.any() or not fp32_peak:
        return None
    gemm_ms = work.per_step_ms(fp32)
    flops = float(work.flops[fp32].sum()) / context.steps
    low = "bf16" if work.peak_of("bf16") else "fp16"
    fixes = []
    if work.peak_of(low):
        autocast = (
            f'torch.autocast("cuda", dtype=torch.{"bfloat16" if low == "bf16" else "float16"})'
            f" around the forward and loss{'' if low == 'bf16' else ' with a torch.amp.GradScaler'}"
        )
        fixes.append((autocast, low))
    if work.peak_of("tf32"):
        fixes.append(('torch.set_float32_matmul_precision("high") (TF32, one line)', "tf32"))
    predictions = []
    for text, dtype in fixes:
        peak = work.peak_of(dtype)
        new_ms = max(gemm_ms * fp32_peak / peak, flops / peak * 1e3)
        saved = gemm_ms - new_ms
        predictions.append(
            Prediction(
                text,
                dtype,
                round(gemm_ms, 4),
                round(new_ms, 4),
                round(saved, 4),
                round(work.step_ms - saved, 4),
            )
        )
    predictions.sort(key=lambda p: -p.saved_ms_per_step)
    if not predictions or not context.worth(predictions[0].saved_ms_per_step):
        return None
    best = predictions[0]
    module, where = context.module_of(fp32)
    rate = flops / gemm_ms / 1e9 if flops > 0 else None
    fix = "; or ".join(
        f"{p.fix}: step {work.step_ms:.1f} -> ~{p.predicted_step_ms:.1f} ms" for p in predictions
    )
    return context.finding(
        "gemm_precision",
        f"GEMMs run in fp32 without tensor cores: {gemm_ms:.1f} ms/step ({context.share(gemm_ms)} of the "
        f"step){_in(module)}; in {best.dtype} they would take ~{best.predicted_gpu_ms_per_step:.1f} ms",
        best.saved_ms_per_step,
        fp32,
        fix,
        where,
        PrecisionDetails(
            gemm_ms_per_step=round(gemm_ms, 4),
            gemm_tflop_per_step=round(flops / 1e12, 4) if flops > 0 else None,
            achieved_tflops=round(rate, 2) if rate else None,
            step_ms=round(work.step_ms, 4),
            predictions=predictions,
            peaks=context.peaks_label,
        ),
        cause="fp32 matrix products (TF32 off, no autocast)",
    )


def _attention(context: _Context, sites: list[AttentionSite]) -> Finding | None:
    work, trace = context.work, context.trace
    unfused = work.of_class(KernelClass.ATTENTION_UNFUSED)
    if not unfused.any():
        return None
    flops = float(work.flops[unfused].sum()) / context.steps
    with_flops = unfused & (work.flops > 0) & (work.dtype >= 0)
    dtype = (
        MATH_DTYPES[
            int(np.bincount(work.dtype[with_flops].astype(np.int64), weights=work.flops[with_flops]).argmax())
        ]
        if with_flops.any()
        else "bf16"
    )
    target = dtype if dtype in ("bf16", "fp16") else ("bf16" if work.peak_of("bf16") else "fp16")
    peak = work.peak_of(target)
    if not peak or flops <= 0:
        return None
    unfused_ms = work.per_step_ms(unfused)
    # A fused kernel's rate: the best this trace measured (a fused call site elsewhere), else the share
    # of the peak cuDNN's SDPA reached on the H200.
    measured = [s.achieved_tflops * 1e12 for s in sites if s.achieved_tflops and s.dtype == target]
    fused_rate = max(measured) if measured else FUSED_ATTENTION_PEAK_SHARE * peak
    fused_ms = flops / fused_rate * 1e3
    saved = unfused_ms - fused_ms
    if not context.worth(saved):
        return None
    math_rows = _sdpa_math_ops(trace, work, unfused)
    reasons = _fallback_reasons(trace, math_rows, dtype)
    module, where = context.module_of(unfused)
    score_shape = next((list(shape) for shape in _score_shapes(work, unfused)), None)
    if math_rows.size:
        title = (
            f"SDPA ran its math fallback (unfused attention): {unfused_ms:.1f} ms/step "
            f"({context.share(unfused_ms)} of the step); a fused kernel would take ~{fused_ms:.1f} ms"
        )
        fix = "Let SDPA pick a fused kernel: " + "; ".join(reasons)
        cause = "scaled_dot_product_attention fell back to its math implementation"
    else:
        title = (
            f"Unfused attention{_in(module)}: matmul + softmax over {_shape_text(score_shape)} score "
            f"matrices, {unfused_ms:.1f} ms/step ({context.share(unfused_ms)} of the step); a fused kernel "
            f"would take ~{fused_ms:.1f} ms"
        )
        hugging_face = where.file is not None and "transformers/" in where.file
        how = (
            'Load the model with attn_implementation="sdpa" (or "flash_attention_2")'
            if hugging_face
            else "Compute attention with torch.nn.functional.scaled_dot_product_attention(q, k, v, "
            "is_causal=True)"
        )
        fix = (
            f"{how}: step {work.step_ms:.1f} -> ~{work.step_ms - saved:.1f} ms (flash/cuDNN kernels, no "
            "[T, T] matrix in memory)"
        )
        cause = "attention computed as separate matmul, softmax, mask and dropout kernels"
    return context.finding(
        "unfused_attention",
        title,
        saved,
        unfused,
        fix,
        where,
        AttentionDetails(
            unfused_ms_per_step=round(unfused_ms, 4),
            attention_tflop_per_step=round(flops / 1e12, 4),
            score_shape=score_shape,
            modules=context.labels_of(unfused)[:TOP_ROWS],
            fused_ms_per_step=round(fused_ms, 4),
            fused_tflops=round(fused_rate / 1e12, 1),
            sdpa_math_calls_per_step=round(math_rows.size / context.steps, 2),
            fallback_reasons=reasons,
            step_ms=round(work.step_ms, 4),
            predicted_step_ms=round(work.step_ms - saved, 4),
            peaks=context.peaks_label,
        ),
        op=SDPA_MATH_OP if math_rows.size else None,
        cause=cause,
    )


def _in(module: str | None) -> str:
    return f" in {module}" if module else ""


def _sdpa_math_ops(trace: Trace, work: KernelWork, mask: np.ndarray) -> np.ndarray:
    """The cpu_op rows of the SDPA math-fallback calls the kernels in `mask` ran under."""
    math_id = trace.name_id(SDPA_MATH_OP)
    rows = work.attention_op[mask]
    rows = rows[rows >= 0]
    if math_id < 0 or not rows.size:
        return np.zeros(0, dtype=np.int64)
    rows = distinct(rows)
    return rows[trace.events["cpu_op"].name[rows] == math_id]


def _fallback_reasons(trace: Trace, math_rows: np.ndarray, dtype: str) -> list[str]:
    """Why SDPA could not run a fused kernel, as far as its math call's recorded inputs show
    (query, key, value, attn_mask, ...)."""
    if not math_rows.size or trace.op_inputs is None:
        return []
    slots = trace.events["cpu_op"].inputs[math_rows[:1]]
    (dims,), (types,) = trace.op_inputs.decode(slots)
    reasons = []
    query = dims[0] if dims and isinstance(dims[0], list) and dims[0] else None
    if (types and types[0] == "float") or dtype == "fp32":
        reasons.append(
            "its inputs are fp32: the flash and cuDNN kernels take fp16/bf16 (run it under torch.autocast)"
        )
    if dims and len(dims) > 3 and isinstance(dims[3], list) and dims[3]:
        reasons.append(
            f"an explicit attn_mask {dims[3]}: the flash kernel takes none (pass is_causal=True "
            "for a causal mask), the memory-efficient one needs it in the query's dtype"
        )
    if query and (query[-1] > 256 or query[-1] % 8):
        reasons.append(f"head dim {query[-1]}: the fused kernels take a multiple of 8, at most 256")
    if not reasons:
        reasons.append(
            "the trace does not show why: run one step under torch.nn.attention.sdpa_kernel("
            "SDPBackend.FLASH_ATTENTION) and torch warns with the reason"
        )
    return reasons


def _score_shapes(work: KernelWork, mask: np.ndarray):
    """The [.., T, T] inputs of the ops of the kernels in `mask`, first seen first."""
    for signature in dict.fromkeys(work.signature[mask].tolist()):
        if signature < 0:
            continue
        first = work.works[signature].first_input
        if first is not None and len(first[0]) >= 3 and first[0][-1] == first[0][-2]:
            yield first[0]


def _shape_text(shape: list[int] | None) -> str:
    return "[.., T, T]" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _fusion(context: _Context, swap: SwapPrediction | None, swapped: np.ndarray) -> Finding | None:
    if swap is None or not context.worth(swap.saved_ms_per_step):
        return None
    work = context.work
    saved = swap.saved_ms_per_step
    replaced = ", ".join(f"{'/'.join(row.modules)} x{row.instances}" for row in swap.rows)
    words = list(dict.fromkeys(_OP_WORDS[row.op] for row in swap.rows))
    what = " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]
    step = work.step_ms
    return context.finding(
        "fusible_layers",
        f"Unfused {what}: {swap.replaced_ms_per_step:.1f} ms/step of kernels fused_layers.swap replaces "
        f"({replaced}); fused they would take ~{swap.fused_ms_per_step:.1f} ms",
        saved,
        swapped,
        f"fused_layers.swap(model) after building the model: step {step:.1f} -> ~{step - saved:.1f} ms "
        "(or torch.compile(model), which fuses them too)",
        context.module_of(swapped)[1],
        FusionDetails(
            swap=swap,
            step_ms=round(step, 4),
            predicted_step_ms=round(step - saved, 4),
            peaks=context.peaks_label,
        ),
        cause="norms, activations and rotary embeddings run as chains of small memory-bound kernels",
    )


_OP_WORDS = {
    "layer_norm": "norms",
    "rms_norm": "norms",
    "gelu": "activations",
    "gated_mlp": "gated MLPs",
    "rope": "rotary embeddings",
}


def _memory_bound(context: _Context, swapped: np.ndarray) -> Finding | None:
    work = context.work
    copy = work.peaks.bytes_per_s if work.peaks is not None else None
    if not copy or not work.module_paths:
        return None
    memory = (
        work.of_class(KernelClass.NORM, KernelClass.ELEMENTWISE, KernelClass.COPY)
        & ~swapped
        & (work.module_group >= 0)
    )
    known = memory & work.carries(Work.BYTES)
    groups = len(work.module_paths)
    group_us = np.bincount(work.module_group[known], weights=work.dur_us[known], minlength=groups)
    group_bytes = np.bincount(work.module_group[known], weights=work.bytes[known], minlength=groups)
    # What the kernels would take at the copy bandwidth: their bytes, and at least the floor each.
    floor = np.maximum(work.bytes / copy * 1e6, KERNEL_FLOOR_US)
    group_floor = np.bincount(
        work.module_group[known], weights=np.minimum(floor, work.dur_us)[known], minlength=groups
    )
    rows = []
    for group in np.flatnonzero(group_us > 0).tolist():
        rate = float(group_bytes[group] / group_us[group] * 1e6)
        if rate >= context.limits.memory_bound_max_bandwidth_share * copy:
            continue
        floor_us = float(group_floor[group])
        rows.append(
            MemoryBoundModule(
                module=context.label(group),
                gpu_ms_per_step=round(float(group_us[group]) / 1e3 / context.steps, 4),
                gbyte_per_step=round(float(group_bytes[group]) / 1e9 / context.steps, 4),
                achieved_tb_s=round(rate / 1e12, 3),
                bandwidth_pct=round(100.0 * rate / copy, 1),
                floor_ms_per_step=round(floor_us / 1e3 / context.steps, 4),
            )
        )
    saved = sum(row.gpu_ms_per_step - row.floor_ms_per_step for row in rows)
    if not rows or not context.worth(saved):
        return None
    rows.sort(key=lambda row: -(row.gpu_ms_per_step - row.floor_ms_per_step))
    slow = {row.module for row in rows}
    slow_group = np.asarray([context.label(g) in slow for g in range(groups)] + [False])
    mask = known & slow_group[work.module_group]
    module, where = context.module_of(mask)
    return context.finding(
        "memory_bound_kernels",
        f"Memory-bound kernels below the copy bandwidth in {', '.join(r.module for r in rows[:3])}: "
        f"{sum(r.gpu_ms_per_step for r in rows):.1f} ms/step at {rows[0].bandwidth_pct:.0f}% of "
        f"{copy / 1e12:.2f} TB/s (at least {saved:.1f} ms/step above what their bytes take)",
        saved,
        mask,
        "torch.compile(model) fuses these chains of norms, casts and elementwise ops into fewer kernels "
        "that read and write each tensor once",
        where,
        MemoryBoundDetails(
            modules=rows[:TOP_ROWS],
            copy_tb_s=round(copy / 1e12, 3),
            step_ms=round(work.step_ms, 4),
            peaks=context.peaks_label,
        ),
        cause="chains of small memory-bound kernels moving their bytes slowly",
    )


def _gemm_shapes(context: _Context) -> Finding | None:
    work, trace = context.work, context.trace
    gemm = work.of_class(*GEMM_CLASSES) & (work.signature >= 0) & work.carries(Work.FLOPS)
    if not gemm.any():
        return None
    signatures, of_kernel = np.unique(work.signature[gemm], return_inverse=True)
    sig_us = np.bincount(of_kernel, weights=work.dur_us[gemm])
    sig_flops = np.bincount(of_kernel, weights=work.flops[gemm])
    sig_calls = np.bincount(of_kernel, weights=(work.flops[gemm] > 0).astype(float))
    dtype_of = np.full(len(signatures), -1, dtype=np.int64)
    dtype_of[of_kernel] = work.dtype[gemm]
    shapes = []
    for index, signature in enumerate(signatures.tolist()):
        shape = work.works[signature].gemm
        dtype = MATH_DTYPES[dtype_of[index]] if dtype_of[index] >= 0 else None
        if shape is None or dtype is None or sig_flops[index] <= 0 or sig_us[index] <= 0:
            continue  # no shape, no FLOPs or no time (a kernel of zero duration): no rate to judge
        batch, m, n, k = shape
        unaligned = [d for d in (m, n, k) if (d * _ELEMENT_BYTES[dtype]) % ALIGNMENT_BYTES]
        skinny = min(m, n) < SKINNY_GEMM_ROWS
        shapes.append((index, signature, dtype, shape, unaligned, skinny))
    # The reference: the rate of the trace's well-shaped GEMMs of the dtype (none: no finding for it).
    reference: dict[str, float] = {}
    for dtype in {s[2] for s in shapes}:
        healthy = [s[0] for s in shapes if s[2] == dtype and not s[4] and not s[5]]
        flops, us = sig_flops[healthy].sum(), sig_us[healthy].sum()
        peak = work.peak_of(dtype)
        if us > 0 and flops > 0:
            reference[dtype] = min(flops / us * 1e6, peak) if peak else flops / us * 1e6
    slow = []
    for index, signature, dtype, shape, unaligned, skinny in shapes:
        rate = float(sig_flops[index] / sig_us[index] * 1e6)
        ref = float(reference.get(dtype, 0.0))
        if not (unaligned or skinny) or not ref or rate >= context.limits.gemm_shape_max_rate_share * ref:
            continue
        at_stake_us = sig_us[index] - sig_flops[index] / ref * 1e6
        mask = gemm & (work.signature == signature)
        batch, m, n, k = shape
        slow.append(
            (
                at_stake_us,
                GemmShape(
                    op=trace.names[int(trace.events["cpu_op"].name[work.op[np.flatnonzero(mask)[0]]])],
                    batch=batch,
                    m=m,
                    n=n,
                    k=k,
                    dtype=dtype,
                    calls_per_step=round(float(sig_calls[index]) / context.steps, 2),
                    gpu_ms_per_step=round(float(sig_us[index]) / 1e3 / context.steps, 4),
                    achieved_tflops=round(rate / 1e12, 2),
                    reference_tflops=round(ref / 1e12, 2),
                    unaligned=unaligned,
                    skinny=skinny,
                    module=context.module_of(mask)[0],
                ),
                mask,
            )
        )
    saved = sum(us for us, _, _ in slow) / 1e3 / context.steps
    if not slow or not context.worth(saved):
        return None
    slow.sort(key=lambda item: -item[0])
    mask = np.logical_or.reduce([m for _, _, m in slow])
    top = slow[0][1]
    module, where = context.module_of(mask)
    return context.finding(
        "gemm_shape",
        f"Slow GEMM shapes{_in(module)}: {top.op} ({top.m} x {top.k}) @ ({top.k} x {top.n}) at "
        f"{top.achieved_tflops:.0f} TFLOP/s against {top.reference_tflops:.0f} for the other {top.dtype} "
        f"GEMMs; {saved:.1f} ms/step at stake",
        saved,
        mask,
        _shape_fix(slow[0][1]),
        where,
        GemmShapeDetails(
            shapes=[s for _, s, _ in slow[:TOP_ROWS]],
            step_ms=round(context.work.step_ms, 4),
            peaks=context.peaks_label,
        ),
        op=top.op,
        cause="GEMM dims that are not 16-byte aligned or too small for the tensor cores' tiles",
    )


def _shape_fix(shape: GemmShape) -> str:
    parts = []
    for dim in dict.fromkeys(shape.unaligned):
        padded = math.ceil(dim / PAD_MULTIPLE) * PAD_MULTIPLE
        parts.append(
            f"pad the {dim:,}-wide dimension to {padded:,} (a multiple of {PAD_MULTIPLE}; a vocabulary: "
            f"model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={PAD_MULTIPLE}))"
        )
    if shape.skinny:
        parts.append(
            f"give each call more rows ({min(shape.m, shape.n)} now): a larger batch, or fewer, larger calls"
        )
    return "; ".join(parts)


class CopyGain(Record, frozen=True):
    """One kind of copy a fix removes: its GPU ms per step, what the fix saves, where most of it is
    made (`copies.CopyRow`'s op chain, module, user line) and the fix."""

    kind: str
    label: str
    gpu_ms_per_step: float
    saved_ms_per_step: float
    op_chain: str | None
    module: str | None
    user_line: str | None
    fix: str


class CopiesDetails(Record, frozen=True):
    """The copies-and-casts finding's evidence: the copy class's GPU ms per step, forward passes per
    step (each weight's casts a step), the removable kinds, the step before and after."""

    copy_ms_per_step: float
    forward_passes_per_step: float | None
    removable: list[CopyGain]
    step_ms: float
    predicted_step_ms: float
    peaks: str


def _copies(context: _Context, copies: CopyKernels, swapped: np.ndarray) -> Finding | None:
    """Copies a fix removes (module docstring): the kinds with a fix, outside what swap replaces; the
    gain is their measured time, all but one in k of autocast's weight casts."""
    work = context.work
    if copies.breakdown is None:
        return None
    rows = {row.kind: row for row in copies.breakdown.rows}
    passes = copies.forward_passes or 1.0
    gains, masks = [], []
    for index, kind in enumerate(COPY_KINDS):
        if kind.fix is None or kind.key not in rows:
            continue
        mask = (copies.kind == index) & ~swapped
        ms = work.per_step_ms(mask)
        share = 1.0 - 1.0 / passes if kind.key == "autocast_weight_cast" else 1.0
        if ms <= 0 or share <= 0:
            continue
        row = rows[kind.key]
        gains.append(CopyGain(kind.key, kind.label, round(ms, 4), round(ms * share, 4), row.op_chain,
                              row.module, row.user_line, kind.fix))
        masks.append(mask)
    saved = sum(gain.saved_ms_per_step for gain in gains)
    if not gains or not context.worth(saved):
        return None
    gains.sort(key=lambda gain: -gain.saved_ms_per_step)
    mask = np.logical_or.reduce(masks)
    module, where = context.module_of(mask)
    total = copies.breakdown.gpu_ms_per_step
    parts = "; ".join(
        f"{KINDS[gain.kind].label.split(' (')[0]} {gain.saved_ms_per_step:.1f} ms"
        + (f" in {gain.module}" if gain.module else "")
        for gain in gains
    )
    weights = any(gain.kind == "autocast_weight_cast" for gain in gains)
    repeated = f" (each weight cast {passes:g} times a step)" if weights else ""
    fix = " ".join(f"{i}) {gain.fix}" for i, gain in enumerate(gains, 1))
    step = work.step_ms
    return context.finding(
        "copies_and_casts",
        f"Copies and casts: {total:.1f} ms/step ({context.share(total)} of the step), {saved:.1f} ms of it "
        f"removable: {parts}{repeated}",
        saved,
        mask,
        f"{fix} Step {step:.1f} -> ~{step - saved:.1f} ms.",
        where,
        CopiesDetails(
            copy_ms_per_step=round(total, 4),
            forward_passes_per_step=copies.forward_passes,
            removable=gains,
            step_ms=round(step, 4),
            predicted_step_ms=round(step - saved, 4),
            peaks=context.peaks_label,
        ),
        cause="copy and cast kernels that no computation needs: repeated, round-trip or layout-only copies",
    )


class AttentionChoice(Record, frozen=True):
    """One call site's better attention: the site, its GPU ms per step, the predicted ms after the
    fix, how the prediction was made (`basis`), and the fix."""

    site: AttentionSite
    gpu_ms_per_step: float
    predicted_ms_per_step: float
    saved_ms_per_step: float
    basis: str
    fix: str


class AttentionChoiceDetails(Record, frozen=True):
    """The attention-choice finding's evidence: the call sites it would change, the step before and
    after."""

    choices: list[AttentionChoice]
    step_ms: float
    predicted_step_ms: float
    peaks: str


CAUSAL_FIX = (
    "If the mask is causal, pass is_causal=True and no attn_mask: "
    "F.scaled_dot_product_attention(q, k, v, is_causal=True); the kernel then skips the masked half "
    "of the scores and reads no [T, T] mask (a Hugging Face model builds none for an unpadded batch "
    "when called without attention_mask)."
)


def _attention_choice(context: _Context, sites: list[AttentionSite]) -> Finding | None:
    """Call sites with a faster attention in reach (module docstring), each predicted from the
    measured rates of this trace's attention kernels."""
    work = context.work
    choices = []
    for site in sites:
        choice = _causal_choice(site, sites) or _backend_choice(site, sites)
        if choice is not None and choice.saved_ms_per_step > 0:
            choices.append(choice)
    saved = sum(choice.saved_ms_per_step for choice in choices)
    if not choices or not context.worth(saved):
        return None
    choices.sort(key=lambda choice: -choice.saved_ms_per_step)
    top = choices[0]
    groups = {choice.site.module_group for choice in choices}
    mask = work.of_class(*ATTENTION_FUSED_CLASSES) & np.isin(work.module_group, list(groups))
    module, where = context.module_of(mask)
    site = top.site
    what = (
        f"an explicit {_shape_text(site.mask_shape)} {site.mask_dtype or ''} mask with is_causal=False"
        if top.basis != "faster backend"
        else f"the {site.backend} kernel"
    )
    step = work.step_ms
    return context.finding(
        "attention_choice",
        f"Attention{_in(site.module)} gets {what}: {site.backend} runs {site.gpu_ms_per_step:.1f} ms/step "
        f"({context.share(site.gpu_ms_per_step)} of the step); ~{top.predicted_ms_per_step:.1f} ms with "
        "the fix",
        saved,
        mask,
        " ".join(dict.fromkeys(choice.fix for choice in choices))
        + f" Step {step:.1f} -> ~{step - saved:.1f} ms.",
        where,
        AttentionChoiceDetails(
            choices=choices, step_ms=round(step, 4), predicted_step_ms=round(step - saved, 4),
            peaks=context.peaks_label,
        ),
        op="aten::scaled_dot_product_attention",
        cause="scaled_dot_product_attention given inputs that keep it off its fastest path",
    )


ATTENTION_FUSED_CLASSES = (
    KernelClass.ATTENTION_FLASH,
    KernelClass.ATTENTION_MEM_EFFICIENT,
    KernelClass.ATTENTION_CUDNN,
    KernelClass.ATTENTION_FUSED,
)


def _same_shapes(a: AttentionSite, b: AttentionSite) -> bool:
    return a.query_shape == b.query_shape and a.key_shape == b.key_shape and a.dtype == b.dtype


def _causal_choice(site: AttentionSite, sites: list[AttentionSite]) -> AttentionChoice | None:
    """A site with an explicit [T, T] mask and is_causal False: with is_causal=True its kernel does
    the same FLOPs (as torch counts them) at the rate of a causal site of the same shapes in the
    trace; without one, it computes the causal share of the scores, (T + 1) / 2T, at its own rate.
    The mask's preparation inside SDPA goes too."""
    if not site.square_mask or site.is_causal or not site.gpu_ms_per_step:
        return None
    causal = [
        s for s in sites if s is not site and s.is_causal and s.mask_shape is None and _same_shapes(s, site)
        and s.achieved_tflops
    ]
    if causal and site.tflop_per_step:
        best = max(causal, key=lambda s: s.achieved_tflops)
        new_ms = site.tflop_per_step / best.achieved_tflops * 1e3
        basis = (
            f"a causal call of the same shapes measured at {best.achieved_tflops:.0f} TFLOP/s ({best.module})"
        )
    else:
        length = site.query_shape[-2]
        new_ms = site.gpu_ms_per_step * (length + 1) / (2 * length)
        basis = "the causal half of the scores at this call's own measured rate"
    saved = site.gpu_ms_per_step - new_ms + site.prep_ms_per_step
    return AttentionChoice(site, site.gpu_ms_per_step, round(new_ms, 4), round(saved, 4), basis, CAUSAL_FIX)


def _backend_choice(site: AttentionSite, sites: list[AttentionSite]) -> AttentionChoice | None:
    """A site on a slower backend (`site.why_not` says why) where the trace measured a faster
    backend on the same shapes: its FLOPs at that rate."""
    if not site.why_not or not site.tflop_per_step or not site.achieved_tflops:
        return None
    faster = [
        s for s in sites if s is not site and s.backend != site.backend and _same_shapes(s, site)
        and (s.achieved_tflops or 0) > site.achieved_tflops
    ]
    if not faster:
        return None
    best = max(faster, key=lambda s: s.achieved_tflops)
    new_ms = site.tflop_per_step / best.achieved_tflops * 1e3
    fix = (
        f"Let SDPA pick {best.backend} here as it does in {best.module}: "
        + "; ".join(site.why_not)
        + "."
    )
    return AttentionChoice(
        site, site.gpu_ms_per_step, round(new_ms, 4), round(site.gpu_ms_per_step - new_ms, 4),
        "faster backend", fix,
    )


class RecomputationDetails(Record, frozen=True):
    """The recomputation finding's evidence: the recomputed forward (`recompute.Recomputation`), the
    segments (layers) to stop checkpointing, and the step and peak after it (None where memory was
    not recorded)."""

    recompute: Recomputation
    segments_to_stop: int | None
    step_ms: float
    predicted_step_ms: float
    predicted_peak_bytes: int | None
    peaks: str


def _recomputation(context: _Context, recompute: Recomputation, mask: np.ndarray) -> Finding | None:
    """The recomputed forward's time, won back for the segments whose memory fits (module docstring)."""
    work = context.work
    count = max(int(round(recompute.segments_per_step)), 1)
    fit = recompute.segments_that_fit
    share = 1.0 if fit is None else fit / count
    saved = recompute.gpu_ms_per_step * share
    if not context.worth(saved):
        return None
    gib = 2**30
    module = recompute.modules[0] if recompute.modules else None
    peak = None
    if fit is not None and recompute.peak_bytes is not None and recompute.held_bytes_per_step is not None:
        peak = (
            recompute.peak_without_bytes if fit == count
            else recompute.peak_bytes + int(fit * recompute.held_bytes_per_step / count)
        )
    memory = (
        f"; peak {recompute.peak_bytes / gib:.1f} GiB of {recompute.device_bytes / gib:.0f} GiB"
        if recompute.peak_bytes and recompute.device_bytes else ""
    )
    if fit is None:
        which = "as many as memory allows (record with profile_memory=True to see the headroom)"
    elif fit == count:
        which = f"all {count} checkpointed segments fit without checkpointing (peak ~{peak / gib:.1f} GiB)"
    else:
        which = f"{fit} of {count} checkpointed segments fit in memory (peak ~{peak / gib:.1f} GiB)"
    step = work.step_ms
    return context.finding(
        "recomputation",
        "Activation checkpointing recomputes the forward in backward: "
        f"{recompute.gpu_ms_per_step:.1f} ms/step ({context.share(recompute.gpu_ms_per_step)} of the step) "
        f"in {recompute.segments_per_step:g} segments{_in(module)}{memory}",
        saved,
        mask,
        f"Checkpoint fewer layers, or none: {which}. Hugging Face: model.gradient_checkpointing_disable() "
        "(or checkpoint every k-th layer); torch: drop torch.utils.checkpoint (or checkpoint_wrapper) from "
        f"the layers that fit. Step {step:.1f} -> ~{step - saved:.1f} ms.",
        Where(function=module) if module else context.module_of(mask)[1],
        RecomputationDetails(
            recompute=recompute,
            segments_to_stop=fit,
            step_ms=round(step, 4),
            predicted_step_ms=round(step - saved, 4),
            predicted_peak_bytes=peak,
            peaks=context.peaks_label,
        ),
        cause="activation checkpointing runs each checkpointed layer's forward again in the backward",
    )
