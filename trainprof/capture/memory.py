"""What the caching allocator holds, caught while the loop runs: at each recorded window's end, at an
out-of-memory error, and (on request) its whole history during a window. The session writes it
beside its traces as `<worker>.memory.json` (`trainprof.trace.memory_file`, the typed records) and
`<worker>.memory_history.pickle`.

An out-of-memory error is read twice, cheaply, and never changed:
- at the failing allocation itself, by the allocator's out-of-memory callback
  (`torch._C._cuda_attach_out_of_memory_observer`, installed once per process and never removed,
  inert outside a session): the allocator's statistics and segments at that moment, before the
  error unwinds the frames that hold the step's tensors. The callback runs for every failed
  allocation, a cuDNN algorithm's workspace that the op then does without included, so it only
  keeps the latest state (at most `OBSERVED_STATES` reads per session; later ones keep the sizes the
  allocator passes);
- as the error leaves the loop (`MemoryCapture.on_error`, from the session's exit): the message's
  figures (`parse_message`), where it was raised (the traceback: the user's line, the call that
  allocated, the innermost `nn.Module`, the outermost module call's tensor arguments), what the
  optimizer's parameters, gradients and state hold on that device, and the history when one was
  being recorded. The exception object and its traceback are only read.

Only the first error of a session is recorded, and nothing here allocates on the GPU: handling one
out-of-memory error can never raise another. Every torch call is guarded; a failure here loses the
figure it was reading, never the user's run. Imports no torch at import time.
"""

from __future__ import annotations

import linecache
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from trainprof.files import MEMORY_HISTORY_SUFFIX, MEMORY_SUFFIX
from trainprof.trace.memory_file import (
    FORMAT_VERSION,
    MAX_LIST,
    AllocatorState,
    AllocatorStats,
    CodeLine,
    DeviceMemory,
    HeldByTraining,
    HistorySeries,
    MemoryFile,
    MemoryHistory,
    OutOfMemory,
    SegmentSummary,
    StepMark,
    TensorInput,
    encode,
)

logger = logging.getLogger("trainprof")

