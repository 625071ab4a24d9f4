"""Which `nn.Module` (or, outside every module, which user function) the GPU time and the tiny kernels
belong to: a cost table over the profiled steps, forward and backward together.

A kernel counts for its owner as `trainprof.analysis.attribution` finds it: the innermost module of
its launch (a backward kernel: of its forward op), so a module's row holds its own kernels, not those
of its children (a GPT-2 block's row holds its residual adds; its attention's projections are
`GPT2Attention/Conv1D`'s). Rows gather the instances of one module class path (the 12 blocks' attention
modules are one row). A kernel outside every module is owned by the innermost user function around
its launch (a backward kernel: around its forward op), e.g. a metric computed in the loop.
"""

from __future__ import annotations

import msgspec
import numpy as np

from trainprof.analysis.attribution import (
    BACKWARD,
    FORWARD,
    MODULE_PREFIX,
    OPTIMIZER,
    KernelOwners,
    ModuleRef,
    UserFrames,
)
from trainprof.analysis.frames import parse_py_frame
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.thresholds import MODULE_TABLE_ROWS, TOP_OPS_PER_OWNER
from trainprof.analysis.timeline import Timeline

_MODULE_CALL_FILE = "torch/nn/modules/module.py"  # `_call_impl` and friends: not the module's own code


class TinyOp(Record, frozen=True):
    """An op and how many tiny kernels (shorter than their launch) it launched for one owner."""

    op: str
    tiny_kernels: int


class OwnerRow(Record, frozen=True):
    """One owner's kernels per profiled step, as the module-costs finding lists them
    (`OwnerCost.row`): `module` is the short label of a module row (None for a function's row),
    `path` its class path; `summary` the owner's `OwnerCost.sentence`."""

    module: str | None
    path: str | None
    function: str | None
    file: str | None
    line: int | None
    phases: str
    instances: int
    kernels_per_step: float
    forward_kernels_per_step: float
    backward_kernels_per_step: float
    optimizer_kernels_per_step: float
    gpu_ms_per_step: float
    tiny_kernels_per_step: float
    tiny_kernel_pct: float
    top_ops: list[TinyOp]
    summary: str


class OwnerCost(msgspec.Struct):
    """The kernels of one owner over the profiled steps (totals; `row` divides by the step count).

    `module_path` is a module class path (`GPT2LMHeadModel/GPT2Model/GPT2Block/GPT2Attention`) or None
    for a user function's row (`function`); `label` is the short name reports show (the class, or the
    last two parts of the path where two rows share a class); `file`/`line` the module's `forward`
    (its first line) or the function's file. `tiny_ops` counts tiny kernels by forward op.
    """

    label: str
    module_path: str | None
    function: str | None
    file: str | None
    line: int | None
    instances: int
    kernels: int
    forward_kernels: int
    backward_kernels: int
    optimizer_kernels: int
    tiny_kernels: int
    gpu_us: float
    tiny_ops: list[TinyOp] = msgspec.field(default_factory=list)

    @property
    def phases(self) -> str:
        """The phases its kernels ran in, joined by `+`: `fwd`, `bwd`, `opt`, and `other` for kernels
        outside all three (e.g. a metric computed in the loop)."""
        other = self.kernels - self.forward_kernels - self.backward_kernels - self.optimizer_kernels
        counts = (
            ("fwd", self.forward_kernels),
            ("bwd", self.backward_kernels),
            ("opt", self.optimizer_kernels),
            ("other", other),
        )
        return "+".join(name for name, count in counts if count) or "other"

    def sentence(self, steps: int) -> str:
        """E.g. `GPT2Attention (fwd+bwd): 210 kernels/step, 61% shorter than their launch, 3.1 ms of GPU
        time per step`."""
        n = max(steps, 1)
        return (
            f"{self.label} ({self.phases}): {self.kernels / n:.0f} kernels/step, "
            f"{100.0 * self.tiny_kernels / max(self.kernels, 1):.0f}% shorter than their launch, "
            f"{self.gpu_us / n / 1e3:.1f} ms of GPU time per step"
        )

    def row(self, steps: int) -> OwnerRow:
        """Per-step figures, rounded for display (reports print them as they are)."""
        n = max(steps, 1)
        return OwnerRow(
            module=self.label if self.module_path else None,
            path=self.module_path,
            function=self.function,
            file=self.file,
            line=self.line,
            phases=self.phases,
            instances=self.instances,
            kernels_per_step=round(self.kernels / n, 1),
            forward_kernels_per_step=round(self.forward_kernels / n, 1),
            backward_kernels_per_step=round(self.backward_kernels / n, 1),
            optimizer_kernels_per_step=round(self.optimizer_kernels / n, 1),
            gpu_ms_per_step=round(self.gpu_us / n / 1e3, 4),
            tiny_kernels_per_step=round(self.tiny_kernels / n, 1),
            tiny_kernel_pct=round(100.0 * self.tiny_kernels / max(self.kernels, 1), 1),
            top_ops=self.tiny_ops,
            summary=self.sentence(steps),
        )


