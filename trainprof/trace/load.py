"""Load torch.profiler Chrome traces (.json, .json.gz, or a folder of them) into `Trace` objects.

Matching rules, exactly:
- A folder is searched (not recursively) for `*.pt.trace.json` and `*.pt.trace.json.gz`; if it has
  none, every other `*.json` / `*.json.gz` in it except `*.syncsites.json` that parses as a trace.
- A trace's worker is its file name up to the first `.` (`tensorboard_trace_handler(dir, worker_name=W)`
  writes `W.<timestamp>.pt.trace.json[.gz]`). Its captured sync sites are read from
  `<same folder>/<worker>.syncsites.json` when that file exists.
- The rank is `distributedInfo.rank` when the trace has it, else the number in the worker name after
  `rank` (e.g. `rank1`, `rank_1`, `trainer-rank-3`), else None.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

try:  # ISA-L's inflate: 4 ms against zlib's 26 ms for the 15 MB gpt2_pathologies trace
    from isal.isal_zlib import decompressobj as _decompressobj
    from isal.isal_zlib import error as _InflateError
except ImportError:  # pragma: no cover - isal is a dependency; zlib serves where it has no wheel
    from zlib import decompressobj as _decompressobj
    from zlib import error as _InflateError

from trainprof.trace.model import KEPT_CATEGORIES, EventTable, Trace
from trainprof.user_code import CodeLayout

SYNCSITES_SUFFIX = ".syncsites.json"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_NAN = math.nan


class TraceLoadError(ValueError):
    """A path that is not a readable torch.profiler trace; the message names the file and the problem."""


def load_traces(path: str | Path, on_file: Callable[[Path, int, int], None] | None = None) -> list[Trace]:
    """Load one trace file, or every trace in a folder (one per rank/worker), sorted by rank then name.

    `on_file(file, index, count)`, if given, is called before each file is read (for progress bars).
    """
    root = Path(path)
    if not root.exists():
        raise TraceLoadError(f"{root}: no such file or folder")
    if root.is_dir():
        files = trace_files(root)
        traces = []
        for index, file in enumerate(files):
            if on_file is not None:
                on_file(file, index, len(files))
            try:
                traces.append(load_trace(file))
            except TraceLoadError:
                if file.name.endswith((".pt.trace.json", ".pt.trace.json.gz")) or len(files) == 1:
                    raise
        if not traces:
            raise TraceLoadError(f"{root}: folder holds no torch.profiler trace (*.pt.trace.json[.gz])")
        traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.path.name))
        return traces
    if on_file is not None:
        on_file(root, 0, 1)
    return [load_trace(root)]


def trace_files(folder: Path) -> list[Path]:
    """The candidate trace files of a folder (see the module docstring for the rule)."""
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))
    )
    if not files:
        files = sorted(
            p
            for p in folder.iterdir()
            if p.is_file()
            and p.name.endswith((".json", ".json.gz"))
            and not p.name.endswith(SYNCSITES_SUFFIX)
        )
    if not files:
        raise TraceLoadError(f"{folder}: folder holds no torch.profiler trace (*.pt.trace.json[.gz])")
    return files


def worker_name(path: Path) -> str:
    """The worker part of a trace file name: everything before the first `.`."""
    return path.name.split(".", 1)[0]


def sync_sites_path(path: Path) -> Path:
    """Where the captured sync sites of the trace at `path` live: `<folder>/<worker>.syncsites.json`."""
    return path.with_name(worker_name(path) + SYNCSITES_SUFFIX)


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
        names, threads, tables, memory, metadata = _parse(path)

    distributed = metadata.get("distributedInfo")
    worker = worker_name(path)
    rank = None
    if isinstance(distributed, dict) and isinstance(distributed.get("rank"), int):
        rank = distributed["rank"]
    else:
        match = _RANK_IN_NAME.search(worker)
        rank = int(match.group(1)) if match else None
    sites_path = sync_sites_path(path)
    sites = read_sync_sites(sites_path) if sites_path.is_file() else None
    layout = read_code_layout(sites_path) if sites is not None else None
    return Trace(
        path=path,
        worker=worker,
        rank=rank,
        names=names,
        threads=threads,
        events=tables,
        memory=memory,
        device_properties=list(metadata.get("deviceProperties") or []),
        distributed_info=distributed if isinstance(distributed, dict) else None,
        metadata=metadata,
        sync_sites=sites,
        sync_sites_path=sites_path if sites is not None else None,
        code_layout=layout,
    )


class _Args(msgspec.Struct):
    """The few `args` of an event that the analyses read; msgspec skips the rest while parsing."""

    correlation: int = -1
    bytes: float = _NAN
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    device_type: int = msgspec.field(default=1, name="Device Type")
    # Kineto's forward/backward link of a cpu_op (trainprof.analysis.attribution reads them).
    sequence: int = msgspec.field(default=-1, name="Sequence number")
    fwd_thread: int = msgspec.field(default=-1, name="Fwd thread id")


_NO_ARGS = _Args()


class _Event(msgspec.Struct):
    """One Chrome trace event, as far as the analyses need it."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    dur: float = 0.0
    args: _Args | None = None