OBSERVED_STATES = 16
"""Allocator states read by the out-of-memory callback per session: a convolution that tries
algorithms runs out several times per step and goes on; reading the segments costs ~1 ms per
thousand, so a loop that fails allocations in every step pays at most this many."""
LARGEST_SEGMENTS_KEPT = 8
"""Segment sizes kept per allocator state, largest first (the rest are counted)."""
MESSAGE_CHARS = 4096
"""An error message kept, at most (PyTorch's out-of-memory message is ~600 characters)."""
SOURCE_CHARS = 200
"""A source line kept in a frame, at most."""
INPUTS_KEPT = 16
"""Tensor arguments kept of the outermost module call (a batch has a handful)."""
DEFAULT_HISTORY_ENTRIES = 100_000
"""Allocator history entries kept by `session(memory_history=True)`: a Llama-8B step makes ~20,000
allocations and frees; each entry with its Python stack is ~1 kB in the pickle."""
HISTORY_POINTS = 400
"""Points of the history's totals written into `<worker>.memory.json` (report.html draws them ~1,000
pixels wide): each of 200 slices of the entries keeps its highest and lowest allocated total."""
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""Where the allocator's settings come from (the second is torch 2.9's device-generic name)."""

_BYTE_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([0-9][0-9.,]*) (bytes|KiB|MiB|GiB|TiB)"
MESSAGE_FIELDS: tuple[tuple[str, str], ...] = (
    ("requested_bytes", rf"Tried to allocate {_SIZE}"),
    ("device_index", r"\bGPU ([0-9]{1,5}) has a total capacity"),
    ("device_total_bytes", rf"total capacity of {_SIZE}"),
    ("device_free_bytes", rf"of which {_SIZE} is free"),
    ("process_bytes", rf"this process has {_SIZE} memory in use"),
    ("allocated_bytes", rf"{_SIZE} is allocated by PyTorch"),
    ("reserved_unallocated_bytes", rf"{_SIZE} is reserved by PyTorch but unallocated"),
)
"""The figures of PyTorch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp, torch 2.x),
one pattern each: `CUDA out of memory. Tried to allocate 2.75 GiB. GPU 0 has a total capacity of
139.81 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB
memory in use. Of the allocated memory 134.47 GiB is allocated by PyTorch, and 2.90 GiB is reserved
by PyTorch but unallocated. ...`. Sizes are printed to two decimals: parsed, they are within 0.5%
of the true bytes."""
_OUT_OF_MEMORY_TEXT = re.compile(r"\b(CUDA|HIP|XPU|MPS)? ?out of memory", re.IGNORECASE)


def is_out_of_memory(error: BaseException | None) -> bool:
    """Whether `error` is a device out-of-memory error: `torch.OutOfMemoryError` (what
    `torch.cuda.OutOfMemoryError` is) or a subclass, or a RuntimeError whose message says so
    (older torch, custom kernels that re-raise it)."""
    if error is None:
        return False
    for cls in type(error).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
            return True
    return isinstance(error, RuntimeError) and bool(_OUT_OF_MEMORY_TEXT.search(str(error)[:MESSAGE_CHARS]))


class MessageFigures(NamedTuple):
    """What an out-of-memory message says (`MESSAGE_FIELDS`), None where it does not say it."""

    requested_bytes: int | None = None
    device_index: int | None = None
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    process_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None


def parse_message(message: str) -> MessageFigures:
    """The figures of an out-of-memory message (`MESSAGE_FIELDS`)."""
    found: dict[str, int] = {}
    text = message[:MESSAGE_CHARS]
    for name, pattern in MESSAGE_FIELDS:
        match = re.search(pattern, text)
        if match is None:
            continue
        if match.lastindex == 1:
            found[name] = int(match.group(1))
        else:
            value = float(match.group(1).replace(",", ""))
            if math.isfinite(value):
                found[name] = round(value * _BYTE_UNITS[match.group(2)])
    return MessageFigures(**found)


def allocator_stats(stats: Mapping[str, Any]) -> AllocatorStats | None:
    """The figures trainprof keeps of a `torch.cuda.memory_stats()` dict; None when it lacks the
    allocated and reserved totals (a device that was never used)."""

    def get(key: str) -> int:
        value = stats.get(key, 0)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return int(value) if number and value > 0 else 0

    if "allocated_bytes.all.current" not in stats or "reserved_bytes.all.current" not in stats:
        return None
    return AllocatorStats(
        allocated_bytes=get("allocated_bytes.all.current"),
        allocated_peak_bytes=get("allocated_bytes.all.peak"),
        reserved_bytes=get("reserved_bytes.all.current"),
        reserved_peak_bytes=get("reserved_bytes.all.peak"),
        inactive_split_bytes=get("inactive_split_bytes.all.current"),
        segments=get("segment.all.current"),
        num_alloc_retries=get("num_alloc_retries"),
        num_ooms=get("num_ooms"),
        num_device_alloc=get("num_device_alloc"),
        num_device_free=get("num_device_free"),
    )


def segment_summary(segments: Iterable[Mapping[str, Any]], device: int | None = None) -> SegmentSummary:
    """The segments of a `torch.cuda.memory_snapshot()` (those of `device`, if given) in a few figures
    (`SegmentSummary`): a free block is one whose `state` is `inactive`."""
    count = reserved = allocated = largest_free = free_blocks = 0
    expandable = False
    sizes: list[int] = []
    for segment in segments:
        if device is not None and segment.get("device", device) != device:
            continue
        count += 1
        total = int(segment.get("total_size", 0) or 0)
        sizes.append(total)
        reserved += total
        allocated += int(segment.get("allocated_size", 0) or 0)
        expandable = expandable or bool(segment.get("is_expandable", False))
        for block in segment.get("blocks", ()) or ():
            if block.get("state") == "inactive":
                free_blocks += 1
                largest_free = max(largest_free, int(block.get("size", 0) or 0))
    sizes.sort(reverse=True)
    return SegmentSummary(
        count=count,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        largest_free_block_bytes=largest_free,
        free_blocks=free_blocks,
        expandable=expandable,
        largest_segment_bytes=sizes[:LARGEST_SEGMENTS_KEPT],
    )


_ALLOCATED_DELTA: dict[str | None, int] = {"alloc": 1, "free_completed": -1}
"""How each history entry's `action` changes the allocated total (the size counts as freed once the
allocator may reuse it, as `torch.cuda.memory_allocated` counts it)..."""
_RESERVED_DELTA: dict[str | None, int] = {
    "segment_alloc": 1, "segment_free": -1, "segment_map": 1, "segment_unmap": -1,
}
"""...and the reserved total (expandable segments map and unmap pages instead)."""


def history_series(
    entries: list[Mapping[str, Any]], allocated_now: int, reserved_now: int, points: int = HISTORY_POINTS
) -> HistorySeries | None:
    """The allocated and reserved totals after each entry of one device's history (its `device_traces`
    list, oldest first), anchored on the totals now (what the allocator held before the history began
    is the difference), at most `points` of them: of each of `points // 2` slices of the entries the
    highest and the lowest allocated total. None without timed entries."""
    timed = [entry for entry in entries if isinstance(entry.get("time_us"), int)]
    if not timed:
        return None
    allocated: list[int] = []
    reserved: list[int] = []
    total_allocated = total_reserved = 0
    oom_time = None
    for entry in timed:
        action = entry.get("action")
        size = int(entry.get("size", 0) or 0)
        total_allocated += _ALLOCATED_DELTA.get(action, 0) * size
        total_reserved += _RESERVED_DELTA.get(action, 0) * size
        allocated.append(total_allocated)
        reserved.append(total_reserved)
        if action == "oom" and oom_time is None:
            oom_time = int(entry["time_us"])
    allocated_before = allocated_now - total_allocated
    reserved_before = reserved_now - total_reserved
    keep = _extremes(allocated, points)
    return HistorySeries(
        time_us=[max(int(timed[i]["time_us"]), 0) for i in keep],
        allocated_bytes=[max(allocated[i] + allocated_before, 0) for i in keep],
        reserved_bytes=[max(reserved[i] + reserved_before, 0) for i in keep],
        entries=len(timed),
        oom_time_us=oom_time,
    )


def _extremes(values: list[int], points: int) -> list[int]:
    """Indices of `values` to keep, in order: all of them up to `points`, else the highest and lowest
    of each of `points // 2` equal slices."""
    n = len(values)
    if n <= points:
        return list(range(n))
    slices = max(points // 2, 1)
    keep: set[int] = set()
    for k in range(slices):
        lo, hi = k * n // slices, (k + 1) * n // slices
        if hi > lo:
            part = range(lo, hi)
            keep.add(max(part, key=values.__getitem__))
            keep.add(min(part, key=values.__getitem__))
    return sorted(keep)


class FailingCall(NamedTuple):
    """Where an error was raised, from its traceback (`failing_call`)."""

    where: CodeLine | None
    call: CodeLine | None
    module: str | None
    inputs: list[TensorInput]


def failing_call(traceback: TracebackType | None, is_user_file: Any = None) -> FailingCall:
    """From a traceback (outermost frame first): the innermost frame of the user's code
    (`is_user_file(path) -> bool`; default `trainprof.user_code.is_user_file`), the innermost frame
    (the call that allocated), the `nn.Module` class path of the frames whose `self` is a module
    (outermost first), and the tensor arguments of the outermost such call (its `forward`'s
    parameters, and the tensors of a `**kwargs`), else (an error in the backward pass or the
    optimizer: no module frame) the tensors the user's innermost frame holds. Reads the frames'
    locals; keeps no reference."""
    if is_user_file is None:
        from trainprof.user_code import current_layout
        from trainprof.user_code import is_user_file as is_user

        layout = current_layout()

        def is_user_file(path: str) -> bool:
            return is_user(path, layout)

    frames = []
    while traceback is not None:
        frames.append((traceback.tb_frame, traceback.tb_lineno))
        traceback = traceback.tb_next
    where = call = user_frame = None
    modules: list[str] = []
    inputs: list[TensorInput] | None = None
    outermost = None
    module_type = _module_type()
    for frame, line in frames:
        owner = frame.f_locals.get("self") if module_type is not None else None
        if owner is not None and isinstance(owner, module_type):
            # The outermost module's `forward`: its parameters name the batch (`input_ids`, `labels`),
            # where torch's own `_call_impl` frames around it hold them as `*args`, `**kwargs` (read
            # those when the error came before any `forward`: in a forward pre-hook).
            outermost = outermost or frame
            if inputs is None and frame.f_code.co_name == "forward":
                inputs = _tensor_arguments(frame)
            name = type(owner).__name__
            if not modules or modules[-1] != name:  # a module calling its own helper methods counts once
                modules.append(name)
        if is_user_file(frame.f_code.co_filename):
            where, user_frame = _code_line(frame, line), frame
    if frames:
        call = _code_line(*frames[-1])
    if inputs is None and outermost is not None:
        inputs = _tensor_arguments(outermost)
    if inputs is None and user_frame is not None:
        inputs = _tensors_in(list(user_frame.f_locals.items()))
    return FailingCall(where, call, "/".join(modules) or None, inputs or [])


def _module_type() -> Any:
    try:
        import torch

        return torch.nn.Module
    except Exception:  # no torch: no module frames to name
        return None


def _code_line(frame: Any, line: int) -> CodeLine:
    file = frame.f_code.co_filename
    return CodeLine(file=file[-MESSAGE_CHARS:], line=line, function=frame.f_code.co_name[:SOURCE_CHARS])


def source_of(line: CodeLine | None) -> str | None:
    """The source text of a frame's line (stripped, cut to `SOURCE_CHARS`), None when unreadable."""
    if line is None or not line.file or line.line is None:
        return None
    text = linecache.getline(line.file, line.line).strip()
    return text[:SOURCE_CHARS] or None


