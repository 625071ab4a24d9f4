"""Load torch.profiler Chrome traces (.json, .json.gz, or a folder of them) into `Trace` objects.

Matching rules, exactly:
- A folder is searched (not recursively) for `*.pt.trace.json` and `*.pt.trace.json.gz`. If it has
  none but holds run folders that do (e.g. a session's `log_dir`), the newest run is loaded: the one
  whose newest trace file is newest (`newest_run`; folders named `_...` are a tool's own, never a
  run). Otherwise every other `*.json` / `*.json.gz` in
  it except `*.syncsites.json` that parses as a trace.
- A trace's worker is its file name less `.pt.trace.json[.gz]` (or `.json[.gz]`) and less the
  `.<timestamp>` that `tensorboard_trace_handler(dir, worker_name=W)` puts before it: it writes
  `W.<timestamp>.pt.trace.json[.gz]`, so `Qwen1.5.1795302414630700547.pt.trace.json` is worker `Qwen1.5`. Its
  captured sync sites are read from `<same folder>/<worker>.syncsites.json` when that file exists.
- The rank is `distributedInfo.rank` when the trace has it, else the number in the worker name after
  `rank` (e.g. `rank1`, `rank_1`, `trainer-rank-3`), else None. Several files of one worker are the
  windows of one process (`schedule(repeat=N)`): `Trace.window` numbers them by start time.
- Only regular files are read (a FIFO or a device would block or never end), and at most
  `max_trace_bytes()` bytes of JSON per file as `trainprof.trace.budget` counts them (its bytes, or
  128 per JSON object when more), after gunzip (env `TRAINPROF_MAX_TRACE_BYTES`); a sync sites file
  (and a peaks file) at most `MAX_SYNC_SITES_BYTES`. Memory stays within the bound `budget` states.
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import itertools
import logging
import math
import os
import re
import stat
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar, Union

import msgspec
import numpy as np

from trainprof.files import (
    MEMORY_SUFFIX,
    PEAKS_SUFFIX,
    SESSION_METADATA_KEY,
    SYNCSITES_SUFFIX,
    TRACE_SUFFIXES,
    file_kind,
    open_to_read,
)
from trainprof.trace import budget, memory_file, sync_sites_file
from trainprof.trace.model import (
    CATEGORY_ALIASES,
    FRAME_CATEGORIES,
    KEPT_CATEGORIES,
    MAX_MEMORY_BYTES,
    CollectiveCalls,
    EventTable,
    OpInputs,
    Trace,
)
from trainprof.user_code import CodeLayout

try:
    from trainprof.trace import _scan
except ImportError:  # not built (no C compiler where it was installed): msgspec reads every trace
    _scan = None  # type: ignore[assignment]  # the C module, or None where it was not built

logger = logging.getLogger("trainprof")

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d{1,9})", re.IGNORECASE)
# tensorboard_trace_handler's timestamp: ms (torch <= 2.0) or ns since the epoch, 13+ digits; a short
# number after a dot is part of the worker's own name (`Qwen1.5`).
_TIMESTAMP = re.compile(r"\.\d{10,}$")
_NAN = math.nan

MAX_TRACE_BYTES_ENV = "TRAINPROF_MAX_TRACE_BYTES"
# The largest trace (counted bytes of JSON, after gunzip) read by default: with the memory bound
# (trainprof.trace.budget: 3x) at most 6 GiB of memory. The largest real trace measured here was 1 GB.
DEFAULT_MAX_TRACE_BYTES = 2 * 2**30
MAX_SYNC_SITES_BYTES = 64 * 2**20
"""The largest `<worker>.syncsites.json` read (counted bytes): the session writes kilobytes (136 KB
for the largest fixture), and this one is decoded into dicts (memory: 8x, `budget`). A
`<worker>.peaks.json` (a few hundred bytes) has the same limit."""
METADATA_BYTES = 2**20
"""A trace's top-level metadata fields (`deviceProperties`, `distributedInfo`) larger than this are
ignored: Kineto writes a few kilobytes, and they are decoded into dicts."""
_max_bytes_override: int | None = None


def max_trace_bytes() -> int:
    """The size limit in force: `trace_size_limit()`'s, else env `TRAINPROF_MAX_TRACE_BYTES`, else 2 GiB.

    The env value is bytes, or a number with a K/M/G/T suffix (powers of 1024), e.g. `8G`.
    """
    if _max_bytes_override is not None:
        return _max_bytes_override
    text = os.environ.get(MAX_TRACE_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TRACE_BYTES
    try:
        limit = parse_size(text)
    except ValueError as error:
        raise TraceLoadError(f"{MAX_TRACE_BYTES_ENV}: {error}") from None
    if limit is None:
        raise TraceLoadError(f"{MAX_TRACE_BYTES_ENV}={text!r}: not a size (bytes, or e.g. 8G)")
    return limit


LARGEST_SIZE_LIMIT = 2**53
"""The largest size limit taken (8192T): beyond any memory, and inflating takes its lengths as C sizes."""


def parse_size(text: str) -> int | None:
    """`123`, `64K`, `8G` ... as bytes (powers of 1024); None when `text` is not a size.

    ValueError for a size above `LARGEST_SIZE_LIMIT`."""
    match = re.fullmatch(r"\s*(\d{1,15})\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if match is None:
        return None
    size = int(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_")
    if size > LARGEST_SIZE_LIMIT:
        raise ValueError(f"{text.strip()!r} is too large (at most {LARGEST_SIZE_LIMIT // 2**40}T)")
    return size


@contextlib.contextmanager
def trace_size_limit(limit_bytes: int | None) -> Iterator[None]:
    """Read traces up to `limit_bytes` (after gunzip) inside the block; None keeps the current limit."""
    global _max_bytes_override
    previous = _max_bytes_override
    if limit_bytes is not None:
        _max_bytes_override = limit_bytes
    try:
        yield
    finally:
        _max_bytes_override = previous


class TraceLoadError(ValueError):
    """A path that is not a readable torch.profiler trace; the message names the file and the problem."""


class NoFinishedStep(TraceLoadError):
    """A window the session flushed at its stop whose only recorded step never ended: nothing to analyse."""


class CutShort(TraceLoadError):
    """A trace file that is empty or ends early: a window whose export was killed, or one still being
    written by a writer that does not rename (torch's own handler). In a folder with other windows it
    is skipped with one warning (`say_skipped`); alone, it is the error."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path, self.what = Path(path), what

    def __reduce__(self) -> tuple:  # back from a worker process whole
        return CutShort, (self.path, self.what)


class NotJSON(TraceLoadError):
    """A trace file whose text is not JSON (before any repair: `_with_quotes_escaped`)."""


Skipped = NoFinishedStep | CutShort
"""What `load_candidate` returns for a folder's file that holds nothing to analyse."""


def load_traces(path: str | Path, on_file: Callable[[Path, int, int], None] | None = None) -> list[Trace]:
    """Load one trace file, or every trace in a folder (one per rank/worker), sorted by rank then name.

    `on_file(file, index, count)`, if given, is called before each file is read (for progress bars).
    """
    root = Path(path)
    files = trace_paths(root)
    traces, skipped = [], []
    for index, file in enumerate(files):
        if on_file is not None:
            on_file(file, index, len(files))
        trace = load_candidate(file, alone=len(files) == 1 or not root.is_dir())
        if isinstance(trace, TraceLoadError):
            skipped.append(trace)
        elif trace is not None:
            traces.append(trace)
    if not traces:
        raise no_trace_in(files[0].parent, skipped)
    say_skipped(skipped)
    traces.sort(key=trace_order)
    _number_windows(traces)
    return traces


def no_trace_in(folder: Path, skipped: list[Skipped]) -> TraceLoadError:
    """The error for a folder none of whose candidate files is a trace with a finished step: the
    first `skipped` window's, else that it holds no trace."""
    if skipped:
        return skipped[0]
    return TraceLoadError(f"{folder}: folder holds no torch.profiler trace (*.pt.trace.json[.gz])")


def say_skipped(skipped: list[Skipped]) -> None:
    """One warning per cut window left out of a folder whose other windows are analysed."""
    for cut in skipped:
        if isinstance(cut, CutShort):  # repr: a name from a shared folder, its control characters escaped
            logger.warning("trainprof: skipping %r: %s; the other windows are analysed",
                           cut.path.name, cut.what)


def trace_paths(path: str | Path) -> list[Path]:
    """The files `load_traces(path)` reads: the file itself, or a folder's candidate traces (its
    newest run's, for a folder of runs)."""
    root = Path(path)
    if not root.exists():
        raise TraceLoadError(f"{root}: no such file or folder")
    if not root.is_dir():
        return [root]
    run, runs = newest_run(root)
    if run is not None:
        logger.info("%s holds %d runs; loading the newest, %s", root, len(runs), run.name)
        root = run
    return trace_files(root)


def load_candidate(file: Path, alone: bool) -> Trace | Skipped | None:
    """One of a folder's candidate files as a `Trace`; None for a file that is not a trace, unless
    it must be one (a `*.pt.trace.json[.gz]` file, or the only file: `alone`).

    A window whose only step was cut short gives its `NoFinishedStep`, and a file that is empty or
    ends early (`CutShort`: a killed export, a window still being written) its error, returned, not
    raised: the folder's other windows may hold finished steps (`no_trace_in` raises the first when
    none does, else `say_skipped` warns). Alone, a cut file raises."""
    try:
        return load_trace(file)
    except NoFinishedStep as unfinished:
        return unfinished
    except CutShort as cut:
        if alone:
            raise
        return cut
    except TraceLoadError:
        if file.name.endswith(TRACE_SUFFIXES) or alone:
            raise
        return None


def last_windows(files: list[Path], count: int) -> list[Path]:
    """The last `count` of each worker's files, by the time in their names (`W.<time>.pt.trace.json[.gz]`,
    as the session and torch's handler name windows; a name without one counts as the oldest), in
    `files`' order: the windows a session with `repeat=0` analysed (`trainprof analyze --windows`).
    ValueError when `count` is below 1."""
    if count < 1:
        raise ValueError(f"windows must be at least 1, got {count}")
    by_worker: dict[str, list[Path]] = defaultdict(list)
    for file in files:
        by_worker[worker_of(file)].append(file)
    kept = set()
    for windows in by_worker.values():
        windows.sort(key=_time_in_name)
        kept.update(windows[-count:])
    return [file for file in files if file in kept]


def _time_in_name(path: Path) -> int:
    match = _TIMESTAMP.search(_stem(path))
    return int(match.group(0)[1:]) if match else -1


def trace_order(trace: Trace) -> tuple:
    """The order of a folder's traces: by rank (traces without one last), then by file name."""
    return (trace.rank is None, trace.rank if trace.rank is not None else 0, trace.path.name)


def _number_windows(traces: list[Trace]) -> None:
    """Set `window` 0, 1, ... on the traces of each process, in order of their first event."""
    numbers = window_numbers([(trace.process, first_event_us(trace)) for trace in traces])
    for trace, window in zip(traces, numbers, strict=True):
        trace.window = window


def window_numbers(windows: list[tuple[object, float]]) -> list[int]:
    """The window number of each (process, first event µs): 0, 1, ... among its process's windows,
    in order of their first event (`Trace.window`)."""
    numbers = [0] * len(windows)
    taken: dict[object, int] = {}
    for index in sorted(range(len(windows)), key=lambda i: windows[i][1]):
        process = windows[index][0]
        numbers[index] = taken.get(process, 0)
        taken[process] = numbers[index] + 1
    return numbers


def first_event_us(trace: Trace) -> float:
    """When the trace's first event starts (µs; 0 for a trace without events)."""
    starts = [float(table.start_us[0]) for table in trace.events.values() if len(table)]
    return min(starts) if starts else 0.0


def _profiler_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.is_file())