class _Document(msgspec.Struct):
    """A trace file's top level: the events plus the metadata the analyses read."""

    traceEvents: list[_Event]  # noqa: N815 (the trace format's name)
    deviceProperties: list | None = None  # noqa: N815
    distributedInfo: dict | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815
    traceName: str | None = None  # noqa: N815


# Typed decoding builds compact structs and skips unused fields in one pass: ~6x faster than a
# generic JSON parse into dicts on a 15 MB trace (0.03 s against 0.17 s for orjson on this
# project's gpt2_pathologies fixture, 2026-11-21).
_DOCUMENT = msgspec.json.Decoder(_Document | list[_Event])


def _parse(path: Path):
    """Read, parse and bucket one file; returns (names, threads, tables, memory, metadata)."""
    raw = _read_bytes(path)
    try:
        document = _DOCUMENT.decode(raw)
    except msgspec.ValidationError:
        document = _lenient_document(path, raw)
    except msgspec.DecodeError as error:
        raise TraceLoadError(f"{path}: not JSON ({_first_line(error)})") from None
    if isinstance(document, _Document):
        events = document.traceEvents
        metadata = {
            field: getattr(document, field)
            for field in _Document.__struct_fields__
            if field != "traceEvents" and getattr(document, field) is not None
        }
    else:
        events, metadata = document, {}
    if not events:
        raise TraceLoadError(f"{path}: trace has no events")
    return (*_bucket(events, path), metadata)


def _lenient_document(path: Path, raw: bytes) -> _Document | list[_Event]:
    """A trace from another tool whose field types differ from torch's (e.g. string times), or no trace."""
    generic = msgspec.json.decode(raw)  # raw already parsed as JSON once: this cannot fail
    if isinstance(generic, dict):
        if not isinstance(generic.get("traceEvents"), list):
            raise TraceLoadError(f"{path}: JSON but not a profiler trace (no 'traceEvents' list)")
        target: type = _Document
    elif isinstance(generic, list):
        target = list[_Event]
    else:
        raise TraceLoadError(f"{path}: JSON but not a profiler trace (top level is {type(generic).__name__})")
    try:
        return msgspec.convert(generic, target, strict=False)
    except msgspec.ValidationError as error:
        raise TraceLoadError(f"{path}: malformed trace event ({_first_line(error)})") from None


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def read_sync_sites(path: Path) -> list[dict]:
    """The `sites` list of a `<worker>.syncsites.json` file (contract in DEVELOPING.md)."""
    try:
        document = msgspec.json.decode(_read_bytes(path))
    except msgspec.DecodeError as error:
        raise TraceLoadError(f"{path}: not JSON ({_first_line(error)})") from None
    sites = document.get("sites") if isinstance(document, dict) else None
    if not isinstance(sites, list) or not all(isinstance(s, dict) for s in sites):
        raise TraceLoadError(f"{path}: not a sync sites file (no 'sites' list of objects)")
    return sites


