"""Which Python call makes the caching allocator go to the driver in the steady state?

PyTorch's caching allocator keeps freed blocks for reuse, so a warm loop calls `cudaMalloc` and
`cudaFree` (both synchronize the device) almost never. When it does so every step, something in the
loop empties the cache or outgrows it: `torch.cuda.empty_cache()` (the frees run inside it and the
next step's ops re-allocate what it released), a memory-stat reset, or shapes that change each step.
From the trace's Python stacks, each blocking allocator call is given the torch memory API function
around it (`torch/cuda/memory.py empty_cache`) and the user's frame that called it, so the
blocking-call finding names `torch.cuda.empty_cache()` at the user's line instead of the op that
happened to allocate next.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.arrays import distinct
from trainprof.analysis.attribution import UserFrames
from trainprof.analysis.frames import parse_py_frame
from trainprof.analysis.records import Record, Where
from trainprof.analysis.runtime_calls import KINDS
from trainprof.analysis.timeline import Timeline
from trainprof.trace.model import FRAME_CATEGORIES

# torch's Python functions that hand cached blocks back to the driver (or make it allocate anew):
# file pattern -> how the user calls it.
_MEMORY_APIS = re.compile(r"torch/cuda/memory\.py\(\d+\): (\w+)$")
_API_CALL = {
    "empty_cache": "torch.cuda.empty_cache()",
    "reset_peak_memory_stats": "torch.cuda.reset_peak_memory_stats()",
    "set_per_process_memory_fraction": "torch.cuda.set_per_process_memory_fraction()",
}

ALLOCATOR_FIXES = {
    "torch.cuda.empty_cache()": (
        "Remove torch.cuda.empty_cache() from the loop: it hands the cached blocks back to the driver "
        "(a synchronizing cudaFree each) and the next step allocates them again (a synchronizing "
        "cudaMalloc each). Call it only between phases (after evaluation, before a checkpoint), or set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True if it was there against fragmentation."
    ),
}


class AllocatorCalls(Record, frozen=True):
    """Blocking allocator calls (cudaMalloc/cudaFree and kin) inside the steps, and what caused them.

    `python_call`: the torch memory API around the frees (`torch.cuda.empty_cache()`), None when none
    is seen; `where`: the user's frame that called it (else the user's frame behind the most allocator
    time); `api_steps`: the steps the API ran in; per step: `free_calls`, `alloc_calls`, the host ms
    in them (`free_ms`, `alloc_ms`) and the GPU idle inside them (`gpu_idle_ms`).
    """

    python_call: str | None
    where: Where
    api_steps: int
    free_calls_per_step: float
    alloc_calls_per_step: float
    free_ms_per_step: float
    alloc_ms_per_step: float
    gpu_idle_ms_per_step: float

    @property
    def fix(self) -> str | None:
        """The fix for the named Python call, None when the call is unknown."""
        return ALLOCATOR_FIXES.get(self.python_call or "")


def allocator_calls(timeline: Timeline) -> AllocatorCalls | None:
    """The steps' blocking allocator calls and the Python call behind them (module docstring); None
    when the steps make none."""
    calls = timeline.calls
    kind = timeline.call_kind
    allocating = (kind == KINDS.index("alloc")) | (kind == KINDS.index("free"))
    rows = np.flatnonzero(allocating)
    if not len(rows):
        return None
    rows = rows[timeline.step_of(calls.start_us[rows]) >= 0]
    if not len(rows):
        return None
    trace = timeline.trace
    n = max(len(timeline.steps), 1)
    is_free = timeline.call_kind[rows] == KINDS.index("free")
    starts, ends = calls.start_us[rows], calls.end_us[rows]
    idle_ms = float(((ends - starts) - timeline.gpu_busy.covered(starts, ends)).sum()) / 1e3

    # The memory API frame around each call, per thread (a vectorised walk up the frames).
    api_name = np.array([_api_of(name) for name in trace.names], dtype=object)
    api = np.full(len(rows), None, dtype=object)
    api_frame_start = np.full(len(rows), np.nan)
    threads = calls.thread[rows]
    python_code = FRAME_CATEGORIES.index("python_function")
    for thread in distinct(threads).tolist():
        on = np.flatnonzero(threads == thread)
        frames = trace.frames(int(thread))
        marked = (frames.category_codes == python_code) & (api_name[frames.name_ids] != None)  # noqa: E711
        found = frames.nearest_marked(frames.innermost_of(starts[on], ends[on]), marked)
        hit = found >= 0
        api[on[hit]] = api_name[frames.name_ids[found[hit]]]
        api_frame_start[on[hit]] = frames.starts[found[hit]]

    # The API behind the frees, if any; its user caller; the steps it ran in.
    named = [a for a in api[is_free].tolist() if a is not None] or [a for a in api.tolist() if a is not None]
    python_call = max(sorted(set(named)), key=named.count) if named else None
    users = UserFrames(trace)
    if python_call is not None:
        at = np.flatnonzero(api == python_call)
        api_steps = len(set(timeline.step_of(api_frame_start[at]).tolist()))
        probe = at[:1]
    else:
        api_steps = 0
        probe = np.array([int(np.argmax(ends - starts))])
    frame = users.innermost(threads[probe].astype(np.int64), starts[probe], ends[probe])[0]
    where = Where(file=frame.file, line=frame.line, function=frame.function) if frame else Where()
    return AllocatorCalls(
        python_call=python_call,
        where=where,
        api_steps=api_steps,
        free_calls_per_step=round(float(is_free.sum()) / n, 2),
        alloc_calls_per_step=round(float((~is_free).sum()) / n, 2),
        free_ms_per_step=round(float((ends - starts)[is_free].sum()) / 1e3 / n, 4),
        alloc_ms_per_step=round(float((ends - starts)[~is_free].sum()) / 1e3 / n, 4),
        gpu_idle_ms_per_step=round(idle_ms / n, 4),
    )


def _api_of(name: str) -> str | None:
    """`torch.cuda.empty_cache()` for a frame `torch/cuda/memory.py(212): empty_cache`, else None."""
    if "torch/cuda/memory.py" not in name:
        return None
    found = _MEMORY_APIS.search(name)
    if found is None or parse_py_frame(name) is None:
        return None
    return _API_CALL.get(found.group(1), f"torch.cuda.{found.group(1)}()")


def allocator_title(calls: AllocatorCalls) -> str:
    """How the blocking-call finding names the allocator's calls and the Python call behind them."""
    where = calls.where
    at = ""
    if where.file:
        at = f" at {where.file}" + (f":{where.line}" if where.line is not None else "")
        at += f" ({where.function})" if where.function else ""
    if calls.python_call is None:
        return (
            f"{calls.alloc_calls_per_step:g} cudaMalloc and {calls.free_calls_per_step:g} cudaFree per step"
            + (f", most allocator time under the user's code{at}" if at else "")
        )
    return (
        f"{calls.free_calls_per_step:g} cudaFree per step inside {calls.python_call}{at} "
        f"(in {calls.api_steps} steps), and {calls.alloc_calls_per_step:g} cudaMalloc per step "
        f"allocating again what it released"
    )