def trace_files(folder: Path) -> list[Path]:
    """The candidate trace files of a folder (see the module docstring for the rule)."""
    files = _profiler_files(folder)
    if not files:
        files = sorted(
            p
            for p in folder.iterdir()
            if p.name.endswith((".json", ".json.gz"))
            and not p.name.endswith((SYNCSITES_SUFFIX, PEAKS_SUFFIX, MEMORY_SUFFIX))
            and p.is_file()
        )
    if not files:
        raise TraceLoadError(f"{folder}: folder holds no torch.profiler trace (*.pt.trace.json[.gz])")
    return files


def newest_run(folder: Path) -> tuple[Path | None, list[Path]]:
    """For a folder of run folders (no `*.pt.trace.json[.gz]` of its own, sub-folders with some):
    the newest run (by its newest trace file's modification time) and every run, oldest first.
    `(None, [])` for any other folder. Folders whose name starts with `_` or `.` are a tool's own, never runs
    (`trainprof ab --log-dir` keeps its prediction's trace in `_prediction`)."""
    if _profiler_files(folder):
        return None, []
    runs = []
    for sub in folder.iterdir():
        if sub.is_dir() and not sub.name.startswith(("_", ".")):
            with contextlib.suppress(OSError):
                files = _profiler_files(sub)
                if files:
                    runs.append((max(f.stat().st_mtime for f in files), sub.name, sub))
    runs.sort()
    return (runs[-1][2], [run for _, _, run in runs]) if runs else (None, [])


def worker_of(path: Path) -> str:
    """The worker part of a trace file name: the name less the suffixes Kineto adds (module docstring)."""
    name = _stem(path)
    return _TIMESTAMP.sub("", name) or name


def _stem(path: Path) -> str:
    """A trace file's name less `.pt.trace.json[.gz]` (or `.json[.gz]`)."""
    name = path.name
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def sync_sites_path(path: Path) -> Path:
    """Where the captured sync sites of the trace at `path` live: `<folder>/<worker>.syncsites.json`."""
    return path.with_name(worker_of(path) + SYNCSITES_SUFFIX)


def peaks_path(path: Path) -> Path:
    """Where the device peaks measured by the session for the trace at `path` are: `<worker>.peaks.json`."""
    return path.with_name(worker_of(path) + PEAKS_SUFFIX)


