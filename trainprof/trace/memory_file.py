"""`<worker>.memory.json`: what the session saw of the caching allocator, as typed records.

Written by the session (`trainprof.capture.memory`) beside its traces, read back by the loader
(`load.read_memory_file`) into `Trace.memory_file`, so that `trainprof analyze` of a run folder
sees what the session saw. The contract (DEVELOPING.md):

    {"version": 1, "worker": "<worker>", "device": {"index", "name", "total_bytes"} | null,
     "alloc_conf": "expandable_segments:True" | null,
     "windows": [{"trace": "<trace file name>", "steps_ended": 5, "stats": {...}, "segments": {...}}],
     "out_of_memory": {...} | null, "history": {...} | null}

- `windows[]`: the allocator's state as each recorded window ended (`AllocatorState`), named by
  the trace file the window was written to.
- `out_of_memory` (`OutOfMemory`): the first out-of-memory error of the session: the failing
  allocation, where it was raised, what held the memory then, and the allocator's state at that
  moment. `trace` names the last trace file the process wrote (the window the analysis explains
  it with), null when none was recorded.
- `history` (`MemoryHistory`): with `session(memory_history=True)`, the allocator's recorded history
  as PyTorch's memory viewer opens it (`<worker>.memory_history.pickle`), and the host time of
  each step's start while it was recorded, to join it to steps.

The folder is input from anywhere: every number is bounded, every list bounded in length, and
decoding is msgspec's typed decoding, so what the loader returns holds these types or is refused.
Imports no torch.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

FORMAT_VERSION = 1

Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
"""A memory figure: bounded as a trace's are (`trace.model.MAX_MEMORY_BYTES`)."""
Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
Step = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
Time = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
"""Microseconds on the host's clock (`time.time_ns() // 1000`)."""
Text = Annotated[str, msgspec.Meta(max_length=4096)]
"""A message, a name or a path: a session writes a few hundred characters at most."""

MAX_LIST = 256
"""Entries of any list in the file (windows, segments, inputs, step marks): the session writes fewer."""


class AllocatorStats(msgspec.Struct, frozen=True):
    """What `torch.cuda.memory_stats(device)` says at one moment (its key in brackets): `allocated_bytes`
    (`allocated_bytes.all.current`) and its peak, `reserved_bytes` (`reserved_bytes.all.current`) and
    its peak, `inactive_split_bytes` (free memory inside split blocks: what fragmentation strands),
    `segments` (`segment.all.current`), `num_alloc_retries` (cudaMalloc failures the allocator
    answered by freeing its cache and retrying: a flush of every cached block, and a synchronization),
    `num_ooms`, `num_device_alloc` and `num_device_free` (cudaMalloc and cudaFree calls). Peaks are
    since the process started or the user last reset them."""

    allocated_bytes: Bytes
    allocated_peak_bytes: Bytes
    reserved_bytes: Bytes
    reserved_peak_bytes: Bytes
    inactive_split_bytes: Bytes = 0
    segments: Count = 0
    num_alloc_retries: Count = 0
    num_ooms: Count = 0
    num_device_alloc: Count = 0
    num_device_free: Count = 0


class SegmentSummary(msgspec.Struct, frozen=True):
    """The allocator's segments at one moment (`torch.cuda.memory_snapshot()`): how many, the bytes
    they reserve and hold allocated, the largest free block inside any of them (the largest request
    the cache could serve without asking the driver), the free blocks, whether they are expandable
    (`expandable_segments:True`), and the largest segments (`largest_segment_bytes`, largest first)."""

    count: Count
    reserved_bytes: Bytes
    allocated_bytes: Bytes
    largest_free_block_bytes: Bytes
    free_blocks: Count
    expandable: bool = False
    largest_segment_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=MAX_LIST)] = []


class AllocatorState(msgspec.Struct, frozen=True):
    """The allocator at one moment: when (`steps_ended` steps had ended; `trace`: the trace file of the
    window that had just ended, null elsewhere), its statistics and its segments (either null when it
    could not be read)."""

    steps_ended: Step
    trace: Text | None = None
    stats: AllocatorStats | None = None
    segments: SegmentSummary | None = None


class CodeLine(msgspec.Struct, frozen=True):
    """A frame of the failing call: file, line, function (any may be unknown)."""

    file: Text | None = None
    line: Annotated[int, msgspec.Meta(ge=0, le=2**31)] | None = None
    function: Text | None = None


class TensorInput(msgspec.Struct, frozen=True):
    """A tensor argument of the failing step's outermost module call: its name, shape and dtype."""

    name: Text
    shape: Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=2**53)]], msgspec.Meta(max_length=16)]
    dtype: Text


class HeldByTraining(msgspec.Struct, frozen=True):
    """What the optimizer's tensors on the failing device held at the error: its parameters, their
    gradients and its state (Adam's moments, ...), each tensor counted once."""

    parameters_bytes: Bytes
    gradients_bytes: Bytes
    optimizer_state_bytes: Bytes


