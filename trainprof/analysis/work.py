"""How much work an op did, from the input shapes and dtypes `record_shapes` wrote: a matrix
product's FLOPs and math dtype, a fused attention op's FLOPs, and the bytes a memory-bound op moves.

FLOPs follow torch's own count (`torch.utils.flop_counter`): 2·M·N·K a matrix product; an attention
op 4·B·H·Tq·Tk·D forward and twice that backward, causal or not (a causal kernel skips half of it,
as the eager matmuls do not). Bytes are an estimate: every tensor input read once, plus an output
the size of the largest input (in-place ops write their first input; `copy_` and `fill_` write
their destination only), which is what a memory-bound kernel moves at the least.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from trainprof.analysis.kernel_classes import ATTENTION_OPS

# Bytes per element of the dtypes `Input type` names (anything else is not a tensor, or unknown).
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
}
MATH_DTYPE = {
    "float": "fp32",
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}
SCORES_MIN_SEQ = 128
"""An input whose last two dims are equal and at least this long is an attention score matrix
[.., T, T] (with an attention module around it: see busy.py); shorter squares are too common."""

# Matrix products: op name -> (index of A, index of B) among its inputs.
GEMM_OPERANDS = {
    "aten::mm": (0, 1),
    "aten::_int_mm": (0, 1),
    "aten::_scaled_mm": (0, 1),
    "aten::bmm": (0, 1),
    "aten::matmul": (0, 1),
    "aten::addmm": (1, 2),
    "aten::_addmm_activation": (1, 2),
    "aten::baddbmm": (1, 2),
    "aten::addbmm": (1, 2),
}


class OpWork(NamedTuple):
    """What one op (one recorded shape signature) does: `flops` (NaN when not a matrix product or
    fused attention op), `bytes` (NaN without tensor inputs), `dtype` (the math dtype of its first
    tensor input: fp32, bf16, fp16, fp8, or None), `gemm` ((batch, M, N, K) of a matrix product, or
    None), `scores` (an input or product is an attention score matrix [.., T, T]), and
    `first_input` ((shape, dtype) of the tensor it reads first: `copy_`'s source, else its first
    tensor input; None without one)."""

    flops: float
    bytes: float
    dtype: str | None
    gemm: tuple[int, int, int, int] | None
    scores: bool
    first_input: tuple[list[int], str] | None


NO_WORK = OpWork(math.nan, math.nan, None, None, False, None)


def op_work(name: str, dims: list | None, types: list | None) -> OpWork:
    """The work of one op call from its name and its recorded `Input Dims` / `Input type`."""
    if not dims or not types:
        return NO_WORK
    tensors = [
        (shape, kind)
        for shape, kind in zip(dims, types, strict=False)
        if kind in DTYPE_BYTES and isinstance(shape, list) and shape and all(type(d) is int for d in shape)
    ]
    if not tensors:
        return NO_WORK
    dtype = next((MATH_DTYPE[kind] for _, kind in tensors if kind in MATH_DTYPE), None)
    gemm = gemm_shape(name, dims)
    attention = ATTENTION_OPS.get(name)
    flops = math.nan
    if gemm is not None:
        batch, m, n, k = gemm
        flops = 2.0 * batch * m * n * k
    elif attention is not None:
        flops = _attention_flops(dims, attention.query, attention.key, attention.seq_axis, attention.backward)
    scores = any(len(shape) >= 3 and shape[-1] == shape[-2] >= SCORES_MIN_SEQ for shape, _ in tensors)
    if gemm is not None and not scores:
        _, m, n, k = gemm
        scores = m == n >= SCORES_MIN_SEQ and k < m and len(dims[GEMM_OPERANDS.get(name, (0, 1))[0]]) >= 3
    first_input = tensors[1] if name == "aten::copy_" and len(tensors) > 1 else tensors[0]
    return OpWork(flops, _bytes(name, tensors), dtype, gemm, scores, first_input)


def gemm_shape(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matrix product's inputs, or None (not one, or shapes that do not fit)."""
    if name == "aten::linear":
        if len(dims) < 2 or not _shape(dims[0]) or not _shape(dims[1]) or len(dims[1]) != 2:
            return None
        x, w = dims[0], dims[1]
        return (1, math.prod(x[:-1]), w[0], x[-1]) if x[-1] == w[1] else None
    operands = GEMM_OPERANDS.get(name)
    if operands is None or len(dims) <= max(operands):
        return None
    a, b = dims[operands[0]], dims[operands[1]]
    if not _shape(a) or not _shape(b) or len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    return batch, a[-2], b[-1], a[-1]


def _attention_flops(dims: list, query: int, key: int, seq_axis: int, backward: bool) -> float:
    if len(dims) <= max(query, key) or not _shape(dims[query]) or not _shape(dims[key]):
        return math.nan
    q, k = dims[query], dims[key]
    if len(q) != 4 or len(k) != 4:
        return math.nan
    return (8.0 if backward else 4.0) * math.prod(q) * k[seq_axis]


def _bytes(name: str, tensors: list) -> float:
    sizes = [math.prod(shape) * DTYPE_BYTES[kind] for shape, kind in tensors]
    read = float(sum(sizes))
    if name in ("aten::copy_", "aten::fill_", "aten::zero_"):
        return read  # reads its source (if any), writes its destination
    if name.endswith("_") and not name.endswith("__"):
        return read + sizes[0]  # in place: writes its first input
    return read + max(sizes)


def _shape(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(d) is int and d >= 0 for d in value)