def memory_file_path(path: Path) -> Path:
    """Where the allocator state the session captured for the trace at `path` is: `<worker>.memory.json`."""
    return path.with_name(worker_of(path) + MEMORY_SUFFIX)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: loading and analysing a trace allocate ~10^5
    short-lived acyclic objects, and collections triggered by them cost a third of the analysis
    (measured on gpt2_clean: 27 -> 18 ms)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_trace(path: str | Path) -> Trace:
    """Load one trace file (.json or .json.gz) and the sync sites captured beside it."""
    path = Path(path)
    # Parsing and bucketing allocate ~10^5 acyclic objects; the cyclic collector would triple the time.
    with gc_paused():
        names, threads, tables, memory, collectives, op_inputs, metadata = _parse(path)

    distributed = metadata.get("distributedInfo")
    distributed = distributed if isinstance(distributed, dict) else None
    worker = worker_of(path)
    rank = distributed.get("rank") if distributed is not None else None
    if type(rank) is not int or not 0 <= rank < 2**31:  # not bool, not a 5000-digit number
        rank = None
    if rank is None:
        rank = rank_in_name(worker)
    sites_path = sync_sites_path(path)
    sidecar = _read_sync_sites_file(sites_path) if sites_path.is_file() else None
    peaks_file = peaks_path(path)
    allocator_file = memory_file_path(path)
    trace = Trace(
        path=path,
        worker=worker,
        rank=rank,
        names=names,
        threads=threads,
        events=tables,
        memory=memory,
        collective_calls=collectives,
        device_properties=[d for d in _as_list(metadata.get("deviceProperties")) if isinstance(d, dict)],
        distributed_info=distributed,
        metadata=metadata,
        sync_sites=[site.to_dict() for site in sidecar.sites] if sidecar is not None else None,
        sync_sites_path=sites_path if sidecar is not None else None,
        code_layout=sidecar.code_layout if sidecar is not None else None,
        compile_counters=sidecar.compile.to_dict() if sidecar is not None and sidecar.compile else None,
        unprofiled_step_ms=sidecar.unprofiled.step_ms if sidecar is not None else None,
        unprofiled_timing=sidecar.unprofiled.timing if sidecar is not None else None,
        unprofiled_pre_forward_ms=sidecar.unprofiled.pre_forward_ms if sidecar is not None else None,
        op_inputs=op_inputs,
        device_peaks=read_device_peaks(peaks_file) if peaks_file.is_file() else None,
        memory_file=read_memory_file(allocator_file) if allocator_file.is_file() else None,
    )
    mark = metadata.get(SESSION_METADATA_KEY)
    steps_ended = mark.get("steps_ended") if isinstance(mark, dict) else None
    if type(steps_ended) is int and not drop_unfinished_steps(trace, steps_ended):
        raise NoFinishedStep(f"{path}: holds no step that ended (the loop stopped inside the window's first "
                             "recorded step); profile more steps")
    return trace


def rank_in_name(worker: str) -> int | None:
    """The rank a worker name holds (`rank1_host_42`, `trainer-rank-3`), None when it holds none."""
    match = _RANK_IN_NAME.search(worker)
    return int(match.group(1)) if match else None


_PROFILER_STEP = re.compile(r"ProfilerStep#(\d{1,18})")


def drop_unfinished_steps(trace: Trace, steps_ended: int) -> bool:
    """Remove the `ProfilerStep#k` ranges with k >= `steps_ended` (steps the loop never finished:
    torch closes the current one when it stops); True when a profiler step remains."""
    annotations = trace.events["user_annotation"]
    steps = ((i, _PROFILER_STEP.fullmatch(name)) for i, name in enumerate(trace.names))
    number = {i: int(match.group(1)) for i, match in steps if match}
    unfinished = [i for i, step in number.items() if step >= steps_ended]
    if unfinished:
        annotations = annotations.select(~np.isin(annotations.name, unfinished))
        trace.events["user_annotation"] = annotations
    return any(int(i) in number for i in np.unique(annotations.name))


_NO_RAW = msgspec.Raw(b"")


class _CompleteArgs(msgspec.Struct, gc=False):
    """The `args` of a complete event that the analyses read; msgspec skips the rest while parsing.
    Each field costs every other key of every event's `args` a comparison: keep them few (the
    memory instants' fields have their own struct)."""

    correlation: int = -1
    bytes: float = _NAN
    # Kineto's forward/backward link of a cpu_op (trainprof.analysis.attribution reads them).
    sequence: int = msgspec.field(default=-1, name="Sequence number")
    fwd_thread: int = msgspec.field(default=-1, name="Fwd thread id")
    # A collective's record (`record_param_comms` cpu_ops; trainprof.analysis.collectives): five
    # fields cost loading ~3% more time (ddp_straggler, gpt2 and MI300 traces, 2026-11-25).
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    dtype: str | None = None
    group_size: int = msgspec.field(default=-1, name="Group size")
    # A cpu_op's recorded inputs (`record_shapes`) and FLOPs (`with_flops`), read by
    # trainprof.analysis.work. The lists stay JSON text (msgspec.Raw, a view into the file's bytes):
    # 1.8 ms more decoding on gpt2_pathologies' 15 MB (24.0 -> 25.9 ms) for all three fields.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    # The scalar arguments' values as strings (`is_causal`, `dropout_p`, a cast's dtype), read by
    # trainprof.analysis.attention and copies.
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    flops: float = _NAN


class _InstantArgs(msgspec.Struct, gc=False):
    """The `args` of a `[memory]` instant that the analyses read."""

    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: float | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int = msgspec.field(default=1, name="Device Type")
    # One allocation (> 0) or free (< 0) and the block's address: floats, since an x86-64 or ARM
    # user address stays below 2**48, exact in a float64, and a float field takes ints and floats alike.
    alloc_bytes: float | None = msgspec.field(default=None, name="Bytes")
    addr: float | None = msgspec.field(default=None, name="Addr")


# The fields of both, for the lenient path's `_Event` (whose phase is a field).
# `msgspec.convert` cannot make a Raw from decoded lists: those fields are decoded as they come and
# turned back into JSON text by `_narrow`.
_RAW_FIELDS = frozenset(f.name for f in msgspec.structs.fields(_CompleteArgs) if f.type is msgspec.Raw)
_Args = msgspec.defstruct(
    "_Args",
    [
        (f.name, Any, msgspec.field(default=None, name=f.encode_name))
        if f.name in _RAW_FIELDS
        else (f.name, f.type, msgspec.field(default=f.default, name=f.encode_name))
        for kind in (_CompleteArgs, _InstantArgs)
        for f in msgspec.structs.fields(kind)
    ],
    gc=False,
)


_NO_ARGS = _CompleteArgs()
_NO_INSTANT_ARGS = _InstantArgs()


class _EventFields(msgspec.Struct, gc=False):
    """The fields every event shape below reads."""

    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN


class _Complete(_EventFields, tag_field="ph", tag="X", gc=False):
    """A complete event (`"ph": "X"`): ops, Python functions, kernels, runtime calls, copies, ..."""

    dur: float = 0.0
    args: _CompleteArgs | None = None


class _Instant(_EventFields, tag_field="ph", tag="i", gc=False):
    """An instant event (`"ph": "i"`); the analyses read the CUDA `[memory]` ones."""

    args: _InstantArgs | None = None


# The Chrome trace format's other phases: duration B/E, instant I, counter C, async b/n/e S/T/p/F,
# flow s/t/f, sample P, object N/O/D, metadata M, memory dump V/v, mark R, clock sync c, context ( ).
# The phase picks the struct while parsing: these keep only their category (for the message when a
# file has nothing the analyses read), so a flow or metadata event costs a skip, not a struct of
# seven fields; flows are a fifth of a torch trace's events, a third of a DDP one's.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{ord(phase)}", [("cat", str, "")], tag_field="ph", tag=phase, gc=False)
    for phase in "BEICbneSTpFstfPNODMVvRc()"
)
_AnyEvent = Union[(_Complete, _Instant, *_OTHER_PHASES)]  # noqa: UP007 (a union built from a tuple)


