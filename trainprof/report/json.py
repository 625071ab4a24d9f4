"""summary.json and `--json`: a result in its JSON form (`to_dict()`), encoded by msgspec in pieces.

The fields of an analysis's JSON (`schema_version` 1) are documented in `trainprof.analysis.result`.

The document is encoded and written piece by piece (each member of the top-level objects, findings
one by one, long lists of rows `BATCH_ITEMS` at a time) and never held whole as one string: a run
of 200,000 steps writes hundreds of megabytes, and one `write` of more than 2 GiB is cut short by
the kernel (Linux writes at most 2,147,479,552 bytes per call). Strings longer than
`JSON_TEXT_CHARS` (a hostile trace's multi-megabyte names, repeated in every finding that names
them) are cut, ending with `…`. Characters a terminal must not see raw (C1 controls, bidirectional
overrides, U+2028/2029: `trainprof.report.text`) are written as `\\uXXXX` escapes, which decode to the
same text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec

from trainprof.report.text import cut, escape_unsafe_json, without_surrogates

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.diff import TraceDiff
    from trainprof.analysis.result import Analysis

JSON_TEXT_CHARS = 8192
"""Characters of a string in the JSON, at most (the longest real kernel names: ~5,200)."""
RECURSE_ITEMS = 64
"""A list of objects at most this long is written object by object (findings, traces, ranks)."""
BATCH_ITEMS = 256
"""A longer list of objects (step rows, a sync's occurrences) is encoded this many rows at a time."""
WRITE_BYTES = 1 << 20
"""Bytes per write, at most."""



def _numpy_to_python(value: Any) -> Any:
    """msgspec's hook for types it does not know: numpy scalars and arrays become Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise NotImplementedError(f"cannot write {type(value).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_numpy_to_python)


def _capped(value: Any) -> Any:
    """`value` with every string (keys included) cut to `JSON_TEXT_CHARS` and lone surrogates
    replaced (they have no UTF-8 form)."""
    if isinstance(value, str):
        return without_surrogates(cut(value, JSON_TEXT_CHARS))
    if isinstance(value, dict):
        return {_capped(key) if isinstance(key, str) else key: _capped(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_capped(item) for item in value]
    return value


def _may_hold_long_string(encoded: bytes) -> bool:
    """Whether JSON text may hold a string longer than `JSON_TEXT_CHARS`: the longest run between
    two quotes, escaped quotes dropped first (a quote inside a name must not split it in two; a run
    this over-counts only costs a walk). Bytes operations: ~3 ms per MB."""
    if len(encoded) <= JSON_TEXT_CHARS:
        return False
    return max(map(len, encoded.replace(b'\\"', b"").split(b'"'))) > JSON_TEXT_CHARS


def _encode(value: Any, indent: bool, level: int) -> bytes:
    """One value as JSON, indented as if it stood at depth `level` (with `indent`)."""
    try:
        encoded = _ENCODER.encode(value)
    except UnicodeEncodeError:  # a lone surrogate
        encoded = _ENCODER.encode(_capped(value))
    if _may_hold_long_string(encoded):  # the walk costs ~15 us a step row: only when needed
        encoded = _ENCODER.encode(_capped(value))
    if not encoded.isascii() or b"\x7f" in encoded:
        encoded = escape_unsafe_json(encoded.decode()).encode()
    if indent:
        encoded = msgspec.json.format(encoded, indent=1)
        if level:
            encoded = encoded.replace(b"\n", b"\n" + b" " * level)  # JSON strings hold no raw newline
    return encoded


def pieces(document: Analysis | TraceDiff | dict[str, Any], indent: bool = False) -> Iterator[bytes]:
    """The JSON of `document` (a record's `to_dict()`, or JSON-ready data) as consecutive pieces of
    bytes; NaN and infinities become null (msgspec's rule for non-finite floats)."""
    data = document if isinstance(document, dict) else document.to_dict()
    yield from _pieces(data, indent, 0)


def _pieces(value: Any, indent: bool, level: int) -> Iterator[bytes]:
    member = (b"\n" + b" " * (level + 1)) if indent else b""
    end = (b"\n" + b" " * level) if indent else b""
    if isinstance(value, dict) and value:
        colon = b": " if indent else b":"
        yield b"{"
        for index, (key, item) in enumerate(value.items()):
            yield (b"," if index else b"") + member + _encode(str(key), False, 0) + colon
            yield from _pieces(item, indent, level + 1)
        yield end + b"}"
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        yield b"["
        if len(value) <= RECURSE_ITEMS:
            for index, item in enumerate(value):
                yield (b"," if index else b"") + member
                yield from _pieces(item, indent, level + 1)
        else:
            for start in range(0, len(value), BATCH_ITEMS):
                batch = _encode(value[start : start + BATCH_ITEMS], indent, level)
                body = batch[1:-1].rstrip() if indent else batch[1:-1]  # the rows, without [ ]
                yield (b"," if start else b"") + body
        yield end + b"]"
    else:
        yield _encode(value, indent, level)


def dumps(document: Analysis | TraceDiff | dict[str, Any], indent: bool = False) -> str:
    """One JSON object (`pieces`, joined)."""
    return b"".join(pieces(document, indent)).decode()


def write_json_to(
    document: Analysis | TraceDiff | dict[str, Any], file: IO[str], indent: bool = False
) -> None:
    """Write the JSON of `document` and a newline to `file` (a text stream: its binary buffer when
    it has one), in writes of at most `WRITE_BYTES`."""
    binary = getattr(file, "buffer", None)
    if binary is None:
        for piece in pieces(document, indent):
            file.write(piece.decode())
        file.write("\n")
        return
    file.flush()  # what was written as text goes first
    for chunk in _chunks(pieces(document, indent)):
        binary.write(chunk)
    binary.write(b"\n")
    binary.flush()


def _chunks(parts: Iterator[bytes]) -> Iterator[bytes]:
    """`parts` regrouped into chunks of at most `WRITE_BYTES` (few small writes, no huge one)."""
    buffer = bytearray()
    for part in parts:
        buffer += part
        while len(buffer) >= WRITE_BYTES:
            yield bytes(buffer[:WRITE_BYTES])
            del buffer[:WRITE_BYTES]
    if buffer:
        yield bytes(buffer)


def write_json(analysis: Analysis, path: str | Path) -> Path:
    """Write summary.json (atomically: a full disk leaves no half-written file); returns its path."""
    from trainprof.files import write_atomically

    return write_atomically(path, _chunks(_with_newline(pieces(analysis, indent=True))))


def _with_newline(parts: Iterator[bytes]) -> Iterator[bytes]:
    yield from parts
    yield b"\n"
