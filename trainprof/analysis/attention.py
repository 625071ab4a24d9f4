"""Which attention kernel each call site ran, and why not a faster one.

`torch.nn.functional.scaled_dot_product_attention` picks a backend per call from its inputs: cuDNN
(Hopper, Blackwell), flash, memory-efficient, or its math fallback (`ATTENTION_OPS`, `SDPA_MATH_OP`).
A call site is a module's attention calls of one backend (`module_group`, the backend's kernel
class); its forward and backward kernels together (`busy.KernelWork`: a backward kernel belongs to
its forward op's module). Its facts come from the recorded inputs of its `aten::scaled_dot_product_
attention` op: query and key shapes, dtype, head dim, the mask's shape and dtype, and, from the op's
`Concrete Inputs`, `dropout_p` and `is_causal`.

What keeps a faster backend from running (`why_not`, from the facts; `BACKEND_LIMITS` is the table):
an explicit mask (flash takes none; a causal one is `is_causal=True`, which also skips the masked
half of the scores), an fp32 input (flash and cuDNN take fp16/bf16), a head dim the kernels do not
take. The facts module makes no findings: `busy_findings._attention_choice` judges them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from trainprof.analysis.attribution import FORWARD, KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.kernel_classes import CLASSES, KernelClass
from trainprof.analysis.records import Record
from trainprof.analysis.work import MATH_DTYPE
from trainprof.trace import Trace
from trainprof.trace.model import nearest_marked

SDPA_OP = "aten::scaled_dot_product_attention"
"""The public op: query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa."""
_MASK, _DROPOUT, _CAUSAL = 3, 4, 5

BACKENDS = {
    KernelClass.ATTENTION_CUDNN: "cudnn",
    KernelClass.ATTENTION_FLASH: "flash",
    KernelClass.ATTENTION_MEM_EFFICIENT: "memory-efficient",
    KernelClass.ATTENTION_FUSED: "fused (other)",
}
"""The fused attention classes a call site can run, by the backend's name in reports."""


class BackendLimit(NamedTuple):
    """What a backend takes (torch's `sdp_utils` checks, CUDA, torch 2.5-2.11): its dtypes, whether an
    explicit mask, and its head dims (`max_head_dim`, a multiple of `head_dim_multiple`)."""

    dtypes: frozenset[str]
    takes_mask: bool
    max_head_dim: int
    head_dim_multiple: int


BACKEND_LIMITS = {
    "flash": BackendLimit(frozenset({"bf16", "fp16"}), False, 256, 8),
    "cudnn": BackendLimit(frozenset({"bf16", "fp16"}), True, 128, 8),
    "memory-efficient": BackendLimit(frozenset({"bf16", "fp16", "fp32"}), True, 2**31, 1),
}
"""The fused backends' limits, the faster first: flash and cuDNN (which torch 2.11 preferred on the
H200 for GPT-2's and Llama's attention: tests/fixtures/busy) before memory-efficient, the math
fallback last. A site's `why_not` lists the limits of those ranked above the one that ran."""


class AttentionSite(Record, frozen=True):
    """One attention call site: `module` (its class path's last part), `backend` (`BACKENDS`, or
    `math`), forward `calls_per_step`, GPU ms per step of its forward and backward kernels, their
    TFLOP per step and rate (FLOPs as torch counts them: the full [T, T] scores, causal or not),
    the query's shape and dtype, the mask's shape and dtype (None without one), `is_causal` and
    `dropout_p` (None where not recorded), and `why_not`: what keeps each faster backend out.
    `prep_ms_per_step`: the other kernels its SDPA calls ran (a boolean mask made additive,
    inputs made contiguous), beside the attention kernels."""

    module: str | None
    module_group: int
    backend: str
    calls_per_step: float
    gpu_ms_per_step: float
    prep_ms_per_step: float
    tflop_per_step: float | None
    achieved_tflops: float | None
    query_shape: list[int] | None
    key_shape: list[int] | None
    dtype: str | None
    mask_shape: list[int] | None
    mask_dtype: str | None
    is_causal: bool | None
    dropout_p: float | None
    why_not: list[str]

    @property
    def square_mask(self) -> bool:
        """An explicit mask over [T, T] scores (query and key of one length): the causal shape."""
        return square_mask(self.mask_shape, self.query_shape, self.key_shape)


def square_mask(mask: list[int] | None, query: list[int] | None, key: list[int] | None) -> bool:
    """Whether `mask` spans [T, T] scores of a query and key of one length T (the causal shape)."""
    return bool(mask and query and key and len(mask) >= 2 and mask[-1] == mask[-2] == query[-2] == key[-2])