class _Event(_EventFields, gc=False):
    """Any event, with its phase as a field: what the lenient path reads (an unknown phase, or no
    phase, fails the tagged decoding), turned into the tagged shapes by `_tagged`."""

    ph: str = ""
    dur: float = 0.0
    args: _Args | None = None


def _tagged(events: list[_Event]) -> list:
    """`_Event`s as the tagged decoding would have given them (other phases stay `_Event`s)."""
    return [
        _Complete(e.cat, e.name, e.pid, e.tid, e.ts, e.dur, _narrow(e.args, _CompleteArgs))
        if e.ph == "X"
        else _Instant(e.cat, e.name, e.pid, e.tid, e.ts, _narrow(e.args, _InstantArgs))
        if e.ph == "i"
        else e
        for e in events
    ]


def _narrow(args: _Args | None, kind: type) -> msgspec.Struct | None:
    """The fields of `kind` (`_CompleteArgs` or `_InstantArgs`) of an `_Args`."""
    if args is None:
        return None
    return kind(**{f: _as_raw(getattr(args, f)) if f in _RAW_FIELDS else getattr(args, f)
                   for f in kind.__struct_fields__})


def _as_raw(value: Any) -> msgspec.Raw:
    """A decoded arg back as JSON text (absent: one shared empty text, not one per event)."""
    return _NO_RAW if value is None else msgspec.Raw(msgspec.json.encode(value))


def _phase(event: msgspec.Struct) -> str:
    """An event's `ph`: its struct's tag, else its field (an `_Event` from the lenient path)."""
    return type(event).__struct_config__.tag or getattr(event, "ph", "")


EventT = TypeVar("EventT")


class _Document(msgspec.Struct, Generic[EventT]):
    """A trace file's top level: the events plus the metadata the analyses read.

    The metadata is kept as raw JSON text (no allocation while parsing), then decoded as it is when
    small (`_metadata`) and checked by its readers: a wrong-typed `deviceProperties` must not make
    the events unreadable.
    """

    traceEvents: list[EventT]  # noqa: N815 (the trace format's name)
    deviceProperties: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # noqa: N815
    distributedInfo: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # noqa: N815
    schemaVersion: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # noqa: N815
    traceName: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # noqa: N815
    trainprof: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    """The session's mark on a window it flushed at its stop (trainprof.files.SESSION_METADATA_KEY)."""
    # The profiler's options as torch writes them (1 or 0; absent from other tools' traces): what
    # the report may advise turning on (`views.recorded_with`).
    with_stack: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    profile_memory: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    record_shapes: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


_METADATA_FIELDS = tuple(field for field in _Document.__struct_fields__ if field != "traceEvents")


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


# Typed decoding builds compact structs and skips unused fields in one pass: ~6x faster than a
# generic JSON parse into dicts on a 15 MB trace (0.03 s against 0.17 s for orjson on this
# project's gpt2_pathologies fixture, 2026-11-21).
_DOCUMENT = msgspec.json.Decoder(_Document[_AnyEvent] | list[_AnyEvent])
# A trace from another tool whose field types differ from torch's (e.g. string times): the same
# typed decoding with msgspec's lax conversions, never a generic parse into dicts first (that costs
# 20-60x the text's size in memory).
_LENIENT = msgspec.json.Decoder(_Document[_Event] | list[_Event], strict=False)


def _parse(path: Path):
    """Read, parse and bucket one file; returns (names, threads, tables, memory, collectives, op_inputs,
    metadata)."""
    text = _read_json(path, max_trace_bytes(), budget.TRACE_MEMORY_FACTOR, _trace_too_large)
    columns = _scanned(path, text)
    if columns is not None:
        return columns
    document, replaced, first_error = None, False, None
    while document is None:  # at most one repair of each kind; only here (rare) is the text copied
        try:
            document = _decode(path, text)
        except UnicodeDecodeError:
            if replaced:  # pragma: no cover - the replaced text is UTF-8
                raise
            # Kineto can cut a name inside a multi-byte character; read such bytes as U+FFFD.
            text, replaced = _with_replacement_characters(text), True
        except NotJSON as error:
            if first_error is not None:
                raise first_error from None  # (its byte offsets are the file's own)
            first_error = error
            text = _with_quotes_escaped(text)  # rebound: the unrepaired text is freed before decoding
            if text is None:
                raise
    if isinstance(document, _Document):
        raw = {field: getattr(document, field) for field in _METADATA_FIELDS}
        events, metadata = document.traceEvents, _metadata(path, raw)
    else:
        events, metadata = document, {}
    del document, text  # the events hold copies: the text goes back before bucketing (memory bound)
    if not events:
        raise TraceLoadError(f"{path}: trace has no events")
    return (*_bucket(events, path), metadata)


def _metadata(path: Path, raws: Mapping[str, Any]) -> dict[str, Any]:
    """The document's metadata fields (field -> its JSON text) that are present, not null and at most
    `METADATA_BYTES`, decoded."""
    metadata = {}
    for field, raw in raws.items():
        if raw is None or not len(raw):
            continue
        if len(raw) > METADATA_BYTES:
            logger.info("%s: ignoring its %s (%d bytes)", path, field, len(raw))
            continue
        try:
            try:
                value = msgspec.json.decode(raw)
            except UnicodeDecodeError:  # the typed decoding skipped it unchecked
                value = msgspec.json.decode(_with_replacement_characters(raw))
        except (msgspec.DecodeError, RecursionError):  # nested too deeply for msgspec
            continue
        if value is not None:
            metadata[field] = value
    return metadata


