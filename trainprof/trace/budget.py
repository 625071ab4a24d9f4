"""What reading a JSON file may cost in memory, and refusing a file before it is decoded.

Decoding holds the text and then about one Python object per JSON object in it (an event and its
`args`, a site, a frame); analysing it holds rows per event and records per step. Their cost follows
the text's bytes, its objects, its events or its steps, whichever is most. So a file counts as

    counted size = max(JSON bytes, BYTES_PER_OBJECT x JSON objects, BYTES_PER_EVENT x events,
                       BYTES_PER_STEP x step annotations)

(objects are the `{` in the text, events its `"ph"` keys, step annotations its `ProfilerStep#`: upper
bounds, as the same text inside a string counts too; a torch trace has 150-190 bytes per `{` and
300-400 per event, so its counted size is its size). The size limit applies to the counted size,
and the memory bound, stated in docs/analyze.md and measured by `benchmarks/memory_bound.py`, is

    peak RSS above the loaded interpreter <= TRACE_MEMORY_FACTOR x counted size   (a trace)
                                           <= SIDECAR_MEMORY_FACTOR x counted size (a sync sites file)

A gzip file is never held inflated past the limit: its inflated size is taken from its trailer
when that is small (the stream is then inflated once, into at most `TRUSTED_TRAILER_BYTES`), and
counted in pieces, without keeping them, otherwise. Under a memory rlimit (`ulimit -v` / `-d`) a
file whose bound does not fit in what the process may still allocate is refused with one line
before decoding: out of address space, msgspec could crash instead of raising MemoryError.
"""

from __future__ import annotations

import resource
import struct
from collections.abc import Callable, Iterator

try:  # ISA-L's inflate: 4 ms against zlib's 26 ms for the 15 MB gpt2_pathologies trace
    from isal.isal_zlib import decompressobj as _decompressobj
    from isal.isal_zlib import error as InflateError  # noqa: N812 (an exception class)
except ImportError:  # pragma: no cover - isal is a dependency; zlib serves where it has no wheel
    from zlib import decompressobj as _decompressobj
    from zlib import error as InflateError  # noqa: N812, F401 (read by the loader)

BYTES_PER_OBJECT = 128
"""What one JSON object counts as. A decoded event (struct, its strings and numbers, its slot in
the events list, its columns) costs 250-300 bytes: at 128 per object, a file of tiny objects (`{}`
events, 3 bytes each) counts 43x its bytes, and so stays within the memory bound."""
BYTES_PER_EVENT = 384
"""What one event (`"ph"`) counts as: a kept event of the fewest bytes (a 65-byte cpu_op, no args)
took 742 bytes of peak memory, one with a name of its own 967 (10^6 of them, 2-core CPU machine,
2026-11-28): within 3x of 384 where 128 per object left them at 5.8x and 7.5x. A torch trace has
300-400 bytes per event: it counts as its size, or up to ~1.2x."""
BYTES_PER_STEP = 1536
"""What one step annotation (`ProfilerStep#`) counts as: its `Step` record, its rows in every
per-step table and its JSON; a trace of nothing but 10^5 step annotations took 2,549 bytes per step
(2-core CPU machine, 2026-11-28), 21x its counted size when steps counted as their bytes."""
_WEIGHTS = ((b"{", BYTES_PER_OBJECT, "JSON objects"), (b'"ph"', BYTES_PER_EVENT, "events"),
            (b"ProfilerStep#", BYTES_PER_STEP, "step annotations"))