def _tensor_arguments(frame: Any) -> list[TensorInput]:
    """The tensors among a call's parameters (and inside its `*args` and `**kwargs`), by name."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    varargs = bool(code.co_flags & 0x04)  # CO_VARARGS: *args follows the named parameters
    if varargs:
        names.append(code.co_varnames[count])
    if code.co_flags & 0x08:  # CO_VARKEYWORDS: **kwargs after *args
        names.append(code.co_varnames[count + varargs])
    scope = frame.f_locals
    return _tensors_in([(name, scope.get(name)) for name in names])


def _tensors_in(named: list[tuple[str, Any]]) -> list[TensorInput]:
    """The tensors among (name, value) pairs, and inside those values that are dicts or tuples
    (`**kwargs`, `*args`, a batch dict), at most `INPUTS_KEPT`."""
    import torch

    found: list[TensorInput] = []
    for name, value in named:
        if isinstance(value, dict):
            values = list(value.items())
        elif isinstance(value, tuple):
            values = [(f"{name}[{i}]", item) for i, item in enumerate(value)]
        else:
            values = [(name, value)]
        for key, item in values:
            if isinstance(item, torch.Tensor) and len(found) < INPUTS_KEPT:
                found.append(TensorInput(name=str(key)[:SOURCE_CHARS], shape=[int(d) for d in item.shape],
                                         dtype=str(item.dtype).removeprefix("torch.")))
    return found


def held_by_optimizer(optimizer: Any, device: Any = None) -> HeldByTraining | None:
    """What an optimizer's parameters, their gradients and its state hold on `device` (a
    `torch.device`; None: every device), each storage counted once; None when it cannot be read."""
    try:
        import torch

        seen: set[tuple[Any, int]] = set()

        def size(tensor: Any) -> int:
            if not isinstance(tensor, torch.Tensor) or (device is not None and tensor.device != device):
                return 0
            storage = tensor.untyped_storage()
            key = (tensor.device, storage.data_ptr())
            if key in seen:
                return 0
            seen.add(key)
            return int(storage.nbytes())

        params = [p for group in optimizer.param_groups for p in group["params"]]
        parameters = sum(size(p) for p in params)
        gradients = sum(size(p.grad) for p in params if p.grad is not None)
        state = sum(size(value) for per_param in optimizer.state.values() for value in per_param.values())
        return HeldByTraining(
            parameters_bytes=parameters, gradients_bytes=gradients, optimizer_state_bytes=state)
    except Exception:
        logger.debug("trainprof: reading the optimizer's memory failed", exc_info=True)
        return None


def alloc_conf() -> str | None:
    """The allocator's settings the process started with (`ALLOC_CONF_VARIABLES`), None when unset."""
    values = [os.environ[name] for name in ALLOC_CONF_VARIABLES if os.environ.get(name)]
    return ",".join(values)[:MESSAGE_CHARS] or None