def _with_replacement_characters(text: bytes | bytearray) -> bytearray:
    """`text` with each invalid UTF-8 sequence as U+FFFD, converted in pieces (memory: the text
    twice, not the text plus a str of it)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    view = memoryview(text)
    out = bytearray()
    for start in range(0, len(text), _UTF8_PIECE):
        out += decoder.decode(view[start:start + _UTF8_PIECE]).encode()
    out += decoder.decode(b"", final=True).encode()
    return out


_UTF8_PIECE = 2**20

# torch writes names into the trace unescaped: a `"` in a record_function label, a module class or a
# function name makes `"name": "label "quoted""`. In JSON a quote outside a string, and a string's
# own quotes, always sit next to structure: after `{ [ , :` or before `, : } ]`. A quote with
# neither (the whitespace before it aside), and no backslash before it, can only be such a name's.
# On valid JSON the pattern matches nothing; a name holding `", ` stays unreadable.
_QUOTE_IN_NAME = re.compile(rb'(?<=[^\s{\[,:\\])(\s*)"(?!\s*[,:}\]])')


def _with_quotes_escaped(text: bytes | bytearray) -> bytearray | None:
    """`text` with torch's unescaped quotes in names escaped (`_QUOTE_IN_NAME`); None when it has none,
    or holds a NUL byte (UTF-16 or binary: not torch's JSON, and every quote in it would match).

    Built match by match into one buffer: `re.sub` would hold ~100 bytes of pieces per match until
    it joins them (an input of nothing but quotes took 20x its size)."""
    if text.find(b"\0") >= 0:
        return None
    view, repaired, done = memoryview(text), bytearray(), 0
    for match in _QUOTE_IN_NAME.finditer(text):
        quote = match.end() - 1
        repaired += view[done:quote]
        repaired += b'\\"'
        done = quote + 1
    if not done:
        return None
    repaired += view[done:]
    return repaired


def _decode(path: Path, text: bytes | bytearray) -> _Document | list:
    """Parse the JSON text into events; TraceLoadError when it is not a trace (UnicodeDecodeError passes)."""
    try:
        try:
            return _DOCUMENT.decode(text)
        except msgspec.ValidationError:
            return _lenient_document(path, text)
    except msgspec.DecodeError as error:
        if str(error) == _TRUNCATED:
            raise CutShort(path, "cut short (the JSON ends early)") from None
        raise NotJSON(f"{path}: not JSON ({_first_line(error)})") from None
    except RecursionError:
        raise TraceLoadError(f"{path}: JSON nested too deeply to be a profiler trace") from None


_TRUNCATED = "Input data was truncated"
"""msgspec's message for JSON that ends before its value does."""


def _lenient_document(path: Path, text: bytes | bytearray) -> _Document | list:
    """The trace read with lax types (`_LENIENT`), its events as the tagged decoding gives them."""
    try:
        document = _LENIENT.decode(text)
    except msgspec.ValidationError as error:
        message = _first_line(error)
        if " - at `$" not in message:  # the top level itself: not an object with traceEvents, nor a list
            raise TraceLoadError(f"{path}: JSON but not a profiler trace ({message})") from None
        raise TraceLoadError(f"{path}: malformed trace event ({message})") from None
    if isinstance(document, _Document):
        document.traceEvents = _tagged(document.traceEvents)
        return document
    return _tagged(document)


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def read_sync_sites(path: Path) -> list[dict]:
    """The `sites` list of a `<worker>.syncsites.json` file (`sync_sites_file.Site`, contract in
    DEVELOPING.md): each site's fields of the contract's type; a site that is not an object is an error."""
    return [site.to_dict() for site in _read_sync_sites_file(path).sites]


def _read_sync_sites_file(path: Path) -> sync_sites_file.SyncSitesFile:
    """A sync sites file's parts (`sync_sites_file.SyncSitesFile`), decoded once. Empty, it is bad input
    like any other (not `CutShort`: its trace is whole, and skipping it is not the fix)."""
    try:
        text = _read_json(path, MAX_SYNC_SITES_BYTES, budget.SIDECAR_MEMORY_FACTOR, _sync_sites_too_large)
    except CutShort as cut:
        raise TraceLoadError(str(cut)) from None
    try:
        document = msgspec.json.decode(text)
    except UnicodeDecodeError:
        raise TraceLoadError(f"{path}: not UTF-8 text") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise TraceLoadError(f"{path}: not JSON ({_first_line(error)})") from None
    except RecursionError:
        raise TraceLoadError(f"{path}: JSON nested too deeply to be a sync sites file") from None
    del text
    parts = sync_sites_file.decode(document)
    if parts is None:
        raise TraceLoadError(f"{path}: not a sync sites file (no 'sites' list of objects)")
    return parts


def read_device_peaks(path: Path) -> dict | None:
    """The JSON object of a `<worker>.peaks.json` file, or None (with a warning) when it is not one:
    the peaks only refine the report, so a damaged file never stops the trace from loading.
    `trainprof.analysis.peaks` checks the fields."""
    try:
        text = _read_json(path, MAX_SYNC_SITES_BYTES, budget.SIDECAR_MEMORY_FACTOR, _peaks_too_large)
        document = msgspec.json.decode(text)
    except (TraceLoadError, msgspec.DecodeError, UnicodeDecodeError, RecursionError) as error:
        logger.warning("%s: ignored, not a peaks file (%s)", path, _first_line(error))
        return None
    if not isinstance(document, dict):
        logger.warning("%s: ignored, not a JSON object", path)
        return None
    return document


def read_memory_file(path: Path) -> memory_file.MemoryFile | None:
    """A `<worker>.memory.json` (`trainprof.trace.memory_file`), or None (with a warning) when it is
    not one: typed decoding checks every field and bound, and a damaged file never stops the trace
    from loading (the allocator's state refines the memory report; the trace is the evidence)."""
    try:
        text = _read_json(path, MAX_SYNC_SITES_BYTES, budget.SIDECAR_MEMORY_FACTOR, _memory_file_too_large)
        return memory_file.decode(text)
    except (TraceLoadError, msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError) as error:
        logger.warning("%s: ignored, not a trainprof memory file (%s)", path, _first_line(error))
        return None


def memory_files_without_trace(folder: Path) -> list[memory_file.MemoryFile]:
    """For a run folder without trace files (nor runs holding some): its memory files whose
    out-of-memory error no trace explains (the loop failed before a recorded window ended), in name
    order; what `analyze` reports for such a folder. Empty for any other folder."""
    if not folder.is_dir() or _profiler_files(folder) or newest_run(folder)[0] is not None:
        return []
    found = []
    for path in sorted(folder.glob(f"*{MEMORY_SUFFIX}")):
        document = read_memory_file(path) if path.is_file() else None
        if document is not None and document.out_of_memory_after(None) is not None:
            found.append(document)
    return found


def read_code_layout(path: Path) -> CodeLayout | None:
    """The run's `code_layout` recorded in a version-2 sync sites file (None in version 1)."""
    return _read_sync_sites_file(path).code_layout


def read_compile_counters(path: Path) -> dict | None:
    """Dynamo's counters recorded in a sync sites file (`sync_sites_file.CompileCounters`); None when
    absent."""
    counters = _read_sync_sites_file(path).compile
    return counters.to_dict() if counters is not None else None


def _trace_too_large(path: Path, what: str) -> str:
    return (f"{path}: {what}; to read it anyway, raise the limit with --max-trace-bytes or env "
            f"{MAX_TRACE_BYTES_ENV} (e.g. 8G)")


def _sync_sites_too_large(path: Path, what: str) -> str:
    return f"{path}: {what} (the limit of a sync sites file: sessions write kilobytes)"


def _memory_file_too_large(path: Path, what: str) -> str:
    return f"{path}: {what} (the limit of a memory file, as of a sync sites file: sessions write kilobytes)"


def _peaks_too_large(path: Path, what: str) -> str:
    return f"{path}: {what} (the limit of a peaks file, as of a sync sites file: sessions write bytes)"


def _read_json(
    path: Path, limit: int, factor: int, too_large: Callable[[Path, str], str]
) -> bytes | bytearray:
    """The file's JSON text, gunzipped when it is gzip; regular files only. TraceLoadError (its
    message from `too_large` for the size) past `limit` counted bytes, or when `factor` x its
    counted size does not fit in the memory the process may still allocate (trainprof.trace.budget)."""
    try:
        fd = open_to_read(path)  # non-blocking (a FIFO); under `reads_confined_to`, inside its folder only
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise TraceLoadError(f"{path}: not a regular file ({file_kind(info.st_mode)})")
            if info.st_size > limit:
                raise TraceLoadError(too_large(path, f"more than {limit:,} bytes of JSON"))
            budget.check_memory(info.st_size, 0, 1)
            # A size of 0 may still hold text (/proc files): read those up to the limit only, in
            # pieces (read(limit + 1) would allocate the limit at once).
            text = file.read() if info.st_size else b"".join(_pieces_up_to(file, limit + 1))
    except OSError as error:
        raise TraceLoadError(f"{path}: cannot read ({error.strerror or error})") from None
    except budget.OutOfMemory as error:
        raise TraceLoadError(f"{path}: {error}") from None
    if len(text) > limit:
        raise TraceLoadError(too_large(path, f"more than {limit:,} bytes of JSON"))
    if not text:
        raise CutShort(path, "empty file")
    try:
        if text[:2] == b"\x1f\x8b" or text == b"\x1f":  # (a gzip file cut after its first byte)
            text = _gunzip(path, text, limit, too_large)
        counted = budget.counted_size(text, limit, factor)
        if counted > limit:
            raise TraceLoadError(too_large(path, f"{budget.counted(text)[1]}, more than {limit:,}"))
        budget.check_memory(counted, len(text), factor)
    except budget.OutOfMemory as error:
        raise TraceLoadError(f"{path}: {error}") from None
    return text


def _pieces_up_to(file: Any, most: int) -> Iterator[bytes]:
    while most > 0 and (piece := file.read(min(most, 2**20))):
        most -= len(piece)
        yield piece


def _gunzip(path: Path, raw: bytes, limit: int, too_large: Callable[[Path, str], str]) -> bytes | bytearray:
    try:
        text = budget.gunzip(raw, limit, room=lambda size: budget.check_memory(size, 0, 1))
    except EOFError:
        raise CutShort(path, "cut short (the gzip stream ends early)") from None
    except (budget.InflateError, OSError) as error:
        raise TraceLoadError(f"{path}: corrupt gzip ({error})") from None
    except budget.TooLarge:
        raise TraceLoadError(too_large(path, f"more than {limit:,} bytes of JSON after gunzip")) from None
    if not text:
        raise CutShort(path, "empty file (inside gzip)")
    return text


# The C scanner's category codes: each kept category's index in KEPT_CATEGORIES, its aliases' too.
_SCAN_CATEGORIES = (*KEPT_CATEGORIES, *CATEGORY_ALIASES)
_SCAN_CODES = tuple(KEPT_CATEGORIES.index(CATEGORY_ALIASES.get(c, c)) for c in _SCAN_CATEGORIES)
_SCAN_CATEGORY_BYTES = tuple(c.encode() for c in _SCAN_CATEGORIES)


def _scanned(path: Path, text: bytes | bytearray):
    """`_parse`'s result from the C scanner (`trainprof/trace/_scan.c`), or None where it reads the
    text otherwise (not built, or a trace it leaves to msgspec: see the C file) or finds no kept event
    within `MAX_TIME_US`: then msgspec's decoding and `_bucket` read it, and say what is wrong.

    The same tables as `_bucket` builds from msgspec's structs (tests/test_native_scan.py holds
    them equal), from one column per field instead of one struct per event: names and threads
    numbered in the order `_Ids` numbers them (categories in `KEPT_CATEGORIES` order, then the
    memory instants), each category's events in trace order.
    """
    if _scan is None:
        return None
    scanned = _scan.scan(text, _SCAN_CATEGORY_BYTES, _SCAN_CODES)
    if scanned is None:
        return None
    scanned_names, scanned_threads, x_bytes, strings, memory_bytes, spans = scanned
    x = np.frombuffer(x_bytes, dtype=_row_type(_scan.X_FIELDS, _scan.X_SIZE))
    m = np.frombuffer(memory_bytes, dtype=_row_type(_scan.MEMORY_FIELDS, _scan.MEMORY_SIZE))
    order = np.argsort(x["cat"], kind="stable")  # by category (KEPT_CATEGORIES order), trace order within
    name, by_number = _renumbered(x["name"], order, len(scanned_names))
    names = [scanned_names[i] for i in by_number]
    memory_rows = np.flatnonzero(_kept_memory(m["device_type"] == 1, m["total_allocated"]))
    thread_ids, by_number = _renumbered(np.concatenate((x["thread"], m["thread"])),
                                        np.concatenate((order, len(x) + memory_rows)), len(scanned_threads))
    threads = [scanned_threads[i] for i in by_number]
    thread = thread_ids[: len(x)]

    bounds = np.searchsorted(x["cat"][order], np.arange(len(KEPT_CATEGORIES) + 1)).tolist()
    rows_of = {category: order[bounds[code] : bounds[code + 1]]
               for code, category in enumerate(KEPT_CATEGORIES)}
    tables, op_inputs = _scanned_tables(x, name, thread, names, rows_of, text)
    if not any(len(table) for table in tables.values()):
        return None  # every event timed beyond MAX_TIME_US: msgspec's path says so
    kept = m[memory_rows]
    memory = _memory_events(kept["ts"], thread_ids[len(x) :][memory_rows], kept["total_allocated"],
                            kept["alloc_bytes"], kept["addr"], kept["total_reserved"])
    ops = rows_of["cpu_op"]
    calls = ops[x["collective"][ops] >= 0] if "record_param_comms" in names else ops[:0]
    collectives = CollectiveCalls.from_columns(
        x["ts"][calls], x["dur"][calls], thread[calls], [strings[i] for i in x["collective"][calls].tolist()],
        x["in_nelems"][calls], x["out_nelems"][calls],
        [strings[i] if i >= 0 else None for i in x["dtype"][calls].tolist()], x["group_size"][calls],
    ) if len(calls) else None
    _steps_to_annotations(tables, names)
    view = memoryview(text)  # views, as msgspec.Raw is: a field over METADATA_BYTES is never copied
    raws = {field: view[slice(*spans[field])] for field in _METADATA_FIELDS if field in spans}
    return names, threads, tables, memory, collectives, op_inputs, _metadata(path, raws)


def _scanned_tables(
    x: np.ndarray, name: np.ndarray, thread: np.ndarray, names: list[str], rows_of: dict[str, np.ndarray],
    text: bytes | bytearray,
) -> tuple[dict[str, EventTable], OpInputs]:
    """Each kept category's table from the scanner's rows, as `_table` and `_op_table` build them."""
    ts, dur = x["ts"], x["dur"]
    ops = rows_of["cpu_op"]
    keep = np.fromiter(map(_has_inputs, names), dtype=bool, count=len(names))[name[ops]]
    kept = ops[keep].tolist()
    tables = {}
    for category, rows in rows_of.items():
        if category == "cpu_op":
            tables[category] = EventTable.from_columns(
                ts[ops], dur[ops], thread[ops], name[ops], np.full(len(ops), -1, dtype=np.int64),
                x["flops"][ops], x["sequence"][ops], x["fwd_thread"][ops],
                inputs=np.where(keep, np.cumsum(keep) - 1, -1),
            )
            continue
        frames = category in FRAME_CATEGORIES
        tables[category] = EventTable.from_columns(
            ts[rows], dur[rows], thread[rows], name[rows],
            np.full(len(rows), -1, dtype=np.int64) if frames else x["correlation"][rows],
            np.full(len(rows), _NAN) if frames else x["bytes"][rows],
        )
    return tables, OpInputs(
        _texts(text, x["dims"], kept), _texts(text, x["types"], kept), _texts(text, x["concrete"], kept)
    )


def _row_type(fields: tuple, size: int) -> np.dtype:
    """The numpy type of the C scanner's rows: its fields' (name, format, offset), and the row's size."""
    names, formats, offsets = zip(*fields, strict=True)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})


