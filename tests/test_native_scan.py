"""The loader's C scanner (`trainprof/trace/_scan.c`) against msgspec's decoding: both read a trace
into the same tables, and the scanner leaves to msgspec every trace it does not read exactly as
msgspec would (then `_scanned` is None, and the loader's result and errors are msgspec's)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from trainprof.trace import TraceLoadError
from trainprof.trace import load as loader


@pytest.fixture(autouse=True)
def _built():
    if loader._scan is None:
        pytest.fail("trainprof.trace._scan is not built: `make test` builds it (pip install -e .)")


def _equal(a, b, where: str = "") -> str | None:
    """None when `a` and `b` hold the same values (arrays: same dtype, shape and values, NaN equal to
    NaN), else where they first differ."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        same = a.dtype == b.dtype and a.shape == b.shape
        same = same and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        return None if same else f"{where}: {a.dtype}{a.shape} {a[:4]} != {b.dtype}{b.shape} {b[:4]}"
    texts = (bytes, bytearray)
    if type(a) is not type(b) and not (isinstance(a, texts) and isinstance(b, texts)):
        return f"{where}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        fields = [f.name for f in dataclasses.fields(a)]
        return next((d for f in fields if (d := _equal(getattr(a, f), getattr(b, f), f"{where}.{f}"))), None)
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} != {list(b)}"
        return next((d for k in a if (d := _equal(a[k], b[k], f"{where}[{k!r}]"))), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        pairs = enumerate(zip(a, b, strict=True))
        return next((d for i, (x, y) in pairs if (d := _equal(x, y, f"{where}[{i}]"))), None)
    if type(a).__module__.startswith("trainprof"):
        return _equal(vars(a), vars(b), where)
    same = a == b or (isinstance(a, float) and a != a and b != b)
    return None if same else f"{where}: {a!r} != {b!r}"


def _msgspec_parse(path: Path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(loader, "_scan", None)
        return loader._parse(path)


def _outcome(parse, path: Path):
    try:
        return parse(path)
    except TraceLoadError as error:
        return f"TraceLoadError: {error}"


def _torch_traces(fixtures_dir: Path) -> list[Path]:
    """The fixtures torch wrote (H200 runs, the framework stacks), and the demo's sample."""
    found = [path for folder in ("traces", "busy", "stacks")
             for path in (fixtures_dir / folder).rglob("*.pt.trace.json.gz")]
    return sorted(found) + sorted((Path(loader.__file__).parents[1] / "samples").rglob("*.pt.trace.json.gz"))


def _all_traces(fixtures_dir: Path) -> list[Path]:
    thirdparty = [p for p in (fixtures_dir / "thirdparty").rglob("*.json*")]
    return _torch_traces(fixtures_dir) + sorted(thirdparty)


def test_every_fixture_trace_is_read_into_the_same_tables(fixtures_dir, monkeypatch):
    read = 0
    for path in _all_traces(fixtures_dir):
        text = loader._read_json(path, loader.max_trace_bytes(), 3, loader._trace_too_large)
        scanned = loader._scanned(path, text)
        if scanned is None:
            continue
        read += 1
        difference = _equal(scanned, _msgspec_parse(path, monkeypatch))
        assert difference is None, f"{path.name}: {difference}"
    assert read >= len(_torch_traces(fixtures_dir)) + 5  # and most third-party ones


def test_every_trace_torch_wrote_is_read_by_the_scanner(fixtures_dir):
    for path in _torch_traces(fixtures_dir):
        text = loader._read_json(path, loader.max_trace_bytes(), 3, loader._trace_too_large)
        assert loader._scanned(path, text) is not None, path


_KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2,
           "args": {"correlation": 3, "bytes": 8}}


def _trace(*events, **document) -> bytes:
    return json.dumps({"traceEvents": list(events), **document}, ensure_ascii=False).encode()


# Traces the scanner leaves to msgspec: each differs from a readable one in one way.
LEFT_TO_MSGSPEC = {
    "escape in a name": _trace({**_KERNEL, "name": "k\\u00e9"}).replace(b"\\\\", b"\\"),
    "string tid on a kept event": _trace({**_KERNEL, "tid": "stream 7"}),
    "float for an int arg": _trace({**_KERNEL, "args": {"correlation": 3.0}}),
    "int outside int64": _trace({**_KERNEL, "args": {"correlation": 2**63}}),
    "int outside int64 in a float field": _trace({**_KERNEL, "ts": 10**19}),
    "number out of range": _trace(_KERNEL).replace(b"10.5", b"1e400"),
    "null duration": _trace({**_KERNEL, "dur": None}),
    "unknown phase": _trace(_KERNEL, {"ph": "Z", "cat": "x"}),
    "no phase": _trace(_KERNEL, {"cat": "x"}),
    "two phases": _trace(_KERNEL).replace(b'"ph": "X"', b'"ph": "X", "ph": "X"'),
    "invalid UTF-8 in a name": _trace(_KERNEL).replace(b'"name": "k"', b'"name": "k\xe2\x82"'),
    "invalid UTF-8 in a category": _trace(_KERNEL, {**_KERNEL, "cat": "q"}).replace(b'"q"', b'"\xff"'),
    "args not an object": _trace({**_KERNEL, "args": [1]}),
    "name not a string": _trace({**_KERNEL, "name": 5}),
    "deep nesting": _trace({**_KERNEL, "args": {"x": json.loads("[" * 300 + "]" * 300)}}),
    "a lone surrogate where the analyses read nothing": _trace(_KERNEL, {"ph": "f", "x": "@"}).replace(
        b"@", b"\\udc00"),
    "a high surrogate without its low one": _trace(_KERNEL, {"ph": "f", "x": "@"}).replace(
        b"@", b"\\ud800\\u0041"),
    "an escaped key (it may spell a field)": _trace(_KERNEL).replace(b'"dur"', b'"d\\u0075r"'),
    "trailing bytes": _trace(_KERNEL) + b" x",
    "trailing comma": _trace(_KERNEL).replace(b"}]}", b"},]}"),
    "control character in a string": _trace({**_KERNEL, "name": "a\tb"}).replace(b"\\t", b"\t"),
    "leading zero": _trace(_KERNEL).replace(b'"dur": 2', b'"dur": 02'),
    **{
        f"{what} where the analyses read nothing": _trace({**_KERNEL, "args": {"External id": "@"}}).replace(
            b'"@"', number)
        for what, number in (
            ("leading zero", b"01"), ("bare minus", b"-"), ("no digit after the point", b"1."),
            ("empty exponent", b"1e+"),
        )
    },
    "two event lists": _trace(_KERNEL).replace(b"]}", b'], "traceEvents": []}'),
    "no event lists": json.dumps({"deviceProperties": []}).encode(),
    "no kept event": _trace({"ph": "X", "cat": "other", "name": "a", "ts": 1}),
    "every event timed beyond MAX_TIME_US": _trace({**_KERNEL, "ts": 2.0**60}),
    "truncated": _trace(_KERNEL)[:-3],
}


@pytest.mark.parametrize("case", sorted(LEFT_TO_MSGSPEC))
def test_what_the_scanner_leaves_to_msgspec(case, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(LEFT_TO_MSGSPEC[case])
    assert loader._scanned(path, path.read_bytes()) is None
    theirs = _outcome(lambda p: _msgspec_parse(p, monkeypatch), path)
    assert _equal(_outcome(loader._parse, path), theirs) is None


# Traces the scanner reads as msgspec does, each with something a plain trace lacks.
READ_ALIKE = {
    "fields in any order, args before the phase": _trace(
        {"args": {"bytes": 1.5, "correlation": 4}, "dur": 1, "ts": 3, "tid": 2, "pid": 1, "name": "n",
         "cat": "gpu_memcpy", "ph": "X"}),
    "a later duplicate key wins": _trace(_KERNEL).replace(b'"ts": 10.5', b'"ts": 1, "ts": 10.5'),
    "string ids on events the analyses drop": _trace(
        _KERNEL, {"ph": "X", "cat": "Trace", "name": "s", "pid": "Spans", "tid": "x", "ts": 1},
        {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 5}),
    "an event list alone": json.dumps([_KERNEL]).encode(),
    "aliases and every phase": _trace(
        {**_KERNEL, "cat": "Kernel"}, {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "ts": 1,
                                      "dur": 1, "args": {"correlation": 3}},
        *({"ph": phase, "cat": "c", "name": 5, "ts": "any"} for phase in "BEICbneSTpFstfPNODMVvRc()")),
    "memory instants": _trace(
        _KERNEL,
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": 4,
         "args": {"Total Allocated": 512, "Bytes": -256, "Addr": 140000000000, "Device Type": 1}},
        {"ph": "i", "name": "[memory]", "ts": 5, "args": {"Total Allocated": None, "Device Type": 1}},
        {"ph": "i", "name": "[memory]", "ts": 6, "args": {"Total Allocated": 8, "Device Type": 0}},
        {"ph": "i", "name": "[memory]", "ts": 7, "args": {"Total Allocated": 1e300, "Bytes": 2e300}}),
    "ops with inputs, flops and collectives": _trace(
        _KERNEL,
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 5,
         "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"], "flops": 48,
                  "Sequence number": 9, "Fwd thread id": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::view", "ts": 2, "dur": 1,
         "args": {"Input Dims": [[6]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 3, "dur": 1,
         "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 10,
                  "Out msg nelems": 10, "Group size": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 4, "dur": 1,
         "args": {"Collective name": None, "dtype": None}}),
    "steps written as ops (PyTorch <= 1.9)": _trace(
        _KERNEL, {"ph": "X", "cat": "Operator", "name": "ProfilerStep#3", "ts": 1, "dur": 50}),
    "metadata": _trace(_KERNEL, deviceProperties=[{"name": "H200"}], distributedInfo={"rank": 1},
                       traceName="x", schemaVersion=1, other={"skipped": [1, 2]}),
    "numbers of every form": _trace(_KERNEL).replace(b'"dur": 2', b'"dur": -0.0e+0, "flops": 1E2'),
    "numbers of every form where the analyses read nothing": _trace(
        {**_KERNEL, "args": {"x": [0, -0.0e+0, 1E2, -12.5e-3, 10**30, 0.000001]}}),
    "negative zero as an integer": _trace(_KERNEL).replace(b'"dur": 2', b'"dur": -0'),
    "long decimals": _trace(_KERNEL).replace(b'"ts": 10.5', b'"ts": 1795302414630700.547123456789'),
    "escapes where the analyses read nothing": _trace(
        _KERNEL, {"ph": "f", "cat": "ac2g", "name": "\"q\\u0041\""}
    ).replace(b"}]}", b', "x": "\\ud800\\udc00"}]}'),
    "unicode names": _trace({**_KERNEL, "name": "ядро ⚡"}),
}


@pytest.mark.parametrize("case", sorted(READ_ALIKE))
def test_what_the_scanner_reads_as_msgspec_does(case, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(READ_ALIKE[case])
    assert loader._scanned(path, path.read_bytes()) is not None
    assert _equal(loader._parse(path), _msgspec_parse(path, monkeypatch)) is None


MUTANTS = 400


def test_mutated_traces_give_msgspecs_result_or_its_error(fixtures_dir, tmp_path, monkeypatch):
    """Bytes of a real trace deleted, duplicated or replaced by JSON's own characters: whatever the
    scanner makes of each mutant, the loader gives what msgspec alone gives."""
    base = gzip.decompress((fixtures_dir / "thirdparty/hta_cp_simple_add/"
                            "benchmark_result_493459_1694039959_trace.json.gz").read_bytes())
    alphabet = b'{}[]:,"\\ 0123456789.-eE+nultrfa\xc3\xff'
    rng = random.Random(20261125)
    scanned = 0
    for number in range(MUTANTS):
        text = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text))
            kind = rng.randrange(3)
            if kind == 0:
                del text[at : at + rng.randint(1, 8)]
            elif kind == 1:
                text[at:at] = text[at : at + rng.randint(1, 40)]
            else:
                text[at] = alphabet[rng.randrange(len(alphabet))]
        path = tmp_path / f"m{number}.json"
        path.write_bytes(bytes(text))
        scanned += loader._scanned(path, bytes(text)) is not None
        ours = _outcome(loader._parse, path)
        theirs = _outcome(lambda p: _msgspec_parse(p, monkeypatch), path)
        difference = _equal(ours, theirs)
        assert difference is None, f"mutant {number}: {difference}"
        path.unlink()
    assert scanned > MUTANTS // 10  # the scanner read a share of them: the test compared both paths


def test_a_large_metadata_field_is_not_copied(tmp_path):
    """Metadata past METADATA_BYTES is skipped unread, as msgspec.Raw skips it: never a copy of it."""
    import tracemalloc

    big = loader.METADATA_BYTES * 4
    text = _trace(_KERNEL, deviceProperties="x" * big)
    tracemalloc.start()
    try:
        scanned = loader._scanned(tmp_path / "t.json", text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scanned is not None and "deviceProperties" not in scanned[-1]
    assert peak < big / 2