def read_code_layout(path: Path) -> CodeLayout | None:
    """The run's `code_layout` recorded in a version-2 sync sites file (None in version 1)."""
    document = msgspec.json.decode(_read_bytes(path))  # already read and checked by read_sync_sites
    return CodeLayout.from_dict(document.get("code_layout")) if isinstance(document, dict) else None


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TraceLoadError(f"{path}: cannot read ({error.strerror or error})") from None
    if not raw:
        raise TraceLoadError(f"{path}: empty file")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(raw)
        except (_InflateError, EOFError, OSError) as error:
            raise TraceLoadError(f"{path}: truncated or corrupt gzip ({error})") from None
        if not raw:
            raise TraceLoadError(f"{path}: empty file (inside gzip)")
    return raw


def _gunzip(raw: bytes) -> bytes:
    """Inflate a gzip file's bytes; raises EOFError when the stream ends early."""
    inflater = _decompressobj(wbits=31)
    data = inflater.decompress(raw)
    if not inflater.eof:
        raise EOFError("the compressed stream ends early")
    if inflater.unused_data:  # more gzip members follow (rare): the general reader joins them all
        data = gzip.decompress(raw)
    return data


def _bucket(events: list, path: Path):
    """Kept categories' complete events and CUDA `[memory]` instants, into columns."""
    name_ids: dict[str, int] = {}
    thread_ids: dict[tuple, int] = {}
    columns: dict[str, tuple[list, ...]] = {}
    mem_ts: list[float] = []
    mem_alloc: list[float] = []
    mem_thread: list[int] = []
    try:
        # Comprehensions over the ~50k events, one per column, run faster than one loop of appends.
        groups: dict[str, list] = {category: [] for category in KEPT_CATEGORIES}
        memory_events = []
        for event in events:
            if event.ph == "X":
                group = groups.get(event.cat)
                if group is not None:
                    group.append(event)
            elif event.ph == "i" and event.name == "[memory]":
                memory_events.append(event)
        for category, group in groups.items():
            args = [event.args or _NO_ARGS for event in group]
            columns[category] = (
                [event.ts for event in group],
                [event.dur for event in group],
                [thread_ids.setdefault((event.pid, event.tid), len(thread_ids)) for event in group],
                [name_ids.setdefault(event.name, len(name_ids)) for event in group],
                [arg.correlation for arg in args],
                [arg.bytes for arg in args],
            )
            if category == "cpu_op":
                columns[category] += ([arg.sequence for arg in args], [arg.fwd_thread for arg in args])
        for event in memory_events:
            args = event.args or _NO_ARGS
            if args.total_allocated is None or args.device_type != 1:  # 1 = CUDA; skip host memory
                continue
            mem_ts.append(event.ts)
            mem_alloc.append(args.total_allocated)
            mem_thread.append(thread_ids.setdefault((event.pid, event.tid), len(thread_ids)))
        tables = {category: EventTable.from_columns(*cols) for category, cols in columns.items()}
        memory = EventTable.from_columns(
            mem_ts, [0] * len(mem_ts), mem_thread, [0] * len(mem_ts), [-1] * len(mem_ts), mem_alloc
        )
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise TraceLoadError(f"{path}: malformed trace event ({type(error).__name__}: {error})") from None
    names = [""] * len(name_ids)
    for name, nid in name_ids.items():
        names[nid] = name
    threads = [None] * len(thread_ids)
    for key, tid in thread_ids.items():
        threads[tid] = key
    if not any(len(table) for table in tables.values()):
        raise TraceLoadError(f"{path}: JSON but not a profiler trace (no cpu_op/kernel/runtime events)")
    return names, threads, tables, memory