def _renumbered(ids: np.ndarray, sequence: np.ndarray, count: int) -> tuple[np.ndarray, list[int]]:
    """Ids 0..count-1 (one per row) numbered again by where each first appears when the rows are read
    in the order `sequence` (row numbers; rows outside it keep no number: -1); and the old ids by new
    number, of those that appear."""
    first = np.full(count, len(ids), dtype=np.int64)
    np.minimum.at(first, ids[sequence], np.arange(len(sequence)))
    by_first = np.argsort(first, kind="stable")[: int((first < len(ids)).sum())]
    number = np.full(count, -1, dtype=np.int32)
    number[by_first] = np.arange(len(by_first), dtype=np.int32)
    return number[ids], by_first.tolist()


def _texts(text: bytes | bytearray, spans: np.ndarray, rows: list[int]) -> list[bytes]:
    """The JSON text of each row's span (start, end), empty where it has none (-1)."""
    return [text[start:end] if start >= 0 else b"" for start, end in spans[rows].tolist()]


def _bucket(events: list, path: Path):
    """Kept categories' complete events, CUDA `[memory]` instants and collective records, into columns.

    Every step below is a comprehension or a C-level map over the ~50k events, not a loop of appends:
    bucketing costs about as many instructions as all the analyses of a trace together (see _Ids).
    """
    ids = _Ids()
    try:
        groups, memory_events = _group(events)
        tables = {category: _table(category, group, ids) for category, group in groups.items()}
        memory = _memory_table(memory_events, ids)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise TraceLoadError(f"{path}: malformed trace event ({type(error).__name__}: {error})") from None
    if not any(len(table) for table in tables.values()):
        raise TraceLoadError(f"{path}: {_what_is_missing(events)}")
    collectives = _collective_calls(groups["cpu_op"], ids)
    names, threads = ids.names, ids.threads
    _steps_to_annotations(tables, names)
    return names, threads, tables, memory, collectives, ids.op_inputs