def read_state(
    steps_ended: int, trace: str | None = None, device: int | None = None
) -> AllocatorState | None:
    """The allocator's statistics and segments on `device` (default: the current one) now; None
    when CUDA was never initialised in this process (nothing allocated: nothing to read)."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return None
        device = torch.cuda.current_device() if device is None else device
    except Exception:
        return None
    stats = segments = None
    try:
        stats = allocator_stats(torch.cuda.memory_stats(device))
    except Exception:
        logger.debug("trainprof: reading the allocator's statistics failed", exc_info=True)
    try:
        segments = segment_summary(_segments(torch), device)
    except Exception:
        logger.debug("trainprof: reading the allocator's segments failed", exc_info=True)
    return AllocatorState(steps_ended=steps_ended, trace=trace, stats=stats, segments=segments)


def _segments(torch: Any) -> list:
    try:  # without the history's frames: they are what makes a snapshot slow
        return torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:  # torch before include_traces
        return torch.cuda.memory_snapshot()


class _Observed(NamedTuple):
    """What the out-of-memory callback saw: the device, the failing allocation's size, the device's
    free bytes as the allocator passes them, and the state it read (or None)."""

    device: int
    requested_bytes: int
    device_free_bytes: int
    state: AllocatorState | None


class MemoryCapture:
    """One session's allocator capture (module docstring): window-end states, the first
    out-of-memory error, and the history of the first recorded window on request."""

    def __init__(self, history: bool = False, history_entries: int = DEFAULT_HISTORY_ENTRIES) -> None:
        self.windows: list[AllocatorState] = []
        self.out_of_memory: OutOfMemory | None = None
        self.history: MemoryHistory | None = None
        self._history_wanted = history
        self._history_entries = history_entries
        self._history_on = False
        self._history_marks: list[StepMark] = []
        self._observed: _Observed | None = None
        self._observed_reads = 0
        self._observing = False  # inside the callback: an error raised by its own reads is not another

    @property
    def captured(self) -> bool:
        """Whether there is anything to write."""
        return bool(self.windows or self.out_of_memory is not None or self.history is not None)

    # -- while the loop runs ------------------------------------------------------------------

    def follow(self, action: str, steps_ended: int) -> None:
        """At each step's start (`action`: the schedule's for it, `SessionConfig.action_at`): start
        the history with the first recorded step; mark each step's start while it records."""
        if not self._history_wanted:
            return
        if self._history_on:
            self._mark(steps_ended)
        elif self.history is None and action in ("record", "save"):
            self._start_history()
            self._mark(steps_ended)

    def window_ended(self, run_dir: Path, worker: str, trace: str, steps_ended: int) -> None:
        """A recorded window was written to `trace`: read the allocator's state; the history, if it
        recorded this window, is written and stopped."""
        state = read_state(steps_ended, trace)
        if state is not None and len(self.windows) < MAX_LIST:
            self.windows.append(state)
        if self._history_on:
            self._dump_history(run_dir, worker, trace)
            self._stop_history()

    def observe(self, device: int, requested_bytes: int, device_limit: int, device_free: int) -> None:
        """The allocator's out-of-memory callback (module docstring): `device_limit` is the device's
        total memory, or the process's allowed share under `set_per_process_memory_fraction`. The
        allocator calls it after releasing its lock, so reading its state here cannot deadlock."""
        if self._observing or self.out_of_memory is not None:
            return
        self._observing = True
        try:
            state = None
            if self._observed_reads < OBSERVED_STATES:
                self._observed_reads += 1
                state = read_state(0, None, device)
            self._observed = _Observed(int(device), int(requested_bytes), int(device_free), state)
        finally:
            self._observing = False

    # -- at the error --------------------------------------------------------------------------

    def on_error(
        self, error: BaseException, steps_ended: int, recording: bool, optimizer: Any, run_dir: Path,
        worker: str,
    ) -> bool:
        """Record `error` when it is the session's first out-of-memory error (module docstring);
        whether it is one. Reads the exception and its traceback, changes neither."""
        if not is_out_of_memory(error) or self.out_of_memory is not None:
            return is_out_of_memory(error)
        message = str(error)[:MESSAGE_CHARS]
        figures = parse_message(message)
        observed = self._observed
        if observed is not None and figures.requested_bytes is not None:
            # The callback saw this error's allocation when it saw one of this size (within the
            # message's two-decimal rounding).
            close = abs(observed.requested_bytes - figures.requested_bytes) <= 0.01 * figures.requested_bytes
            observed = observed if close else None
        device_index = figures.device_index if figures.device_index is not None else (
            observed.device if observed is not None else None)
        state = observed.state if observed is not None and observed.state is not None else None
        if state is None:
            state = read_state(steps_ended, None, device_index)
        else:
            state = AllocatorState(steps_ended=steps_ended, stats=state.stats, segments=state.segments)
        try:
            call = failing_call(error.__traceback__)
        except Exception:  # an odd frame (a proxy `self`, a failing f_locals): the rest still stands
            logger.debug("trainprof: reading the out-of-memory traceback failed", exc_info=True)
            call = FailingCall(None, None, None, [])
        held = held_by_optimizer(optimizer, _torch_device(device_index)) if optimizer is not None else None
        if self._history_on:  # the history up to the error: the most telling record of all
            self._dump_history(run_dir, worker, None)
            self._stop_history()
        self.out_of_memory = OutOfMemory(
            steps_ended=steps_ended,
            exception=type(error).__name__[:SOURCE_CHARS],
            message=message,
            recording=recording,
            requested_bytes=figures.requested_bytes if figures.requested_bytes is not None else (
                observed.requested_bytes if observed is not None else None),
            device_index=device_index,
            device_total_bytes=figures.device_total_bytes,
            device_free_bytes=figures.device_free_bytes if figures.device_free_bytes is not None else (
                observed.device_free_bytes if observed is not None else None),
            process_bytes=figures.process_bytes,
            allocated_bytes=figures.allocated_bytes,
            reserved_unallocated_bytes=figures.reserved_unallocated_bytes,
            where=call.where,
            call=call.call,
            module=call.module,
            inputs=call.inputs,
            held=held,
            state=state,
            observed=observed is not None,
        )
        return True

    # -- at exit ------------------------------------------------------------------------------

    def stop(self, run_dir: Path, worker: str) -> None:
        """The session ends: a history still recording (the loop ended inside its window) is written."""
        if self._history_on:
            self._dump_history(run_dir, worker, None)
            self._stop_history()

    def write(self, run_dir: Path, worker: str, last_trace: str | None) -> MemoryFile | None:
        """Write `<worker>.memory.json` (atomically) when anything was captured (`document`); returns
        what it holds (None: nothing captured, nothing written)."""
        document = self.document(worker, last_trace)
        if document is None:
            return None
        path = run_dir / f"{worker}{MEMORY_SUFFIX}"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(encode(document))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return document

    def document(self, worker: str, last_trace: str | None) -> MemoryFile | None:
        """What was captured as the file's record (None: nothing); the out-of-memory error and a
        history that ended with it name `last_trace`, the last window with a finished step."""
        if not self.captured:
            return None
        error = self.out_of_memory
        if error is not None:
            error = _replace(error, trace=last_trace)
        history = self.history
        if history is not None and history.trace is None:
            history = _replace(history, trace=last_trace)
        return MemoryFile(
            version=FORMAT_VERSION,
            worker=worker,
            device=self._device_memory(),
            alloc_conf=alloc_conf(),
            windows=self.windows,
            out_of_memory=error,
            history=history,
        )

    def _device_memory(self) -> DeviceMemory | None:
        try:
            import torch

            if not torch.cuda.is_initialized():
                return None
            index = torch.cuda.current_device()
            properties = torch.cuda.get_device_properties(index)
            return DeviceMemory(index=index, name=str(properties.name)[:SOURCE_CHARS],
                                total_bytes=int(properties.total_memory))
        except Exception:
            return None

    # -- the history ---------------------------------------------------------------------------

    def _start_history(self) -> None:
        try:
            import torch

            if not torch.cuda.is_available():
                self._history_wanted = False
                return
            # Python stacks only: gathering C++ stacks per allocation costs more than the step's ops.
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=self._history_entries)
            self._history_on = True
        except Exception:
            logger.debug("trainprof: recording the allocator's history failed", exc_info=True)
            self._history_wanted = False

    def _mark(self, steps_ended: int) -> None:
        if len(self._history_marks) < MAX_LIST:
            self._history_marks.append(StepMark(step=steps_ended, time_us=time.time_ns() // 1000))

    def _dump_history(self, run_dir: Path, worker: str, trace: str | None) -> None:
        """Write the history as `torch.cuda.memory._dump_snapshot` does (a pickled `_snapshot()`), and
        keep its totals over time (`history_series`) for the report."""
        try:
            import pickle

            import torch

            snapshot = torch.cuda.memory._snapshot()
            path = history_path(run_dir, worker)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                with open(tmp, "wb") as file:
                    pickle.dump(snapshot, file)
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)
            series = None
            try:
                device = torch.cuda.current_device()
                stats = torch.cuda.memory_stats(device)
                traces = snapshot.get("device_traces") or []
                series = history_series(
                    traces[device] if device < len(traces) else [],
                    int(stats.get("allocated_bytes.all.current", 0)),
                    int(stats.get("reserved_bytes.all.current", 0)),
                )
            except Exception:
                logger.debug("trainprof: reading the allocator's history totals failed", exc_info=True)
            self.history = MemoryHistory(file=path.name, max_entries=self._history_entries, trace=trace,
                                         step_marks=list(self._history_marks), series=series)
        except Exception:
            logger.debug("trainprof: writing the allocator's history failed", exc_info=True)

    def _stop_history(self) -> None:
        self._history_on = False
        self._history_wanted = False  # one window's history
        try:
            import torch

            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            logger.debug("trainprof: stopping the allocator's history failed", exc_info=True)


def _torch_device(index: int | None) -> Any:
    if index is None:
        return None
    try:
        import torch

        return torch.device("cuda", index)
    except Exception:
        return None


def _replace(record: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(record, **changes)


_WATCHED: MemoryCapture | None = None
"""The capture of the session that runs in this process (the callback hands it the error)."""
_OBSERVER_INSTALLED = False
_OBSERVER_LOCK = threading.Lock()


def watch(capture: MemoryCapture | None) -> None:
    """Hand the allocator's out-of-memory callbacks to `capture` (None: to nobody); installs the
    callback the first time CUDA is available."""
    global _WATCHED, _OBSERVER_INSTALLED
    _WATCHED = capture
    if capture is None or _OBSERVER_INSTALLED:
        return
    with _OBSERVER_LOCK:
        if _OBSERVER_INSTALLED:
            return
        try:
            import torch

            attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
            if attach is None or not torch.cuda.is_available():
                return
            attach(_on_out_of_memory)
            _OBSERVER_INSTALLED = True
        except Exception:
            logger.debug("trainprof: the out-of-memory callback is off", exc_info=True)


def _on_out_of_memory(device: int, requested: int, device_limit: int, device_free: int) -> None:
    """The process's one out-of-memory callback: hands the failure to the watching session's capture.
    Never raises into the allocator."""
    capture = _WATCHED
    if capture is None:
        return
    try:
        capture.observe(device, requested, device_limit, device_free)
    except Exception:
        logger.debug("trainprof: reading the allocator at an out-of-memory error failed", exc_info=True)


def history_path(run_dir: Path, worker: str) -> Path:
    """Where the session writes the allocator's history."""
    return run_dir / f"{worker}{MEMORY_HISTORY_SUFFIX}"