class OwnerCosts(msgspec.Struct):
    """Every owner's row (sorted by GPU time), and what no owner was found for (kernels in steps):
    `unowned_tiny_ops` counts the unowned tiny kernels by forward op (a trace without Python stacks
    has no owners, but its kernels still have ops)."""

    rows: list[OwnerCost]
    steps: int
    kernels: int
    tiny_kernels: int
    unowned_kernels: int
    unowned_tiny_kernels: int
    unowned_tiny_ops: list[TinyOp] = msgspec.field(default_factory=list)

    @property
    def modules(self) -> list[OwnerCost]:
        """The module rows."""
        return [row for row in self.rows if row.module_path is not None]

    def most_tiny(self) -> OwnerCost | None:
        """The owner that launched the most tiny kernels (None when no tiny kernel has one)."""
        best = max(self.rows, key=lambda row: row.tiny_kernels, default=None)
        return best if best is not None and best.tiny_kernels else None


def owner_costs(timeline: Timeline, owners: KernelOwners, tiny: np.ndarray) -> OwnerCosts:
    """Group the kernels launched inside the profiled steps by owner (see the module docstring).

    `tiny`: per kernel, whether it ran shorter than its launch (`trainprof.analysis.launch.tiny_kernels`).
    """
    trace, kernels = timeline.trace, timeline.kernels
    steps = len(timeline.steps)
    in_steps = np.flatnonzero(timeline.kernel_step >= 0)

    # Owner groups: one per module class path, then one per user function.
    class_paths: dict[str, int] = {}
    group_of_ref = np.asarray(
        [class_paths.setdefault(ref.class_path, len(class_paths)) for ref in owners.modules] + [-1],
        dtype=np.int64,
    )
    group = group_of_ref[owners.module[in_steps]]  # -1 indexes the trailing -1: no module
    functions: dict[tuple[str, str], int] = {}
    outside = np.flatnonzero(group < 0)
    if len(outside):
        k = in_steps[outside]
        sites = (owners.site_thread[k], owners.site_start_us[k], owners.site_end_us[k])
        frames = UserFrames(trace).innermost(*sites)
        for position, frame in zip(outside.tolist(), frames, strict=True):
            if frame is not None:
                group[position] = len(class_paths) + functions.setdefault(
                    (frame.function, frame.file), len(functions)
                )

    groups = len(class_paths) + len(functions)
    owned = group >= 0
    g = group[owned]
    k = in_steps[owned]
    phase = owners.phase[k]
    is_tiny = tiny[k]
    count = np.bincount(g, minlength=groups)
    forward = np.bincount(g[phase == FORWARD], minlength=groups)
    backward = np.bincount(g[phase == BACKWARD], minlength=groups)
    optimizer = np.bincount(g[phase == OPTIMIZER], minlength=groups)
    tiny_count = np.bincount(g[is_tiny], minlength=groups)
    gpu_us = np.bincount(g, weights=kernels.dur_us[k], minlength=groups)
    tiny_ops = _tiny_ops(g[is_tiny], owners.op[k[is_tiny]], owners.ops)
    instances = np.zeros(groups, dtype=np.int64)
    first_ref: dict[int, ModuleRef] = {}
    for ref, group_id in zip(owners.modules, group_of_ref[:-1].tolist(), strict=True):
        instances[group_id] += 1
        first_ref.setdefault(group_id, ref)

    def figures(group_id: int) -> tuple:
        """The counting fields of `OwnerCost` for one group, in field order."""
        return (
            int(count[group_id]),
            int(forward[group_id]),
            int(backward[group_id]),
            int(optimizer[group_id]),
            int(tiny_count[group_id]),
            float(gpu_us[group_id]),
            tiny_ops.get(group_id, []),
        )

    labels = _labels(list(class_paths))
    rows = []
    for path, group_id in class_paths.items():
        if not count[group_id]:
            continue
        file, line = _module_source(trace, first_ref[group_id])
        rows.append(
            OwnerCost(labels[path], path, None, file, line, int(instances[group_id]), *figures(group_id))
        )
    for (function, file), number in functions.items():
        group_id = len(class_paths) + number
        rows.append(OwnerCost(function, None, function, file, None, 1, *figures(group_id)))
    rows.sort(key=lambda row: -row.gpu_us)
    unowned_tiny = in_steps[~owned][tiny[in_steps[~owned]]]
    unowned_ops = _tiny_ops(np.zeros(len(unowned_tiny), dtype=np.int64), owners.op[unowned_tiny], owners.ops)
    return OwnerCosts(
        rows=rows,
        steps=steps,
        kernels=int(in_steps.size),
        tiny_kernels=int(tiny[in_steps].sum()),
        unowned_kernels=int((~owned).sum()),
        unowned_tiny_kernels=int(unowned_tiny.size),
        unowned_tiny_ops=unowned_ops.get(0, []),
    )


