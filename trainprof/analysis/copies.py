"""Where the copy-and-cast class's GPU time comes from: each of its kernels by what made it.

The class (`kernel_classes.KernelClass.COPY`) is one line of the busy table, often the largest after
the GEMMs (19-21% of the step on the H200 Llama sample and a GPT-2 run); its fixes differ by maker.
Each kernel is judged by the chain of ops around its launch (the launching op, its parent, ...),
the launching op's recorded input dims and dtypes, and its module; `COPY_RULES` is the table, first
match wins:

    launching op chain                              what it is
    copy_ < _to_copy < to < linear|addmm|mm|conv    autocast's cast into a matrix product: of the
                                                    weight (the op's weight operand's dims) or an input
    copy_ < _to_copy < to < ToCopyBackward0         a cast's gradient, cast back in the backward
    copy_ < _to_copy < to < pow|layer_norm|...      autocast's cast into an op it runs in fp32
    copy_ < _to_copy (< to), no op around           a `.float()` / `.to(dtype)` the model's code makes
    cat with an empty input                         a cache grown from nothing (training with use_cache)
    copy_ < clone|contiguous (same dtype)           a copy that only changes the layout
    an elementwise op on inputs of mixed dtypes     math reading one input through a cast

A cast's gradient (`ToCopyBackward0`) goes with the forward cast of the same dims in the same module
(it goes when that one goes). Forward passes per step (`forward_passes`): how often each weight's
cast repeats in a step (the micro-batches of gradient accumulation: autocast's cast cache lives
only until its region ends, so a region per micro-batch casts every weight again).
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

from trainprof.analysis.attribution import KernelOwners, UserFrames
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.kernel_classes import KernelClass
from trainprof.analysis.records import Record
from trainprof.analysis.work import DTYPE_BYTES, MATH_DTYPE
from trainprof.trace import Trace

CHAIN_DEPTH = 4
"""Ops of a kernel's launch chain read (the launching op and three around it): `copy_ < _to_copy <
to < linear` reaches the matrix product that autocast casts for."""
WEIGHT_OPERAND = {
    "aten::linear": 1,
    "aten::addmm": 2,
    "aten::mm": 1,
    "aten::matmul": 1,
    "aten::conv1d": 1,
    "aten::conv2d": 1,
    "aten::conv3d": 1,
    "aten::convolution": 1,
    "aten::_convolution": 1,
}
"""A matrix product's (convolution's) weight among its inputs: a cast of a tensor of those dims into
it is a weight's cast (HF's Conv1D multiplies `addmm(bias, x, weight)`)."""
_MATMUL = r"aten::(linear|addmm|mm|matmul|bmm|baddbmm|conv\w*|_convolution|cudnn_convolution)"


class CopyKind(NamedTuple):
    """One kind of copy: its key, label (words for a table) and fix (None: nothing to remove)."""

    key: str
    label: str
    fix: str | None


COPY_KINDS: tuple[CopyKind, ...] = (
    CopyKind(
        "autocast_weight_cast",
        "autocast's weight casts (fp32 weights to bf16/fp16 before each matrix product)",
        "Cast each weight once per step, not once per micro-batch: one torch.autocast region around "
        "all micro-batches of the step (its cast cache lives until the region ends), or keep bf16 "
        "weights with fp32 master weights in the optimizer (FSDP2's MixedPrecisionPolicy casts at "
        "the all-gather).",
    ),
    CopyKind(
        "autocast_input_cast",
        "autocast's input casts (fp32 activations into bf16/fp16 matrix products)",
        None,
    ),
    CopyKind(
        "autocast_fp32_cast",
        "autocast's casts into ops it runs in fp32 (pow, norms, softmax, losses)",
        None,
    ),
    CopyKind(
        "dtype_cast",
        "dtype casts in the model's code (.float(), .to(dtype)) and their gradients",
        "Drop the cast and compute in the input's dtype: a fused kernel (a norm, the loss) loads bf16 "
        "and keeps its sums in fp32 registers; torch.compile fuses the casts into their neighbours.",
    ),
    CopyKind("gradient_cast", "gradients cast back to the forward input's dtype", None),
    CopyKind(
        "empty_concat",
        "torch.cat onto an empty tensor (a key/value cache grown from nothing)",
        "Training needs no key/value cache: load or call the model with use_cache=False "
        "(model.config.use_cache = False), so no torch.cat copies each layer's keys and values.",
    ),
    CopyKind(
        "layout_copy",
        "layout copies (.contiguous() after a transpose or permute)",
        "Drop the .contiguous(): matmul and linear take transposed operands, SDPA takes [B, H, T, D] "
        "views; or let torch.compile choose the layouts.",
    ),
    CopyKind("reshape_copy", "reshape copies of non-contiguous tensors (autograd's view gradients)", None),
    CopyKind(
        "mixed_dtype_math", "elementwise math on inputs of mixed dtypes (each reads one through a cast)", None
    ),
    CopyKind("concat", "concatenation (torch.cat, torch.stack)", None),
    CopyKind("indexing", "indexing, gather and scatter (embeddings, slicing gradients)", None),
    CopyKind("other", "other copies", None),
)
KINDS = {kind.key: kind for kind in COPY_KINDS}


class CopyRule(NamedTuple):
    """Kernels whose launch chain (`op < parent < ...`) matches `chain` are `kind`; `cast` (the op
    changes dtype) and `mixed` (its inputs have several dtypes) must hold where set."""

    kind: str
    chain: str
    cast: bool | None = None
    mixed: bool | None = None
    empty_input: bool | None = None


COPY_RULES: tuple[CopyRule, ...] = (
    CopyRule("autocast_weight_cast", rf"^aten::copy_ < aten::_to_copy < aten::to < {_MATMUL}\b", cast=True),
    CopyRule(
        "gradient_cast",
        r"^aten::copy_ < aten::_to_copy < aten::to < (\w+Backward\d*|autograd::engine::evaluate_function)",
        cast=True,
    ),
    CopyRule("autocast_fp32_cast", r"^aten::copy_ < aten::_to_copy < aten::to < aten::", cast=True),
    CopyRule("dtype_cast", r"^aten::copy_ < aten::_to_copy\b", cast=True),
    CopyRule("empty_concat", r"^aten::(cat|_cat)\b", empty_input=True),
    CopyRule("layout_copy", r"^aten::copy_ < aten::clone < aten::contiguous\b", cast=False),
    CopyRule("reshape_copy", r"^aten::copy_ < aten::clone\b", cast=False),
    CopyRule("concat", r"^aten::(cat|_cat|stack)\b"),
    CopyRule("indexing", r"index|gather|scatter|embedding|slice_backward|select_backward|masked"),
    CopyRule("mixed_dtype_math", r"^aten::(?!copy_)", mixed=True),
    CopyRule("other", r""),
)


class CopyRow(Record, frozen=True):
    """One kind's copy kernels: GPU ms and calls per step, share of the class, and where most of them
    run: the launching op chain, the module and the user's line (`file:line function`)."""

    kind: str
    label: str
    gpu_ms_per_step: float
    calls_per_step: float
    class_pct: float
    op_chain: str | None
    module: str | None
    user_line: str | None


class CopyBreakdown(Record, frozen=True):
    """The copy-and-cast class by maker (`TraceInfo.copies`; None without copy kernels): its GPU ms
    per step, forward passes per step (how often each weight's cast repeats in a step), the GPU
    ms per step of gradient casts that go with the model's own casts (`dtype_cast` holds them), and
    the rows, most time first."""

    gpu_ms_per_step: float
    forward_passes_per_step: float | None
    rows: list[CopyRow]


class CopyKernels(NamedTuple):
    """Per kernel of `KernelWork`, its `COPY_KINDS` key's index (-1: not a copy-class kernel), the
    forward passes per step, and the breakdown (None without copy kernels)."""

    kind: np.ndarray
    forward_passes: float | None
    breakdown: CopyBreakdown | None


_KIND_INDEX = {kind.key: index for index, kind in enumerate(COPY_KINDS)}


def copy_kernels(trace: Trace, work: KernelWork, owners: KernelOwners) -> CopyKernels:
    """Each copy-class kernel's maker (module docstring), and the breakdown."""
    kind = np.full(len(work.rows), -1, dtype=np.int64)
    copy = np.flatnonzero(work.of_class(KernelClass.COPY))
    if not len(copy):
        return CopyKernels(kind, None, None)
    ops = trace.events["cpu_op"]
    chains = _chains(work.op[copy], owners.op_parent)
    inputs = _Inputs(trace, chains[:, 0])
    # Each distinct (chain of op names, recorded inputs) judged once: a few dozen for thousands of kernels.
    name_ids = np.where(chains >= 0, ops.name[np.clip(chains, 0, None)] if len(ops) else -1, -1)
    distinct, chain_of = np.unique(name_ids, axis=0, return_inverse=True)
    chain_of = chain_of.reshape(-1)
    texts = [" < ".join(trace.names[int(i)] for i in row if i >= 0) for row in distinct.tolist()]
    pairs, pair_of = np.unique(chain_of * len(inputs.distinct) + inputs.of, return_inverse=True)
    pair_kind = np.array(
        [_KIND_INDEX[_rule_for(texts[p // len(inputs.distinct)], inputs.distinct[p % len(inputs.distinct)])]
         for p in pairs.tolist()],
        dtype=np.int64,
    )
    judged = pair_kind[pair_of.reshape(-1)]
    source = [inputs.distinct[i].source_dims for i in inputs.of.tolist()]
    weights = np.flatnonzero(judged == _KIND_INDEX["autocast_weight_cast"])
    if len(weights):  # a cast into a matrix product is the weight's only with the weight's dims
        weight = _casts_weights(trace, chains[weights, 3], [source[p] for p in weights.tolist()])
        judged[weights[~weight]] = _KIND_INDEX["autocast_input_cast"]
    kind[copy] = judged
    _gradients_with_their_casts(work, copy, kind, source)
    passes = _forward_passes(work, copy, kind, source)
    chain_text = [texts[i] for i in chain_of.tolist()]
    return CopyKernels(kind, passes, _breakdown(trace, work, owners, copy, kind, chain_text, passes))


@functools.cache
def _rules() -> tuple[tuple[CopyRule, re.Pattern], ...]:
    """`COPY_RULES` compiled, once, on first use."""
    return tuple((rule, re.compile(rule.chain)) for rule in COPY_RULES)


def _rule_for(chain: str, facts: _Facts) -> str:
    """The kind of the first `COPY_RULES` row that a chain and its launching op's inputs match."""
    return next(
        rule.kind for rule, pattern in _rules()
        if pattern.search(chain)
        and (rule.cast is None or rule.cast == facts.cast)
        and (rule.mixed is None or rule.mixed == facts.mixed)
        and (rule.empty_input is None or rule.empty_input == facts.empty_input)
    )


def _chains(launch_ops: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per kernel, the cpu_op rows of its launch chain (`CHAIN_DEPTH` of them, -1 past the top)."""
    chains = np.full((len(launch_ops), CHAIN_DEPTH), -1, dtype=np.int64)
    chains[:, 0] = launch_ops
    for depth in range(1, CHAIN_DEPTH):
        above = chains[:, depth - 1]
        chains[:, depth] = np.where(above >= 0, parent[np.clip(above, 0, None)], -1) if len(parent) else -1
    return chains


class _Facts(NamedTuple):
    cast: bool | None
    mixed: bool | None
    empty_input: bool
    source_dims: list | None


class _Inputs:
    """The launching ops' recorded inputs, each distinct one decoded once: `distinct` (their facts)
    and, per kernel, `of` (an index into it)."""

    def __init__(self, trace: Trace, rows: np.ndarray):
        ops = trace.events["cpu_op"]
        if trace.op_inputs is None or ops.inputs is None or not len(ops):  # no op recorded its inputs
            self.distinct = [_Facts(None, None, False, None)]
            self.of = np.zeros(len(rows), dtype=np.int64)
            return
        slots = np.where(rows >= 0, ops.inputs[np.clip(rows, 0, None)], -1)
        index: dict[bytes, int] = {}
        self.of = np.fromiter(
            (index.setdefault(text, len(index)) for text in trace.op_inputs.keys(slots.tolist())),
            dtype=np.int64,
            count=len(slots),
        )
        _, first = np.unique(self.of, return_index=True)
        dims, types = trace.op_inputs.decode(slots[first])
        self.distinct = [_facts(d, t) for d, t in zip(dims, types, strict=True)]


def _facts(dims: list | None, types: list | None) -> _Facts:
    if not dims or not types:
        return _Facts(None, None, False, None)
    tensor_types = [kind for kind in types if kind in DTYPE_BYTES]
    # A TensorList input (torch.cat's) is a list of shapes; one of them empty: [[0], [4, 12, 2048, 64]].
    empty = any(
        isinstance(shape, list) and shape and isinstance(shape[0], list) and any(0 in part for part in shape)
        for shape in dims
    )
    cast = len(types) >= 2 and types[0] != types[1] and types[1] in MATH_DTYPE
    source = dims[1] if len(dims) > 1 and isinstance(dims[1], list) else None
    return _Facts(cast, len(set(tensor_types)) > 1, empty, source)


def _casts_weights(trace: Trace, products: np.ndarray, sources: list) -> np.ndarray:
    """Per cast under a matrix product (`products`: its cpu_op row), whether it casts the weight: its
    source dims are the product's weight operand's (`WEIGHT_OPERAND`). Each product signature once."""
    ops = trace.events["cpu_op"]
    found = np.zeros(len(products), dtype=bool)
    if trace.op_inputs is None or ops.inputs is None:
        return found
    slots = np.where(products >= 0, ops.inputs[np.clip(products, 0, None)], -1)
    decoded: dict[bytes, list | None] = {}
    for position, (slot, key) in enumerate(zip(slots.tolist(), trace.op_inputs.keys(slots.tolist()),
                                               strict=True)):
        operand = WEIGHT_OPERAND.get(trace.names[int(ops.name[products[position]])])
        if slot < 0 or operand is None or sources[position] is None:
            continue
        if key not in decoded:
            decoded[key] = trace.op_inputs.decode(np.asarray([slot]))[0][0]
        dims = decoded[key]
        found[position] = (
            dims is not None and bool(dims) and len(dims) > operand and dims[operand] == sources[position]
        )
    return found


def _gradients_with_their_casts(work: KernelWork, copy: np.ndarray, kind: np.ndarray, source: list) -> None:
    """A gradient cast of the dims of one of the model's own casts in the same module goes with it
    (`dtype_cast`): it goes when that cast goes. In place."""
    own = _KIND_INDEX["dtype_cast"]
    keys = {(int(work.module_group[k]), str(source[p])) for p, k in enumerate(copy) if kind[k] == own}
    gradient = _KIND_INDEX["gradient_cast"]
    for position, k in enumerate(copy.tolist()):
        if kind[k] == gradient and (int(work.module_group[k]), str(source[position])) in keys:
            kind[k] = own


def _forward_passes(work: KernelWork, copy: np.ndarray, kind: np.ndarray, source: list) -> float | None:
    """How often each weight is cast in a step (median over the weights: a weight is its module
    instance and dims), None without weight casts."""
    weight = _KIND_INDEX["autocast_weight_cast"]
    counts: dict[tuple, int] = {}
    for position, k in enumerate(copy.tolist()):
        if kind[k] == weight:
            key = (int(work.module[k]), str(source[position]))
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return None
    per_step = sorted(count / max(work.steps, 1) for count in counts.values())
    return float(per_step[len(per_step) // 2])


def _breakdown(
    trace: Trace,
    work: KernelWork,
    owners: KernelOwners,
    copy: np.ndarray,
    kind: np.ndarray,
    chain_text: list[str],
    passes: float | None,
) -> CopyBreakdown:
    """Per kind, its time, calls and where its longest kernel was made (op chain, module, user line)."""
    steps = max(work.steps, 1)
    total_us = float(work.dur_us[copy].sum())
    found = [(index, np.flatnonzero(kind[copy] == index)) for index in range(len(COPY_KINDS))]
    found = [(index, mine) for index, mine in found if len(mine)]
    tops = np.array([mine[int(np.argmax(work.dur_us[copy[mine]]))] for _, mine in found], dtype=np.int64)
    sites = work.rows[copy[tops]]  # one lookup of the user's frames for every kind's longest kernel
    frames = UserFrames(trace).innermost(
        owners.site_thread[sites], owners.site_start_us[sites], owners.site_end_us[sites]
    )
    rows = []
    for (index, mine), top, frame in zip(found, tops.tolist(), frames, strict=True):
        us = float(work.dur_us[copy[mine]].sum())
        group = int(work.module_group[copy[top]])
        rows.append(
            CopyRow(
                kind=COPY_KINDS[index].key,
                label=COPY_KINDS[index].label,
                gpu_ms_per_step=round(us / 1e3 / steps, 4),
                calls_per_step=round(len(mine) / steps, 2),
                class_pct=round(100.0 * us / max(total_us, 1e-9), 1),
                op_chain=chain_text[top] or None,
                module=work.module_paths[group].rsplit("/", 1)[-1] if group >= 0 else None,
                user_line=f"{frame.file}:{frame.line} {frame.function}" if frame is not None else None,
            )
        )
    rows.sort(key=lambda row: -row.gpu_ms_per_step)
    return CopyBreakdown(
        gpu_ms_per_step=round(total_us / 1e3 / steps, 4), forward_passes_per_step=passes, rows=rows
    )
