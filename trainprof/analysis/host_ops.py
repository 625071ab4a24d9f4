"""Question 5 for a trace with no GPU work: which host ops take the step's time.

A loop that ran on the CPU (no CUDA device, or a model left on the CPU) has no kernels to rank and
no launch overhead; its step is all host time, spent in the top-level ops of each thread.
"""

from __future__ import annotations

from collections import defaultdict

from trainprof.analysis.result import Finding
from trainprof.analysis.timeline import Timeline

TOP_N = 10
# How torch.profiler names a backward node's op; the finding says "backward of PowBackward0".
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def top_host_ops(timeline: Timeline) -> list[dict]:
    """Top-level `cpu_op`s (no enclosing op) inside the steps, by total time, largest first."""
    trace = timeline.trace
    ops = trace.events["cpu_op"]
    if not len(ops) or not timeline.steps:
        return []
    step_start = timeline.steps[0].start_us
    step_end = timeline.steps[-1].end_us
    total_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for thread in sorted(set(ops.thread.tolist())):
        frames = trace.frames(int(thread))
        for i, category in enumerate(frames.categories):
            if category != "cpu_op" or not step_start <= frames.starts[i] < step_end:
                continue
            parent = frames.parent[i]
            while parent >= 0 and frames.categories[parent] != "cpu_op":
                parent = frames.parent[parent]
            if parent >= 0:  # nested inside another op: its time is already counted there
                continue
            name = trace.names[int(frames.name_ids[i])].replace(_AUTOGRAD_NODE, "backward of ")
            total_us[name] += float(frames.ends[i] - frames.starts[i])
            count[name] += 1
    ranked = sorted(total_us.items(), key=lambda kv: -kv[1])[:TOP_N]
    return [{"op": name, "count": count[name], "total_ms": round(us / 1e3, 4)} for name, us in ranked]


def cpu_only_finding(timeline: Timeline, steps: list[dict], rank: int | None) -> Finding | None:
    """An info finding for a trace whose steps launched no GPU work: the host ops that fill the step."""
    if not steps or any(s["kernel_count"] or s["gpu_busy_ms"] for s in steps):
        return None
    ops = top_host_ops(timeline)
    step_ms = sum(s["duration_ms"] for s in steps) / len(steps)
    for op in ops:
        op["pct_of_step"] = round(100 * op["total_ms"] / len(steps) / max(step_ms, 1e-9), 2)
    head = ops[0] if ops else {"op": None, "pct_of_step": 0.0}
    return Finding(
        kind="cpu_only",
        title=(
            f"No GPU work in the profiled steps: the {step_ms:.1f} ms step is all host time"
            + (f"; {head['op']} takes {head['pct_of_step']:.0f}% of it" if head["op"] else "")
        ),
        severity="info",
        op=head["op"],
        where={"file": None, "line": None, "function": None},
        count=len(steps),
        per_step=1.0,
        cost_ms=round(step_ms * len(steps), 4),
        fix=(
            "If a GPU was meant to run this, move the model and each batch to it (model.to('cuda'), "
            "batch.to('cuda', non_blocking=True)). On the CPU: torch.compile the model, use larger "
            "batches, and check torch.get_num_threads() matches the cores you have."
        ),
        rank=rank,
        details={"top_host_ops": ops, "step_ms": round(step_ms, 4)},
    )