_MOST_PER_BYTE = max(weight // len(token) for token, weight, _ in _WEIGHTS)
"""The most a byte of text can count for (every byte part of the densest token)."""
TRACE_MEMORY_FACTOR = 3
"""Peak RSS above the loaded interpreter, per counted byte of a trace (measured: 2.3x for a torch
trace, 2.4x for compact events, under 1x for tiny objects; benchmarks/memory_bound.py)."""
SIDECAR_MEMORY_FACTOR = 8
"""The same for a sync sites file, decoded into dicts (a dict costs more than a struct)."""
TRUSTED_TRAILER_BYTES = 64 * 2**20
"""A gzip trailer (inflated size mod 2**32) up to this is trusted for a one-pass inflate; a larger
or lying one costs a counting pass first. Lying costs at most this much memory."""
_PIECE = 16 * 2**20
"""Output bytes per inflate call while counting: small next to any limit, large enough that the
unconsumed input is rarely copied."""
_INPUT_PIECE = 2**20
"""Compressed bytes fed per inflate call while counting (an unconsumed tail is copied per call)."""


class TooLarge(Exception):
    """The text passed its size limit (raised while inflating or counting)."""


class OutOfMemory(Exception):
    """The file's memory bound does not fit in what the process may still allocate."""

    def __init__(self, need: int, available: int) -> None:
        super().__init__(
            f"reading it needs up to {need / 2**20:,.0f} MiB, but this process may allocate only "
            f"{max(available, 0) / 2**20:,.0f} MiB more (ulimit -v / -d)"
        )


def counted_size(text: bytes | bytearray, limit: int, factor: int) -> int:
    """`text`'s counted size (module docstring). Objects, events and steps are counted (~2 ms per
    MB) only when they could matter: when the most `text` could hold passes `limit` or the memory
    the process may still allocate; otherwise its byte length stands in (a bound is all the checks
    need)."""
    most = len(text) * _MOST_PER_BYTE
    available = available_memory()
    if most <= limit and (available is None or factor * most <= available + len(text)):
        return len(text)
    return counted(text)[0]


def counted(text: bytes | bytearray) -> tuple[int, str]:
    """`text`'s counted size, and what made it that (for a message)."""
    size, why = len(text), f"{len(text):,} bytes of JSON"
    for token, weight, what in _WEIGHTS:
        number = text.count(token)
        if weight * number > size:
            size = weight * number
            why = (f"{number:,} {what} in {len(text):,} bytes count as {size:,} bytes ({weight} each: what "
                   "analysing them costs)")
    return size, why


def check_memory(counted: int, held: int, factor: int) -> None:
    """Raise `OutOfMemory` when `factor` x `counted` bytes, less the `held` bytes already
    allocated (the text), do not fit in what the process may still allocate."""
    available = available_memory()
    need = factor * counted - held
    if available is not None and need > available:
        raise OutOfMemory(factor * counted, available)


def available_memory() -> int | None:
    """Bytes this process may still allocate under its address-space and data rlimits (Linux:
    the limit less the current `VmSize` / `VmData`); None when neither is set or it is unknown."""
    room = None
    for limit_name, used_name in (("RLIMIT_AS", "VmSize:"), ("RLIMIT_DATA", "VmData:")):
        kind = getattr(resource, limit_name, None)
        if kind is None:
            continue
        soft, _ = resource.getrlimit(kind)
        if soft == resource.RLIM_INFINITY:
            continue
        used = _status_kib(used_name)
        if used is None:
            continue
        left = soft - used * 1024
        room = left if room is None else min(room, left)
    return room


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(field.encode()):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def gunzip(raw: bytes, limit: int, room: Callable[[int], None] = lambda size: None) -> bytes | bytearray:
    """Inflate a gzip file's bytes, every member; `TooLarge` past `limit` bytes, EOFError when a
    stream ends early, `InflateError` when it is corrupt. `room(size)` is called with the inflated
    size before it is allocated (to refuse it: the memory check).

    Memory: the inflated text only, whatever the file claims (module docstring).
    """
    # The trailer of a cut file is whatever bytes it ends with: never grounds to refuse, only a hint.
    trailer = struct.unpack("<I", raw[-4:])[0] if len(raw) >= 18 else 0
    if trailer <= min(limit, TRUSTED_TRAILER_BYTES):
        text = _inflate_one_member(raw, trailer)
        if text is not None:
            return text
    size = 0
    for piece in _pieces(raw):  # count, keeping nothing
        size += len(piece)
        if size > limit:
            raise TooLarge
    room(size)
    text = bytearray(size)
    at = 0
    for piece in _pieces(raw):
        text[at:at + len(piece)] = piece
        at += len(piece)
    return text


def _inflate_one_member(raw: bytes, size: int) -> bytes | None:
    """The text when `raw` is one gzip member (then zero padding at most) of exactly `size` bytes
    inflated; None otherwise (the caller counts). Reads at most `size + 1` bytes of output."""
    inflater = _decompressobj(wbits=31)
    text = inflater.decompress(raw, size + 1)
    if len(text) == size and inflater.eof and not inflater.unused_data.strip(b"\0"):
        return text
    if not inflater.eof and len(text) <= size:
        raise EOFError("the compressed stream ends early")
    return None


def _pieces(raw: bytes) -> Iterator[bytes]:
    """Every gzip member of `raw` inflated, in pieces of at most `_PIECE` bytes. Zero padding after
    the last member is allowed (as gzip allows it)."""
    view = memoryview(raw)
    start = 0
    while True:
        inflater = _decompressobj(wbits=31)
        at = start
        while not inflater.eof:
            if inflater.unconsumed_tail:
                piece = inflater.decompress(inflater.unconsumed_tail, _PIECE)
            elif at < len(raw):
                piece = inflater.decompress(view[at:at + _INPUT_PIECE], _PIECE)
                at = min(at + _INPUT_PIECE, len(raw))
            else:
                raise EOFError("the compressed stream ends early")
            if piece:
                yield piece
        start = at - len(inflater.unused_data)  # where the next member begins
        if raw.count(0, start) == len(raw) - start:  # nothing but padding (or nothing) left
            return