def _skip(event: _Complete) -> None:
    """Where the complete events of a category the analyses do not read go."""


def _group(events: list) -> tuple[dict[str, list], list]:
    """The complete events of each kept category (in trace order), and the `[memory]` instants."""
    groups: dict[str, list] = {category: [] for category in KEPT_CATEGORIES}
    # Every name a category has had -> its list's append: older schemas cost no extra work per event.
    append_to = {category: group.append for category, group in groups.items()}
    append_to.update({alias: groups[target].append for alias, target in CATEGORY_ALIASES.items()})
    memory_events = []
    for event in events:
        if type(event) is _Complete:
            append_to.get(event.cat, _skip)(event)
        elif type(event) is _Instant and event.name == "[memory]":
            memory_events.append(event)
    return groups, memory_events


def _table(category: str, group: list, ids: _Ids) -> EventTable:
    """One category's events as an `EventTable`. Frames (python_function, cpu_op, annotations) join
    nothing by correlation and carry no byte counts: only their names and times are read (and
    cpu_op's autograd link args and recorded inputs), which skips two thirds of a trace's `args`
    lookups."""
    count = len(group)
    frames = category in FRAME_CATEGORIES
    if category == "cpu_op":
        return _op_table(group, ids)
    args = [event.args or _NO_ARGS for event in group] if not frames else []
    return EventTable.from_columns(
        [event.ts for event in group],
        [event.dur for event in group],
        ids.threads_of([event.pid for event in group], [event.tid for event in group]),
        ids.names_of([event.name for event in group]),
        np.full(count, -1, dtype=np.int64) if frames else [arg.correlation for arg in args],
        np.full(count, _NAN) if frames else [arg.bytes for arg in args],
    )


def _collective_calls(ops: list, ids: _Ids) -> CollectiveCalls | None:
    """The `record_param_comms` ops that carry a collective's args, or None when the trace has none.

    Only traces that hold the name pay for the pass over their ops.
    """
    if "record_param_comms" not in ids.known_names():
        return None
    calls = [op for op in ops if op.args is not None and op.args.collective is not None]
    if not calls:
        return None
    return CollectiveCalls.from_columns(
        [op.ts for op in calls],
        [op.dur for op in calls],
        ids.threads_of([op.pid for op in calls], [op.tid for op in calls]),
        [op.args.collective for op in calls],
        [op.args.in_nelems for op in calls],
        [op.args.out_nelems for op in calls],
        [op.args.dtype for op in calls],
        [op.args.group_size for op in calls],
    )


# Ops whose recorded inputs no analysis reads: views, allocations, autograd's bookkeeping and the
# composite ops whose kernels their children launch (`to` -> `_to_copy` -> `copy_`) launch no kernel of
# their own. Skipping them keeps a third of a GPT-2 trace's ops' inputs. `linear` and `matmul` keep
# theirs (a cast under one is its weight's when of the weight's dims: analysis.copies), and so does
# `scaled_dot_product_attention` (its mask and flags: analysis.attention).
_INPUTLESS_OPS = frozenset(
    "aten::" + name
    for name in (
        "view empty empty_strided empty_like as_strided transpose t reshape _unsafe_view expand permute "
        "slice select narrow unsqueeze squeeze detach alias result_type unbind split chunk lift_fresh "
        "resolve_conj resolve_neg is_same_size to _to_copy layer_norm dropout softmax "
        "log_softmax cross_entropy_loss nll_loss nll_loss_nd item _local_scalar_dense contiguous clone "
        "zeros zeros_like ones ones_like full"
    ).split()
) | {"detach"}
_INPUTLESS_PREFIXES = ("autograd::engine::evaluate_function", "torch::autograd::")
_AUTOGRAD_NODE = re.compile(r"Backward\d*$")


def _op_table(group: list, ids: _Ids) -> EventTable:
    """The cpu_ops, with their autograd link, recorded FLOPs and recorded inputs (`_CompleteArgs`);
    the inputs' JSON text goes to `ids.op_inputs` (ops of `_INPUTLESS_OPS` left out: slot -1)."""
    count = len(group)
    args = [event.args or _NO_ARGS for event in group]
    name_ids = ids.names_of([event.name for event in group])
    keep = ids.wanted_names(_has_inputs)[name_ids] if count else np.zeros(0, dtype=bool)
    kept = list(itertools.compress(args, keep.tolist())) if not keep.all() else args
    ids.op_inputs = OpInputs(
        [arg.input_dims for arg in kept],
        [arg.input_types for arg in kept],
        [arg.concrete_inputs for arg in kept],
    )
    slots = np.where(keep, np.cumsum(keep) - 1, -1)
    return EventTable.from_columns(
        [event.ts for event in group],
        [event.dur for event in group],
        ids.threads_of([event.pid for event in group], [event.tid for event in group]),
        name_ids,
        np.full(count, -1, dtype=np.int64),
        [arg.flops for arg in args],
        [arg.sequence for arg in args],
        [arg.fwd_thread for arg in args],
        inputs=slots,
    )


def _has_inputs(name: str) -> bool:
    """Whether an op's recorded inputs are kept (see `_INPUTLESS_OPS`)."""
    return not (name in _INPUTLESS_OPS or name.startswith(_INPUTLESS_PREFIXES) or _AUTOGRAD_NODE.search(name))


