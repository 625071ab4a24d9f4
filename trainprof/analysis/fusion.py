"""What would `fused_layers.swap(model)` win on this trace? The GPU time of the kernels inside what
swap would replace, minus the fused kernels' fewest bytes at the copy bandwidth: `trainprof ab`'s
prediction model (`trainprof.ab.prediction`), read from any session trace through module attribution.

What swap replaces is data here (`SWAPPABLE`), by the class names a trace's `nn.Module` frames carry;
the analysis imports neither torch nor fused_layers, and `tests/test_busy.py` checks this table
against `fused_layers.swap.TABLE`. A replaced module's kernels are its own and its children's,
forward and backward, except the children the fused module keeps (a gated MLP's Linears). RoPE is
a function, not a module: its kernels are those launched inside `apply_rotary_pos_emb` frames
(Python stacks) of the attention classes swap reroutes.

The fused kernels' fewest bytes per call are `FUSED_BYTES_FACTOR[op]` times a unit tensor, read
from the recorded inputs of the first forward kernel's op in each call: the module's input for the
norms and GELU, the gate projection's output (the activation's input) for a gated MLP, q and k
for RoPE (see `FUSED_BYTES_FACTOR`). Calls per step come from the module's frames in the steps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.attribution import BACKWARD, FORWARD, MODULE_PREFIX, KernelOwners
from trainprof.analysis.busy import KernelWork
from trainprof.analysis.records import Record
from trainprof.analysis.timeline import Timeline
from trainprof.analysis.work import DTYPE_BYTES
from trainprof.trace.model import FRAME_CATEGORIES

#: Fewest bytes a fused op moves per call, forward + backward, in units of its activation's size
#: (x for the norms and GELU; the gate projection's output for a gated MLP). Norms and GELU:
#: forward reads x and writes y (2), backward reads x and dy and writes dx (3). Gated MLP:
#: forward reads gate and up and writes h (3), backward reads gate, up, dh, writes dgate, dup (5).
#: Weights (one row) are negligible. RoPE, in units of q, k, q_embed and k_embed together (each
#: read or written once in each pass: forward reads q, k and writes q_embed, k_embed; backward
#: reads their grads and writes dq, dk), plus cos and sin, read once per (b, t) position in each
#: pass (`rope_bytes`).
FUSED_BYTES_FACTOR = {"layer_norm": 5, "rms_norm": 5, "gelu": 5, "gated_mlp": 8, "rope": 2}
#: The forward's part of it, for a module that ran no backward (inference): x read, y written (2);
#: gate and up read, h written (3); RoPE's four tensors once (1), its tables in one pass.
FORWARD_BYTES_FACTOR = {"layer_norm": 2, "rms_norm": 2, "gelu": 2, "gated_mlp": 3, "rope": 1}


class Swappable(NamedTuple):
    """Modules of these classes (by the class name a trace's `nn.Module: Class_i` frame carries)
    are what `fused_layers.swap` replaces with its `op`; `kept`: child classes the fused module keeps
    (their kernels stay). For `rope`, the classes are attention modules whose `function` swap reroutes."""

    op: str
    classes: tuple[str, ...]
    kept: tuple[str, ...] = ()
    function: str | None = None


SWAPPABLE: tuple[Swappable, ...] = (
    Swappable("layer_norm", ("LayerNorm",)),
    Swappable(
        "gelu",
        ("GELU", "GELUActivation", "NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation"),
    ),
    # Llama's norm and the Llama-style ones swap verifies (not Gemma's, whose weight is 1 + w).
    Swappable("rms_norm", ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")),
    # gate_proj, up_proj, down_proj Linears and an act_fn of SiLU or GELU, no other child.
    Swappable("gated_mlp", ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP"), kept=("Linear",)),
    Swappable(
        "rope",
        ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention"),
        function="apply_rotary_pos_emb",
    ),
)
_MODULE_OP = {name: row for row in SWAPPABLE if row.function is None for name in row.classes}
_ROPE = next(row for row in SWAPPABLE if row.op == "rope")


class SwapRow(Record, frozen=True):
    """One kind of module swap would replace: its op, the module classes and instances seen, calls
    per step, the GPU time of the kernels it would replace and the fused kernels' expected time."""

    op: str
    modules: list[str]
    instances: int
    calls_per_step: float
    replaced_ms_per_step: float
    fused_ms_per_step: float


class SwapPrediction(Record, frozen=True):
    """`fused_layers.swap(model)`'s predicted saving on this trace (module docstring):
    `replaced_ms_per_step` - `fused_ms_per_step` = `saved_ms_per_step`, at `copy_tb_s`."""

    rows: list[SwapRow]
    replaced_ms_per_step: float
    fused_ms_per_step: float
    saved_ms_per_step: float
    copy_tb_s: float


def swap_prediction(
    timeline: Timeline, owners: KernelOwners, work: KernelWork
) -> tuple[SwapPrediction | None, np.ndarray]:
    """The prediction (None when nothing swap replaces ran, or without a copy bandwidth), and per
    kernel of `work` whether swap would replace it."""
    none = np.zeros(len(work.rows), dtype=bool)
    copy = work.peaks.bytes_per_s if work.peaks is not None else None
    if not owners.modules or not copy or not len(work.rows):
        return None, none
    # Per module ref: the row of SWAPPABLE replacing it (-1 none), and the replaced instance (the
    # module swap replaces, an index into `roots`: its path) it is in.
    plans: dict[str, tuple[int, int]] = {}
    roots: dict[str, int] = {}
    op_of_ref = np.full(len(owners.modules) + 1, -1, dtype=np.int64)
    root_of_ref = np.full(len(owners.modules) + 1, -1, dtype=np.int64)
    for i, ref in enumerate(owners.modules):
        plan = plans.get(ref.class_path)
        if plan is None:
            plan = plans[ref.class_path] = _replaced_at(ref.class_path)
        code, depth = plan
        if code >= 0:
            op_of_ref[i] = code
            root_of_ref[i] = roots.setdefault("/".join(ref.path.split("/")[: depth + 1]), len(roots))
    replaced = op_of_ref[work.module]
    root = root_of_ref[work.module]
    in_rope = _inside_function(timeline, owners, work, _ROPE)
    if in_rope.any():
        rope_root = np.asarray(
            [
                roots.setdefault(ref.path, len(roots)) if ref.name in _ROPE.classes else -1
                for ref in owners.modules
            ]
            + [-1]
        )
        replaced = np.where(in_rope, SWAPPABLE.index(_ROPE), replaced)
        root = np.where(in_rope, rope_root[work.module], root)
    if not (replaced >= 0).any():
        return None, none
    root_paths = list(roots)
    steps = max(work.steps, 1)
    calls = _module_calls(timeline, {path.rsplit("/", 1)[-1] for path in root_paths})
    # Replaced kernels grouped by (op, instance), each group in launch order.
    at = np.flatnonzero(replaced >= 0)
    at = at[np.lexsort((work.rows[at], root[at], replaced[at]))]
    bounds = np.flatnonzero(np.diff(replaced[at]) | np.diff(root[at])) + 1
    groups = np.split(at, bounds)
    rows = []
    for code, row in enumerate(SWAPPABLE):
        mine = [g for g in groups if replaced[g[0]] == code]
        if not mine:
            continue
        fused_bytes = 0.0
        call_count = 0
        names = set()
        for group in mine:
            frame = root_paths[int(root[group[0]])].rsplit("/", 1)[-1]  # LlamaRMSNorm_3
            count = calls.get(frame, 0)
            call_count += count
            fused_bytes += count * _unit_bytes(work, group, row.op)
            names.add(frame.rsplit("_", 1)[0])
        mask = replaced == code
        rows.append(
            SwapRow(
                op=row.op,
                modules=sorted(names),
                instances=len(mine),
                calls_per_step=round(call_count / steps, 2),
                replaced_ms_per_step=round(work.per_step_ms(mask), 4),
                fused_ms_per_step=round(fused_bytes / copy * 1e3 / steps, 4),
            )
        )
    replaced_ms = sum(r.replaced_ms_per_step for r in rows)
    fused_ms = sum(r.fused_ms_per_step for r in rows)
    prediction = SwapPrediction(
        rows=rows,
        replaced_ms_per_step=round(replaced_ms, 4),
        fused_ms_per_step=round(fused_ms, 4),
        saved_ms_per_step=round(replaced_ms - fused_ms, 4),
        copy_tb_s=round(copy / 1e12, 3),
    )
    return prediction, replaced >= 0


def _replaced_at(class_path: str) -> tuple[int, int]:
    """(the SWAPPABLE row replacing a module of this class path, the depth of the module it replaces),
    or (-1, -1): the outermost class of a row, unless the module is a child that row keeps."""
    classes = class_path.split("/")
    for depth, name in enumerate(classes):
        row = _MODULE_OP.get(name)
        if row is None:
            continue
        if depth + 1 < len(classes) and classes[depth + 1] in row.kept:
            return -1, -1
        return SWAPPABLE.index(row), depth
    return -1, -1


def _inside_function(
    timeline: Timeline, owners: KernelOwners, work: KernelWork, row: Swappable
) -> np.ndarray:
    """Per kernel: in a module of `row.classes` and launched (or, backward, its forward op run) inside
    a Python frame of `row.function`."""
    trace = timeline.trace
    inside = np.zeros(len(work.rows), dtype=bool)
    if not owners.modules:
        return inside
    named = np.asarray([ref.name in row.classes for ref in owners.modules] + [False])
    candidates = np.flatnonzero(named[work.module])
    if not len(candidates):
        return inside
    suffix = f": {row.function}"
    is_function = trace.names_matching(lambda name: name.endswith(suffix))
    if not is_function.any():
        return inside
    kernels = work.rows[candidates]
    thread = owners.site_thread[kernels]
    python = FRAME_CATEGORIES.index("python_function")
    for t in distinct(thread[thread >= 0]).tolist():
        at = candidates[thread == t]
        frames = trace.frames(int(t))
        marked = is_function[frames.name_ids] & (frames.category_codes == python)
        if not marked.any():
            continue
        k = work.rows[at]
        found = frames.nearest_marked(
            frames.innermost_of(owners.site_start_us[k], owners.site_end_us[k]), marked
        )
        inside[at] = found >= 0
    return inside


def _module_calls(timeline: Timeline, frames: set[str]) -> dict[str, int]:
    """Calls inside the profiled steps of the module instances whose frame names (`LlamaRMSNorm_3`)
    are `frames`."""
    trace = timeline.trace
    python = trace.events["python_function"]
    ids = [i for i in (trace.name_id(MODULE_PREFIX + frame) for frame in frames) if i >= 0]
    rows = np.flatnonzero(np.isin(python.name, ids)) if ids and len(python) else np.zeros(0, dtype=np.int64)
    rows = rows[timeline.step_of(python.start_us[rows]) >= 0]
    names, counts = np.unique(python.name[rows], return_counts=True)
    return {
        trace.names[i].removeprefix(MODULE_PREFIX): int(c)
        for i, c in zip(names.tolist(), counts.tolist(), strict=True)
    }


def _unit_bytes(work: KernelWork, positions: np.ndarray, op: str) -> float:
    """The fused op's fewest bytes per call for one replaced instance (its kernels at `positions`,
    in launch order; module docstring), from the recorded inputs of its forward kernels' ops; 0 when
    they recorded none."""
    shapes = _forward_input_shapes(work, positions)
    if not shapes:
        return 0.0
    backward = bool((work.phase[positions] == BACKWARD).any())
    if op != "rope":
        shape, kind = shapes[0]
        factor = FUSED_BYTES_FACTOR[op] if backward else FORWARD_BYTES_FACTOR[op]
        return factor * math.prod(shape) * DTYPE_BYTES[kind]
    q, kind = next(((s, k) for s, k in shapes if len(s) == 4), shapes[0])
    if len(q) != 4:
        return 0.0
    # k: the other 4-D input of the same batch, length and head dim, with other heads (grouped queries)
    k_shape = next(
        (s for s, _ in shapes if len(s) == 4 and s[0] == q[0] and s[2:] == q[2:] and s[1] != q[1]), q
    )
    return rope_bytes(q, k_shape, DTYPE_BYTES[kind], backward)


def rope_bytes(q: list[int], k: list[int], element_bytes: int, backward: bool = True) -> float:
    """The fused RoPE's fewest bytes for q (B, H, T, D) and k (B, Hk, T, D), forward + backward (or
    the forward alone): q, k, q_embed and k_embed at `FUSED_BYTES_FACTOR["rope"]`, and cos and sin
    (a row per (b, t) position) read in each pass."""
    passes = 2 if backward else 1
    factor = FUSED_BYTES_FACTOR["rope"] if backward else FORWARD_BYTES_FACTOR["rope"]
    activations = 2 * (math.prod(q) + math.prod(k)) * element_bytes
    tables = passes * 2 * (math.prod(q) // max(q[1], 1)) * element_bytes
    return factor * activations + tables


def _forward_input_shapes(work: KernelWork, positions: np.ndarray) -> list[tuple[list[int], str]]:
    """The first tensor input of the ops of the forward kernels among `positions` (in launch order),
    each distinct op signature once."""
    positions = positions[work.phase[positions] == FORWARD]
    signatures = work.signature[positions]
    _, first = np.unique(signatures, return_index=True)
    out = []
    for signature in signatures[np.sort(first)].tolist():
        found = work.works[signature].first_input if signature >= 0 else None
        if found is not None:
            out.append(found)
    return out
