"""How many tokens a step feeds the model: the token ids its embedding lookup reads.

A language model turns its batch of token ids into vectors with one embedding lookup
(`aten::embedding`, the ids its second input: `[batch, seq_len]`), and a model's activations grow
with those tokens. So the step's tokens are the ids of its largest embedding lookup (a position
embedding's ids, `[1, seq_len]`, are fewer), read from the shapes `record_shapes` wrote. A step with
no lookup (a vision model, a trace without shapes) has no token count: the memory headroom then
still says how many times the step's activations fit, without naming a batch.
"""

from __future__ import annotations

import math

import numpy as np

from trainprof.analysis.records import Record
from trainprof.analysis.timeline import Timeline

EMBEDDING_OPS = ("aten::embedding",)
"""Ops that read a step's token ids as their second input."""
_INDEX_TYPES = ("long", "int")
"""What an integer index tensor's `Input type` holds (`long int`, `int`)."""


class StepTokens(Record, frozen=True):
    """The token ids a step's embedding lookup read: `shape` (`[batch, seq_len]`), `tokens` (their
    product), `batch` and `seq_len` (None for ids that are not 2-D), the `step` and the `op`."""

    step: int
    shape: list[int]
    tokens: int
    batch: int | None
    seq_len: int | None
    op: str


def step_tokens(timeline: Timeline, step: int | None = None) -> StepTokens | None:
    """The tokens of step number `step` (default: the first step that has a lookup); None without
    an embedding lookup whose ids were recorded."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if trace.op_inputs is None or ops.inputs is None or not len(ops):
        return None
    names = [trace.name_id(name) for name in EMBEDDING_OPS]
    rows = np.flatnonzero(np.isin(ops.name, [n for n in names if n >= 0]) & (ops.inputs >= 0))
    if not len(rows):
        return None
    steps = timeline.step_of(ops.start_us[rows])
    numbers = np.array([s.number for s in timeline.steps] + [-1])[steps]  # -1: outside any step
    wanted = numbers == step if step is not None else numbers >= 0
    rows, numbers = rows[wanted], numbers[wanted]
    if not len(rows):
        return None
    if step is None:
        first = numbers[0]
        rows = rows[numbers == first]
    dims, types = trace.op_inputs.decode(ops.inputs[rows])
    best: StepTokens | None = None
    for row, shapes, kinds in zip(rows.tolist(), dims, types, strict=True):
        ids = _index_shape(shapes, kinds)
        if ids is None:
            continue
        tokens = math.prod(ids)
        if best is None or tokens > best.tokens:
            two_d = len(ids) == 2
            best = StepTokens(
                step=int(timeline.steps[int(timeline.step_of(ops.start_us[[row]])[0])].number),
                shape=ids,
                tokens=tokens,
                batch=ids[0] if two_d else None,
                seq_len=ids[1] if two_d else None,
                op=trace.names[int(ops.name[row])],
            )
    return best


def _index_shape(shapes: list | None, kinds: list | None) -> list[int] | None:
    """The second input's shape when it is an integer tensor of positive sizes, else None."""
    if not shapes or len(shapes) < 2 or not isinstance(shapes[1], list) or not shapes[1]:
        return None
    kind = kinds[1] if kinds and len(kinds) > 1 and isinstance(kinds[1], str) else ""
    if not any(word in kind for word in _INDEX_TYPES):
        return None
    shape = shapes[1]
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**40 for d in shape):
        return None
    return [int(d) for d in shape]