def _tiny_ops(group: np.ndarray, op: np.ndarray, names: list[str]) -> dict[int, list[TinyOp]]:
    """Per owner group, its ops by tiny-kernel count (most first, at most TOP_OPS_PER_OWNER)."""
    out: dict[int, list[TinyOp]] = {}
    known = op >= 0
    if not known.any():
        return out
    # (group, op) pairs as one code, in (group, op) order: np.unique over pairs (axis=1) sorts
    # them as raw bytes: 5-7M instructions a trace for ~10^3 tiny kernels.
    width = len(names) + 1
    codes, counts = np.unique(group[known].astype(np.int64) * width + op[known], return_counts=True)
    pair_group, pair_op = codes // width, codes % width
    for index in np.lexsort((-counts, pair_group)).tolist():  # by group, then count descending
        ops = out.setdefault(int(pair_group[index]), [])
        if len(ops) < TOP_OPS_PER_OWNER:
            ops.append(TinyOp(names[int(pair_op[index])], int(counts[index])))
    return out


def _labels(paths: list[str]) -> dict[str, str]:
    """Each class path's short name: its class, or its last two parts where two paths end in one class."""
    leaf = [path.rsplit("/", 1)[-1] for path in paths]
    return {
        path: (name if leaf.count(name) == 1 else "/".join(path.split("/")[-2:]))
        for path, name in zip(paths, leaf, strict=True)
    }


def _module_source(trace, ref: ModuleRef) -> tuple[str | None, int | None]:
    """The file and first line of a module's `forward` (`transformers/models/gpt2/modeling_gpt2.py`, 144):
    the first `forward` frame inside one call of it before any child module's call (decorators such
    as transformers' `wrapper` come first), else its first frame outside `torch/nn/modules/module.py`."""
    python = trace.events["python_function"]
    lo, hi = np.searchsorted(python.start_us, [ref.start_us, ref.end_us], side="left")
    threads = python.thread[lo:hi].tolist()
    fallback: tuple[str | None, int | None] = (None, None)
    for offset, thread in enumerate(threads):
        if thread != ref.thread or offset == 0:
            continue
        name = trace.names[int(python.name[lo + offset])]
        if name.startswith(MODULE_PREFIX):
            break
        frame = parse_py_frame(name)
        if frame is None or frame.file.endswith(_MODULE_CALL_FILE):
            continue
        if frame.function == "forward":
            return frame.file, frame.line
        if fallback[0] is None:
            fallback = (frame.file, frame.line)
    return fallback


class ModuleCostsDetails(Record, frozen=True):
    """The module-costs finding's evidence: the module rows by GPU time, the user functions owning
    kernels outside every module, and the share of kernels (tiny kernels) that have an owner."""

    modules: list[OwnerRow]
    functions: list[OwnerRow]
    owned_kernel_pct: float
    owned_tiny_kernel_pct: float
    unowned_kernels_per_step: float


def module_costs_finding(costs: OwnerCosts, rank: int | None) -> Finding | None:
    """The per-module cost table as an `info` finding (None for a trace without `nn.Module` frames)."""
    modules = costs.modules
    if not modules:
        return None
    n = max(costs.steps, 1)
    top = modules[0]
    module_kernels = sum(row.kernels for row in modules)
    module_gpu_us = sum(row.gpu_us for row in modules)
    owned = costs.kernels - costs.unowned_kernels
    owned_tiny = costs.tiny_kernels - costs.unowned_tiny_kernels
    return Finding(
        kind="module_costs",
        title=f"GPU time by nn.Module (forward + backward): most in {top.sentence(costs.steps)}",
        severity="info",
        op=None,
        where=Where(file=top.file, line=top.line, function=f"{top.label} ({top.phases})"),
        count=module_kernels,
        per_step=round(module_kernels / n, 2),
        cost_ms=round(module_gpu_us / 1e3, 4),
        fix=None,
        rank=rank,
        details=ModuleCostsDetails(
            modules=[row.row(costs.steps) for row in modules[:MODULE_TABLE_ROWS]],
            functions=[row.row(costs.steps) for row in costs.rows if row.module_path is None][
                :MODULE_TABLE_ROWS
            ],
            owned_kernel_pct=round(100.0 * owned / max(costs.kernels, 1), 1),
            owned_tiny_kernel_pct=round(100.0 * owned_tiny / max(costs.tiny_kernels, 1), 1),
            unowned_kernels_per_step=round(costs.unowned_kernels / n, 1),
        ),
    )