class OutOfMemory(msgspec.Struct, frozen=True):
    """The first out-of-memory error of a session.

    `steps_ended`: steps that had ended (the failing step is step `steps_ended` in the profiler's
    numbering); `recording`: whether the profiler was recording it; `exception` (the type's name)
    and `message` (cut to 4,096 characters); from the message or the allocator's callback:
    `requested_bytes` (the failing allocation), `device_index`, `device_total_bytes`,
    `device_free_bytes`, `process_bytes` (all this process held on the device, the CUDA context
    included), `allocated_bytes` (by PyTorch's tensors) and `reserved_unallocated_bytes` (cached by
    the allocator, held by no tensor); from the traceback: `where` (the user's innermost frame),
    `call` (the innermost frame, in torch or elsewhere: the call that allocated), `module` (the
    innermost `nn.Module` class path, outermost first: `LlamaForCausalLM/LlamaModel/.../LlamaMLP`),
    `inputs` (the outermost module call's tensor arguments); `held` (from the optimizer); `state`
    (the allocator's, read at the error); `observed` (read by the allocator's out-of-memory callback
    at the failing allocation itself, else as the error left the loop); `trace` (module docstring).
    """

    steps_ended: Step
    exception: Text
    message: Text
    recording: bool = False
    requested_bytes: Bytes | None = None
    device_index: Annotated[int, msgspec.Meta(ge=0, le=2**16)] | None = None
    device_total_bytes: Bytes | None = None
    device_free_bytes: Bytes | None = None
    process_bytes: Bytes | None = None
    allocated_bytes: Bytes | None = None
    reserved_unallocated_bytes: Bytes | None = None
    where: CodeLine | None = None
    call: CodeLine | None = None
    module: Text | None = None
    inputs: Annotated[list[TensorInput], msgspec.Meta(max_length=MAX_LIST)] = []
    held: HeldByTraining | None = None
    state: AllocatorState | None = None
    observed: bool = False
    trace: Text | None = None


class StepMark(msgspec.Struct, frozen=True):
    """A step's start while the history was recorded (the previous step's end): the step and when
    (µs on the host's clock, `time.time_ns() // 1000`, the clock of the history's `time_us`)."""

    step: Step
    time_us: Time


MAX_POINTS = 1024
"""Points of a history series, at most (the session writes `trainprof.capture.memory.HISTORY_POINTS`)."""
Points = Annotated[list[Bytes], msgspec.Meta(max_length=MAX_POINTS)]


class HistorySeries(msgspec.Struct, frozen=True):
    """The allocated and reserved totals over the recorded history, at most `MAX_POINTS` of its
    entries (each slice's highest and lowest), read from the snapshot when the session wrote it:
    `time_us` on the host's clock (`StepMark.time_us`), totals in bytes; `oom_time_us`: when the
    allocator failed an allocation, if it did."""

    time_us: Annotated[list[Time], msgspec.Meta(max_length=MAX_POINTS)]
    allocated_bytes: Points
    reserved_bytes: Points
    entries: Count = 0
    oom_time_us: Time | None = None


class MemoryHistory(msgspec.Struct, frozen=True):
    """The allocator's recorded history (`torch.cuda.memory._record_memory_history`): the pickle's
    file name beside the traces (PyTorch's memory viewer opens it; trainprof never unpickles a run
    folder's file), the most entries it kept, the trace file of the window it recorded, the steps'
    starts meanwhile, and its totals over time (`series`)."""

    file: Text
    max_entries: Count
    trace: Text | None = None
    step_marks: Annotated[list[StepMark], msgspec.Meta(max_length=MAX_LIST)] = []
    series: HistorySeries | None = None


class DeviceMemory(msgspec.Struct, frozen=True):
    """The CUDA device the session watched: its index, name and total memory."""

    index: Annotated[int, msgspec.Meta(ge=0, le=2**16)]
    name: Text
    total_bytes: Bytes


class MemoryFile(msgspec.Struct, frozen=True):
    """The whole `<worker>.memory.json` (module docstring)."""

    version: int
    worker: Text
    device: DeviceMemory | None = None
    alloc_conf: Text | None = None
    windows: Annotated[list[AllocatorState], msgspec.Meta(max_length=MAX_LIST)] = []
    out_of_memory: OutOfMemory | None = None
    history: MemoryHistory | None = None

    def window_state(self, trace_name: str) -> AllocatorState | None:
        """The allocator's state as the window written to `trace_name` ended, if captured."""
        return next((state for state in self.windows if state.trace == trace_name), None)

    def out_of_memory_after(self, trace_name: str | None) -> OutOfMemory | None:
        """The out-of-memory error the window written to `trace_name` explains (its `trace`), or the
        one no window explains when `trace_name` is None."""
        error = self.out_of_memory
        return error if error is not None and error.trace == trace_name else None

    def history_of(self, trace_name: str) -> MemoryHistory | None:
        """The recorded history of the window written to `trace_name`, if any."""
        history = self.history
        return history if history is not None and history.trace == trace_name else None


def encode(document: MemoryFile) -> bytes:
    """The file's JSON text."""
    return msgspec.json.encode(document)


def decode(text: bytes | bytearray) -> MemoryFile:
    """A `MemoryFile` from JSON text; msgspec's DecodeError/ValidationError for anything else, and
    ValueError for a version this code does not read."""
    document = msgspec.json.decode(text, type=MemoryFile)
    if document.version != FORMAT_VERSION:
        raise ValueError(f"version {document.version}, this trainprof reads {FORMAT_VERSION}")
    return document