def _memory_table(events: list, ids: _Ids) -> EventTable:
    """CUDA `[memory]` instants: time, `Total Allocated`, `Total Reserved`, and the block's `Bytes`
    and `Addr` (NaN when absent, and `Bytes` or `Total Reserved` beyond `MAX_MEMORY_BYTES`). Host
    memory (`Device Type` 0) and totals that are absent or not numbers within `MAX_MEMORY_BYTES`
    (`"Total Allocated": "inf"`) are left out."""
    count = len(events)
    args = [event.args or _NO_INSTANT_ARGS for event in events]
    allocated = np.fromiter([arg.total_allocated for arg in args], dtype=np.float64, count=count)  # None: NaN
    # Compared as Python ints: a Device Type outside int64 (2**63) is simply not CUDA.
    on_cuda = np.fromiter([arg.device_type == 1 for arg in args], dtype=bool, count=count)  # 1 = CUDA
    keep = _kept_memory(on_cuda, allocated)
    kept = list(itertools.compress(events, keep.tolist())) if not keep.all() else events
    return _memory_events(
        [event.ts for event in kept],
        ids.threads_of([event.pid for event in kept], [event.tid for event in kept]),
        allocated[keep],
        np.fromiter([arg.alloc_bytes for arg in args], dtype=np.float64, count=count)[keep],
        np.fromiter([arg.addr for arg in args], dtype=np.float64, count=count)[keep],
        np.fromiter([arg.total_reserved for arg in args], dtype=np.float64, count=count)[keep],
    )


def _kept_memory(on_cuda: np.ndarray, allocated: np.ndarray) -> np.ndarray:
    """Which `[memory]` instants are kept: CUDA blocks with a total within `MAX_MEMORY_BYTES` (False
    for NaN: an absent total)."""
    return on_cuda & (np.abs(allocated) <= MAX_MEMORY_BYTES)


def _memory_events(
    starts, thread: np.ndarray, allocated: np.ndarray, block_bytes: np.ndarray, addr: np.ndarray,
    reserved: np.ndarray,
) -> EventTable:
    """The kept `[memory]` instants' table; a block size or reserved total beyond `MAX_MEMORY_BYTES`
    is NaN (sums of such would overflow)."""
    count = len(starts)
    return EventTable.from_columns(
        starts,
        np.zeros(count),
        thread,
        np.zeros(count, dtype=np.int32),
        np.full(count, -1, dtype=np.int64),
        allocated,
        block_bytes=np.where(np.abs(block_bytes) <= MAX_MEMORY_BYTES, block_bytes, _NAN),
        addr=addr,
        reserved=np.where(np.abs(reserved) <= MAX_MEMORY_BYTES, reserved, _NAN),
    )


class _Ids:
    """Event names and (pid, tid) threads, numbered in order of first appearance as categories are
    bucketed (the order `Trace.names` and `Trace.threads` keep).

    Why this shape: a comprehension of `dict.setdefault` calls cost ~1,100 instructions per event
    for its name and ~1,400 for its thread (a tuple per event). Names now go through one C-level
    `map` over a `defaultdict` that numbers what it has not seen (~740); threads are ints in every
    torch trace, so numpy finds a group's few distinct ones (~900 with the two attribute reads).
    """

    def __init__(self) -> None:
        self._name_index: defaultdict[str, int] = defaultdict(itertools.count().__next__)
        self._thread_index: dict[tuple, int] = {}
        self.op_inputs: OpInputs | None = None
        """The cpu_ops' recorded inputs, set when the cpu_op table is built."""

    @property
    def names(self) -> list[str]:
        """Every name seen, by number: copies, not the decoded strings. A trace's names outlive its
        events, and the first event of each name lies anywhere in the decoder's memory: keeping
        those strings kept 0.4 MB of it from going back to the system before the next file
        (peak RSS after loading ddp_straggler's two ranks in one process: 55.9 -> 55.5 MB)."""
        return [_copy(name) for name in self._name_index]

    def known_names(self) -> Mapping[str, int]:
        """The names seen so far (a read-only view: looking a name up here numbers nothing)."""
        return MappingProxyType(self._name_index)

    @property
    def threads(self) -> list[tuple]:
        """Every (pid, tid) seen, by number."""
        return list(self._thread_index)

    def wanted_names(self, predicate) -> np.ndarray:
        """A boolean array over the names numbered so far: which satisfy `predicate(name)`."""
        return np.fromiter(map(predicate, self._name_index), dtype=bool, count=len(self._name_index))

    def names_of(self, names: list[str]) -> np.ndarray:
        """Per event, the number of its name."""
        return np.fromiter(map(self._name_index.__getitem__, names), dtype=np.int32, count=len(names))

    def threads_of(self, pids: list, tids: list) -> np.ndarray:
        """Per event, the number of its (pid, tid)."""
        count = len(tids)
        if not count:
            return np.zeros(0, dtype=np.int32)
        # A group's events share one pid (a process, or a device for GPU events) in every trace
        # seen: then the tids alone are the key.
        one_pid = type(pids[0]) is int and pids.count(pids[0]) == count
        try:
            # sum() is the cheapest all-int check (TypeError at a string id); fromiter alone would
            # read "12" as 12. OverflowError: an id outside int64.
            sum(tids)
            tid = np.fromiter(tids, dtype=np.int64, count=count)
            if not one_pid:
                sum(pids)
                pid = np.fromiter(pids, dtype=np.int64, count=count)
        except (TypeError, OverflowError):
            keys = list(zip(pids, tids, strict=True))
            local = {key: self._number(key) for key in dict.fromkeys(keys)}
            return np.fromiter(map(local.__getitem__, keys), dtype=np.int32, count=count)
        pairs = tid if one_pid else np.stack((pid, tid), axis=1)
        _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True, axis=0)
        number = np.empty(len(first), dtype=np.int32)
        for distinct, row in sorted(enumerate(first.tolist()), key=lambda pair: pair[1]):
            number[distinct] = self._number((pids[row], tids[row]))
        return number[inverse.reshape(-1)]

    def _number(self, thread: tuple) -> int:
        return self._thread_index.setdefault(thread, len(self._thread_index))


def _copy(text: str) -> str:
    """A new string equal to `text` (any text: lone surrogates from JSON escapes included)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


_KINDS_NAMED = 6  # event kinds the error names, most frequent first: enough to recognise the file


def _what_is_missing(events: list) -> str:
    """The message for events none of which the analyses read: what they need, and what the file has."""
    found: dict[str, int] = {}
    for event in events:
        key = f"{_phase(event) or '?'}:{event.cat or '-'}"
        found[key] = found.get(key, 0) + 1
    ranked = sorted(found.items(), key=lambda kv: -kv[1])[:_KINDS_NAMED]
    common = ", ".join(f"{key} x{n}" for key, n in ranked)
    return (
        "no events trainprof reads: it needs complete ('ph': 'X') events of a category such as "
        f"cpu_op, kernel or cuda_runtime (or PyTorch 1.8's Operator, Kernel, Runtime); this file has {common}"
    )


def _steps_to_annotations(tables: dict[str, EventTable], names: list[str]) -> None:
    """PyTorch <= 1.9 wrote `ProfilerStep#N` as an `Operator` (now `cpu_op`) event; the analyses read
    steps from `user_annotation`, where later versions put them: move them there."""
    ops, annotations = tables["cpu_op"], tables["user_annotation"]
    if not len(ops):
        return
    is_step = np.fromiter((n.startswith("ProfilerStep#") for n in names), dtype=bool, count=len(names))
    moved = is_step[ops.name]
    if not moved.any() or is_step[annotations.name].any():
        return
    steps = ops.select(moved)
    tables["cpu_op"] = ops.select(~moved)
    tables["user_annotation"] = EventTable.from_columns(
        *(np.concatenate((getattr(annotations, c), getattr(steps, c))) for c in _COLUMNS)
    )


_COLUMNS = ("start_us", "dur_us", "thread", "name", "correlation", "value")