def attention_sites(trace: Trace, work: KernelWork, owners: KernelOwners) -> list[AttentionSite]:
    """Every attention call site of the profiled steps (module docstring), most GPU time first."""
    fused = work.of_class(*BACKENDS)
    if not fused.any():
        return []
    ops = trace.events["cpu_op"]
    sdpa_id = trace.name_id(SDPA_OP)
    sdpa_of = np.full(len(ops), -1, dtype=np.int64)
    if sdpa_id >= 0 and len(owners.op_parent):
        sdpa_of = nearest_marked(owners.op_parent, ops.name == sdpa_id)
    steps = max(work.steps, 1)
    groups = work.module_group * len(CLASSES) + work.kernel_class
    # Per kernel, the SDPA call it ran under (its op's nearest `aten::scaled_dot_product_attention`).
    under_sdpa = np.where(work.op >= 0, sdpa_of[np.clip(work.op, 0, None)], -1) if len(ops) else work.op
    sites = []
    for key in np.unique(groups[fused]).tolist():
        mine = fused & (groups == key)
        group, code = divmod(int(key), len(CLASSES))
        forward = mine & (work.phase == FORWARD) & (work.attention_op >= 0)
        calls = np.unique(work.attention_op[forward])
        public = sdpa_of[calls[calls >= 0]] if len(calls) else np.zeros(0, dtype=np.int64)
        public = public[public >= 0]
        facts = _facts(trace, int(public[0])) if len(public) else _Facts()
        flops = float(work.flops[mine].sum())
        ms = work.per_step_ms(mine)
        prep = np.isin(under_sdpa, public) & (under_sdpa >= 0) & ~fused
        backend = BACKENDS[CLASSES[code]]
        sites.append(
            AttentionSite(
                module=work.module_paths[group].rsplit("/", 1)[-1] if group >= 0 else None,
                module_group=group,
                backend=backend,
                calls_per_step=round(len(calls) / steps, 2),
                gpu_ms_per_step=round(ms, 4),
                prep_ms_per_step=round(work.per_step_ms(prep), 4),
                tflop_per_step=round(flops / 1e12 / steps, 4) if flops > 0 else None,
                achieved_tflops=round(flops / steps / (ms / 1e3) / 1e12, 1) if flops > 0 and ms > 0 else None,
                query_shape=facts.query,
                key_shape=facts.key,
                dtype=facts.dtype,
                mask_shape=facts.mask,
                mask_dtype=facts.mask_dtype,
                is_causal=facts.is_causal,
                dropout_p=facts.dropout_p,
                why_not=why_not(backend, facts),
            )
        )
    sites.sort(key=lambda site: -site.gpu_ms_per_step)
    return sites


class _Facts(NamedTuple):
    query: list[int] | None = None
    key: list[int] | None = None
    dtype: str | None = None
    mask: list[int] | None = None
    mask_dtype: str | None = None
    is_causal: bool | None = None
    dropout_p: float | None = None


def _facts(trace: Trace, row: int) -> _Facts:
    """The recorded inputs of one `aten::scaled_dot_product_attention` call."""
    slot = int(trace.events["cpu_op"].inputs[row]) if trace.events["cpu_op"].inputs is not None else -1
    if trace.op_inputs is None or slot < 0:
        return _Facts()
    (dims,), (types,) = trace.op_inputs.decode(np.asarray([slot]))
    (concrete,) = trace.op_inputs.concrete(np.asarray([slot]))
    dims, types, concrete = dims or [], types or [], concrete or []

    def shape(index: int) -> list[int] | None:
        value = dims[index] if len(dims) > index else None
        return value if isinstance(value, list) and value and all(type(d) is int for d in value) else None

    def scalar(index: int) -> str | None:
        value = concrete[index] if len(concrete) > index else None
        return value if isinstance(value, str) and value else None

    mask = shape(_MASK)
    causal = scalar(_CAUSAL)
    dropout = scalar(_DROPOUT)
    try:
        dropout_p = float(dropout) if dropout is not None else None
    except ValueError:
        dropout_p = None
    return _Facts(
        query=shape(0),
        key=shape(1),
        dtype=MATH_DTYPE.get(types[0]) if types else None,
        mask=mask,
        mask_dtype=(types[_MASK] if len(types) > _MASK else None) if mask else None,
        is_causal=causal == "True" if causal in ("True", "False") else None,
        dropout_p=dropout_p if dropout_p is not None and math.isfinite(dropout_p) else None,
    )


def why_not(backend: str, facts: _Facts) -> list[str]:
    """What keeps each backend faster than `backend` out (`BACKEND_LIMITS`, fastest first), from a
    call's facts; empty when nothing recorded does (or `backend` is the fastest)."""
    reasons = []
    for faster, limit in BACKEND_LIMITS.items():
        if faster == backend:
            break
        if facts.mask is not None and not limit.takes_mask:
            square = square_mask(facts.mask, facts.query, facts.key)
            causal = " (if causal: is_causal=True instead)" if square else ""
            reasons.append(f"{faster}: an explicit attn_mask {facts.mask}{causal}")
        if facts.dtype is not None and facts.dtype not in limit.dtypes:
            reasons.append(f"{faster}: {facts.dtype} inputs (it takes {'/'.join(sorted(limit.dtypes))})")
        head = facts.query[-1] if facts.query else None
        if head is not None and (head > limit.max_head_dim or head % limit.head_dim_multiple):
            reasons.append(
                f"{faster}: head dim {head} (it takes multiples of {limit.head_dim_multiple} up to "
                f"{limit.max_head_dim})"
            )
    return reasons


