"""A seeded fuzzer for `trainprof analyze`, `trainprof diff` and the report writers: every mutant must
end in a result (exit 0: one JSON object, and every writer renders it) or one clean line (exit 2), in
bounded time and memory.

Mutants are made from the checked-in fixtures (tests/fixtures: the H200 traces and the third-party
ones, cut to their first ~1500 events so each mutant analyses in tens of ms). Mutation classes:
- the document: fields dropped, retyped or enlarged, events dropped or duplicated, names made
  hostile, metadata retyped, values nested deeply, the bytes truncated, corrupted or given invalid
  UTF-8;
- fields per event class (`FIELD_MUTATIONS`): a class's own fields (a kernel's correlation, stream
  and launch time, a step's number and span, a python frame's line, a `[memory]` device type, ...);
- compression (`COMPRESSIONS`): gzip headers, members, padding, trailers that lie, other formats;
- the sync sites file beside the trace (`SIDECARS`), built from the trace's own steps and frames;
- the folder (`FOLDERS`): windows, ranks, run folders, links, hostile file names.

Each mutant runs the CLI's `main` in process with `--debug`, so a bug raises here with its traceback
(the seed in the test id reproduces it); its analysis then goes through every writer (console, plain
text, Markdown, summary/report files, TensorBoard scalars) and, for one mutant in `DIFF_EVERY`,
through `trainprof diff` (JSON, Markdown and console) against its unmutated base. A sample also runs
as a subprocess under a memory limit. CI runs 300 mutants; `TRAINPROF_FUZZ_N=5000` runs more,
`TRAINPROF_FUZZ_SEED` moves the seeds; `python -m benchmarks.fuzz_batch` runs a measured batch.
"""

from __future__ import annotations

import bz2
import contextlib
import copy
import gzip
import heapq
import io
import json
import lzma
import os
import random
import re
import subprocess
import sys
import time
import warnings
import zlib
from functools import cache
from pathlib import Path
from unittest import mock

import msgspec
import pytest

try:
    import resource
except ImportError:  # Windows
    resource = None

N_MUTANTS = int(os.environ.get("TRAINPROF_FUZZ_N", "300"))
FIRST_SEED = int(os.environ.get("TRAINPROF_FUZZ_SEED", "0"))
N_SUBPROCESS = 4
SECONDS_PER_MUTANT = 20.0
EVENTS_PER_BASE = 1500
BASES = (
    "traces/gpt2_pathologies",
    "thirdparty/hta_cp_simple_add",
    "thirdparty/kineto_resnet50_num_workers_4",
    "thirdparty/tl_mi300_resnet_act_ckpt",
    "thirdparty/tl_h100_bert_small",
    "thirdparty/tl_b200_eager",
)
HOSTILE_NAMES = (
    "gemm[/x]", "[link=javascript:alert(1)]k[/link]", "\x1b]0;title\x07", "\x1b[2J\x1b[H", "a\rb\nc",
    "<script>alert(1)</script>", "ProfilerStep#" + "9" * 5000, "ProfilerStep#-1", "ProfilerStep#",
    "", "名前\u202e\u0000", "x" * 100_000, "cudaLaunchKernel", "hipGraphLaunch", "cudaDeviceSynchronize",
    "nn.Module: Linear_0", "train.py(12): <module>", "DataLoader.__next__",
    "k\u2028\u2029\u202e\u061c\x85\x9b2J",
)
ODD_VALUES = (
    None, True, False, 0, -1, 1, 2**63, 2**80, -(2**80), 1e308, -1e308, 1e-320, 0.5, "", "1", "inf", "nan",
    "-inf", "x" * 1000, [], {}, [1, 2], {"a": 1}, [[[[[]]]]],
)
CATEGORIES = (
    "cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation",
    "gpu_user_annotation", "python_function", "cuda_sync", "Operator", "Runtime", "Kernel", "Memcpy",
    "Memset", "Trace", "ac2g", "", "unknown",
)


@cache
def base_documents(fixtures: Path) -> tuple[dict, ...]:
    """The traces of `BASES` under `fixtures`, each cut to its first `EVENTS_PER_BASE` complete events
    from the first step (plus metadata and instant events in that span)."""
    documents = []
    for name in BASES:
        folder = fixtures / name
        file = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))[0]
        raw = file.read_bytes()
        document = msgspec.json.decode(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = document["traceEvents"]
        timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
        steps = [e["ts"] for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")]
        start = min(steps) if steps else min(e["ts"] for e in timed)
        complete = heapq.nsmallest(
            EVENTS_PER_BASE, (e["ts"] for e in timed if e["ts"] >= start and e.get("ph") == "X")
        )
        end = complete[-1]
        kept = [e for e in events if e.get("ph") == "M"]
        kept += [e for e in timed if start <= e["ts"] <= end and e.get("ph") != "M"]
        documents.append({**document, "traceEvents": kept, "_name": f"{name}/{file.name}"})
    return tuple(documents)


# -- mutations ---------------------------------------------------------------------------------------
# Each takes (rng, document) and changes the document in place, or returns bytes (the file's content).


def _some(rng: random.Random, events: list, most: int = 20) -> list:
    """Indices of up to `most` events that are objects (another mutation may have added others)."""
    objects = [i for i, event in enumerate(events) if isinstance(event, dict)]
    return [rng.choice(objects) for _ in range(rng.randint(1, most))] if objects else []


def drop_field(rng, doc):
    events = doc["traceEvents"]
    for i in _some(rng, events):
        event = events[i] = dict(events[i])
        if event:
            event.pop(rng.choice(list(event)))


def retype_field(rng, doc):
    events = doc["traceEvents"]
    for i in _some(rng, events):
        event = events[i] = copy.deepcopy(events[i])
        key = rng.choice(list(event) + ["args"])
        if key == "args" and isinstance(event.get("args"), dict) and event["args"] and rng.random() < 0.7:
            event["args"][rng.choice(list(event["args"]) + ["correlation", "Total Allocated"])] = rng.choice(
                ODD_VALUES)
        else:
            event[key] = rng.choice(ODD_VALUES)


def enlarge_numbers(rng, doc):
    events = doc["traceEvents"]
    factor = rng.choice((1e6, 1e12, 1e300, -1.0, 0.0, 1e-9))
    for i in _some(rng, events, 200):
        event = events[i] = dict(events[i])
        key = rng.choice(("ts", "dur", "pid", "tid"))
        if isinstance(event.get(key), (int, float)) and not isinstance(event.get(key), bool):
            event[key] = event[key] * factor


def drop_or_duplicate_events(rng, doc):
    events = doc["traceEvents"]
    roll = rng.random()
    if roll < 0.3:
        doc["traceEvents"] = [e for e in events if rng.random() < 0.5]
    elif roll < 0.5:
        category = rng.choice(CATEGORIES)
        doc["traceEvents"] = [e for e in events if e.get("cat") != category]
    elif roll < 0.7:
        extra = [rng.choice(events) for _ in range(rng.randint(1, 500))] if events else []
        doc["traceEvents"] = events + extra
    elif roll < 0.85:
        doc["traceEvents"] = events[::-1]
    else:
        doc["traceEvents"] = []


def hostile_names(rng, doc):
    events = doc["traceEvents"]
    for i in _some(rng, events, 50):
        events[i] = {**events[i], "name": rng.choice(HOSTILE_NAMES)}


def swap_categories(rng, doc):
    events = doc["traceEvents"]
    for i in _some(rng, events, 100):
        events[i] = {**events[i], "cat": rng.choice(CATEGORIES)}


def many_steps(rng, doc):
    events = doc["traceEvents"]
    if not events:
        return
    count = rng.randint(100, 3000)
    t0 = min((e["ts"] for e in events if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))),
             default=0)
    width = rng.choice((0, 1, 10, 1000))
    for _ in range(count):
        number = rng.randint(0, 10 ** rng.randint(1, 30))
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1,
                       "tid": 1, "ts": t0 + rng.random() * 1e5, "dur": width})


def odd_metadata(rng, doc):
    key = rng.choice(("deviceProperties", "distributedInfo", "schemaVersion", "traceName", "traceEvents"))
    value = rng.choice(ODD_VALUES + ([{"rank": rng.choice(ODD_VALUES)}], {"rank": rng.choice(ODD_VALUES)}))
    if key == "traceEvents" and rng.random() < 0.7:
        doc["traceEvents"] = doc["traceEvents"] + [value]
    else:
        doc[key] = value


def deep_nesting(rng, doc):
    depth = rng.choice((50, 500, 100_000))
    nested: object = 1
    if depth <= 500:  # json.dumps itself recurses
        for _ in range(depth):
            nested = [nested]
        events = doc["traceEvents"]
        for i in _some(rng, events, 1):
            events[i] = {**events[i], "args": {"correlation": nested}}
        return None
    text = json.dumps(doc).encode()
    return text.replace(b'"traceEvents": [', b'"traceEvents": [' + b"[" * depth + b"]" * depth + b",", 1)


def truncate_bytes(rng, doc):
    text = json.dumps(doc).encode()
    return text[: rng.randrange(len(text))]


def corrupt_bytes(rng, doc):
    text = bytearray(json.dumps(doc).encode())
    for _ in range(rng.randint(1, 20)):
        text[rng.randrange(len(text))] = rng.randrange(256)
    return bytes(text)


def invalid_utf8(rng, doc):
    text = json.dumps(doc).encode()
    spots = [i for i in range(len(text)) if text[i:i + 1] == b'"'][: 10_000]
    spot = rng.choice(spots) + 1 if spots else 0
    return text[:spot] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80")) + text[spot:]


def odd_number_text(rng, doc):
    text = json.dumps(doc).encode()
    replacement = rng.choice((b"1e400", b"-1e400", b"1" + b"0" * 400, b"NaN", b"Infinity", b"-0", b"1e-400"))
    key = rng.choice((b'"ts": ', b'"dur": ', b'"correlation": ', b'"pid": '))
    at = text.find(key, rng.randrange(len(text)))
    if at < 0:
        at = text.find(key)
    if at < 0:
        return text
    start = at + len(key)
    end = start
    while end < len(text) and text[end:end + 1] in b"0123456789.-e+":
        end += 1
    return text[:start] + replacement + text[end:]


def gzip_damage(rng, doc):
    packed = gzip.compress(json.dumps(doc).encode(), compresslevel=1)
    roll = rng.random()
    if roll < 0.4:
        return packed[: rng.randrange(2, len(packed))]
    if roll < 0.7:
        damaged = bytearray(packed)
        damaged[rng.randrange(10, len(damaged))] ^= 1 << rng.randrange(8)
        return bytes(damaged)
    return packed + rng.choice((b"\0" * 8, b"garbage", packed))


DOCUMENT_MUTATIONS = (
    drop_field, retype_field, enlarge_numbers, drop_or_duplicate_events, hostile_names, swap_categories,
    many_steps, odd_metadata, deep_nesting, truncate_bytes, corrupt_bytes, invalid_utf8, odd_number_text,
    gzip_damage,
)


# -- fields per event class --------------------------------------------------------------------------
# Each class's own fields, with values that a real trace of that class could almost have. An event's
# class is read from its phase, category and name (`event_class`).

BIG_INTS = (2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30)
ODD_INTS = (0, -1, 1, 7, *BIG_INTS)
ODD_FLOATS = (0.0, -0.0, -1.5, 1e-9, 1e15, 2.0**53 + 1, 1.7e308, -1.7e308, 5e-324)
TYPED_SHARE = 0.7
"""The share of field mutants whose odd values all have the type the loader reads the field as
(they reach the analyses); the others take any odd value (the loader must refuse it in one line)."""


def _odd(rng, typed: bool, *pools: tuple) -> object:
    """An odd value: from the `pools` (values of the field's type) when `typed`, else any."""
    pool = tuple(value for values in pools for value in values)
    return rng.choice(pool) if pool and typed else rng.choice(ODD_VALUES + BIG_INTS)
RUNTIME_CALLS = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "hipGraphLaunch",
    "hipLaunchKernel", "hipExtModuleLaunchKernel", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync",
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent",
    "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaEventQuery", "cudaStreamIsCapturing", "cuModuleLoadData",
    "ncclKernel", "",
)


def event_class(event: dict) -> str:
    if not isinstance(event, dict):
        return "other"
    phase, category, name = event.get("ph"), event.get("cat"), str(event.get("name", ""))
    category = category if isinstance(category, str) else None
    if phase == "M":
        return "metadata"
    if phase in ("s", "t", "f"):
        return "flow"
    if phase == "i":
        return "memory" if name == "[memory]" else "instant"
    if category in ("user_annotation", "Operator") and name.startswith("ProfilerStep#"):
        return "step"
    return {
        "python_function": "python", "cpu_op": "op", "Operator": "op", "cuda_runtime": "runtime",
        "cuda_driver": "runtime", "Runtime": "runtime", "kernel": "kernel", "Kernel": "kernel",
        "gpu_memcpy": "copy", "gpu_memset": "copy", "Memcpy": "copy", "cuda_sync": "sync",
        "user_annotation": "annotation", "gpu_user_annotation": "annotation",
    }.get(category, "other")


def _number(event: dict, key: str) -> float:
    """The event's number at `key`, 0 when it has none (another mutation may have retyped it)."""
    value = event.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _args(event: dict) -> dict:
    args = event.get("args")
    if not isinstance(args, dict):
        args = event["args"] = {}
    return args


def _step_field(rng, event, events, typed):
    roll = rng.random()
    if roll < 0.35:
        event["name"] = rng.choice(("ProfilerStep#0", "ProfilerStep#-3", "ProfilerStep#" + "7" * 19,
                                    "ProfilerStep#" + str(rng.choice(BIG_INTS)), "ProfilerStep#1.5",
                                    "ProfilerStep#٣", "ProfilerStep# 4", "ProfilerStep#4\n"))
    elif roll < 0.6:
        event["dur"] = rng.choice((0, -5, 1e-9, 1e15, 2.0**53 + 1, _number(event, "dur") * 1000))
    elif roll < 0.8:  # the step moved over another one, or nested inside itself
        span = _number(event, "dur") or 1000
        event["ts"] = _number(event, "ts") + rng.choice((-1, 1)) * rng.random() * span
        events.append({**event, "dur": span / 2})
    else:
        events.append(dict(event))  # the same step twice


def _python_field(rng, event, events, typed):
    name = str(event.get("name", "f.py(1): f"))
    file, _, rest = name.partition("(")
    function = rest.partition("): ")[2] or "f"
    line = rng.choice(("0", "-1", "9" * 19, "9" * 4301, "1e3", "", "٣", str(rng.choice(BIG_INTS))))
    event["name"] = rng.choice((
        f"{file}({line}): {function}", f"{file}(3): ", f"({line}): {function}", f"a(1).py(2): {function}",
        f"{file}(3) {function}", "<built-in method item of Tensor object>", "nn.Module: " + function,
        f"/abs/{file}(4): {function}", f"{file}(5): <lambda>", f"{file}(6): " + "[/x]" * 3,
    ))
    if rng.random() < 0.3:
        _args(event)["Python id"] = _odd(rng, typed, ODD_INTS)
        _args(event)["Python parent id"] = _odd(rng, typed, ODD_INTS)


def _op_field(rng, event, events, typed):
    args = _args(event)
    key = rng.choice(("Sequence number", "Fwd thread id", "Input Dims", "External id", "Record function id"))
    args[key] = _odd(rng, typed, ODD_INTS, (2, 12345))
    if rng.random() < 0.3:
        event["name"] = rng.choice(("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::copy_",
                                    "autograd::engine::evaluate_function: MmBackward0", "aten::to"))


def _runtime_field(rng, event, events, typed):
    if rng.random() < 0.5:
        event["name"] = rng.choice(RUNTIME_CALLS)
    args = _args(event)
    others = [e.get("args", {}).get("correlation") for e in events if isinstance(e, dict)
              and isinstance(e.get("args"), dict)]
    args["correlation"] = _odd(rng, typed, ODD_INTS, tuple(o for o in others[:50] if type(o) is int))


def _kernel_field(rng, event, events, typed):
    args = _args(event)
    key = rng.choice(("correlation", "stream", "device", "grid", "block", "External id", "queued"))
    args[key] = _odd(rng, typed, ODD_INTS, ([1, 1, 1],) if key != "correlation" else ())
    roll = rng.random()
    if roll < 0.3:  # before its own launch, or long after the trace
        event["ts"] = _number(event, "ts") + rng.choice((-1e6, -1, 1e9))
    elif roll < 0.5:
        event["dur"] = rng.choice((0, -1, 1e-3, 1e12))
    elif roll < 0.6:
        event["pid"], event["tid"] = rng.choice(((0, 7), ("0", "stream 7"), (-1, -1), (2**63, 1)))


def _copy_field(rng, event, events, typed):
    args = _args(event)
    args["bytes"] = _odd(rng, typed, ODD_FLOATS, ODD_INTS)
    if rng.random() < 0.3:
        event["name"] = rng.choice(("Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pinned -> Device)",
                                    "Memset (Device)", "Memcpy PtoP (Device -> Device)"))


def _memory_field(rng, event, events, typed):
    args = _args(event)
    key = rng.choice(("Device Type", "Total Allocated", "Total Reserved", "Bytes", "Addr", "Device Id"))
    pools = (ODD_INTS,) if key == "Device Type" else (ODD_FLOATS, ODD_INTS, (None,))
    args[key] = _odd(rng, typed, *pools)
    if rng.random() < 0.3:
        event["ts"] = rng.choice((-1.0, 0.0, 1e18, _number(event, "ts")))


def _flow_field(rng, event, events, typed):
    key = rng.choice(("id", "bp", "ph", "ts"))
    pools = {"ts": (ODD_FLOATS,), "ph": (("s", "f", "t", "e", "X", "i"),)}.get(key, (ODD_INTS, ("",)))
    event[key] = _odd(rng, typed, *pools)


def _metadata_field(rng, event, events, typed):
    args = _args(event)
    args[rng.choice(("name", "labels", "sort_index"))] = rng.choice(ODD_VALUES + HOSTILE_NAMES)


def _generic_field(rng, event, events, typed):
    key = rng.choice(("ts", "dur", "pid", "tid", "name", "cat", "ph"))
    pools = {"ts": (ODD_FLOATS,), "dur": (ODD_FLOATS,), "pid": (ODD_INTS, ("0", "")),
             "tid": (ODD_INTS, ("x",)), "name": (HOSTILE_NAMES,), "cat": (CATEGORIES,),
             "ph": (tuple("XiBEMsf"),)}[key]
    event[key] = _odd(rng, typed, *pools)


FIELD_MUTATIONS = {
    "step": _step_field, "python": _python_field, "op": _op_field, "runtime": _runtime_field,
    "kernel": _kernel_field, "copy": _copy_field, "memory": _memory_field, "flow": _flow_field,
    "metadata": _metadata_field, "sync": _runtime_field, "annotation": _step_field,
    "instant": _generic_field, "other": _generic_field,
}


def class_fields(rng, doc, kind: str | None = None):
    """Mutate the fields of one event class: `kind`, else one of the classes the document has."""
    events = doc["traceEvents"]
    by_class: dict[str, list[int]] = {}
    for i, event in enumerate(events):
        if isinstance(event, dict):
            by_class.setdefault(event_class(event), []).append(i)
    if kind not in by_class:
        if not by_class:
            return
        kind = rng.choice(sorted(by_class))
    typed = rng.random() < TYPED_SHARE
    for i in rng.sample(by_class[kind], min(len(by_class[kind]), rng.randint(1, 30))):
        event = events[i] = copy.deepcopy(events[i])
        FIELD_MUTATIONS[kind](rng, event, events, typed)


MUTATIONS = DOCUMENT_MUTATIONS + (class_fields, class_fields, class_fields)


# -- compression -------------------------------------------------------------------------------------
# Each takes (rng, text) and returns the file's bytes and whether its name ends in .gz.


def _gzip_header(flags: int, extra: bytes = b"", name: bytes = b"", comment: bytes = b"") -> bytes:
    header = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff"
    if flags & 4:
        header += len(extra).to_bytes(2, "little") + extra
    if flags & 8:
        header += name + b"\0"
    if flags & 16:
        header += comment + b"\0"
    return header


def _deflate(text: bytes, level: int = 1) -> bytes:
    packer = zlib.compressobj(level, zlib.DEFLATED, -15)
    return packer.compress(text) + packer.flush()


def _member(text: bytes, crc: int | None = None, size: int | None = None,
            header: bytes | None = None) -> bytes:
    crc = zlib.crc32(text) if crc is None else crc
    size = len(text) if size is None else size
    return ((header or _gzip_header(0)) + _deflate(text) + (crc & 0xFFFFFFFF).to_bytes(4, "little")
            + (size & 0xFFFFFFFF).to_bytes(4, "little"))


def plain(rng, text):
    return text, rng.random() < 0.1  # sometimes named .gz while plain


def gzip_plain(rng, text):
    return gzip.compress(text, compresslevel=rng.choice((1, 6, 9))), rng.random() < 0.9


def gzip_header_fields(rng, text):
    flags = rng.choice((4, 8, 16, 28, 2 | 8))  # FEXTRA, FNAME, FCOMMENT; FHCRC (2) without its CRC
    header = _gzip_header(flags, extra=b"ab" * rng.randint(0, 40),
                          name=rng.choice((b"t.json", b"\xff\xfe", b"")), comment=b"x" * rng.randint(0, 2000))
    return _member(text, header=header), True


def gzip_members(rng, text):
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 4))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    packed = b"".join(_member(piece) for piece in pieces)
    if rng.random() < 0.3:
        packed = _member(b"") + packed  # an empty member first
    return packed, True


def gzip_tail(rng, text):
    packed = gzip.compress(text, compresslevel=1)
    tail = rng.choice((b"\0" * rng.randint(1, 5000), b"garbage", b"\x1f\x8b", b"\x1f\x8b\x08\0", packed[:50]))
    return packed + tail, True


def gzip_lying_trailer(rng, text):
    roll = rng.random()
    if roll < 0.4:
        return _member(text, size=rng.choice((0, 1, len(text) - 1, len(text) + 1, 2**32 - 1, 100))), True
    if roll < 0.7:
        return _member(text, crc=zlib.crc32(text) ^ (1 << rng.randrange(32))), True
    return _member(text, size=len(text) + 2**32 * rng.randint(0, 1)), True  # the same modulo 2**32


def gzip_twice(rng, text):
    return gzip.compress(gzip.compress(text, compresslevel=1), compresslevel=1), rng.random() < 0.7


def other_formats(rng, text):
    packed = rng.choice((
        lambda: zlib.compress(text, 1),  # zlib, not gzip
        lambda: _deflate(text),  # raw deflate
        lambda: bz2.compress(text, 1),
        lambda: lzma.compress(text, preset=0),
        lambda: b"\x28\xb5\x2f\xfd" + text[:100],  # a zstd magic
        lambda: b"\x1f\x8b" + text,  # the gzip magic and no more of gzip
        lambda: b"\xef\xbb\xbf" + text,  # a UTF-8 byte order mark
        lambda: text.decode("utf-8", "replace").encode("utf-16"),
    ))()
    return packed, rng.random() < 0.5


COMPRESSIONS = (
    plain, plain, plain, gzip_plain, gzip_header_fields, gzip_members, gzip_tail, gzip_lying_trailer,
    gzip_twice, other_formats,
)


# -- the sync sites file -------------------------------------------------------------------------------


def _sites_from(doc: dict, rng) -> list[dict]:
    """Sites that join the trace: its step numbers, its python frames' files, lines and functions."""
    events = doc.get("traceEvents") if isinstance(doc.get("traceEvents"), list) else []
    steps = [int(m.group(1)) for e in events if isinstance(e, dict)
             and (m := re.fullmatch(r"ProfilerStep#(\d{1,9})", str(e.get("name", ""))))] or [1]
    frames = [m.groups() for e in events if isinstance(e, dict) and e.get("cat") == "python_function"
              and (m := re.fullmatch(r"(.*)\((\d{1,9})\): (.*)", str(e.get("name", ""))))][:200]
    frames = [{"file": f, "line": int(n), "function": fn} for f, n, fn in frames] or [
        {"file": "train.py", "line": 3, "function": "train"}]
    sites = []
    for _ in range(rng.randint(1, 40)):
        stack = rng.sample(frames, min(len(frames), rng.randint(0, 12)))
        user = stack[-1] if stack else frames[0]
        call = rng.choice(("implicit", "torch.cuda.synchronize", "Event.synchronize", "Stream.synchronize"))
        sites.append({"step": rng.choice(steps), "call": call, **user, "stack": stack})
    return sites


def sidecar_document(rng, doc):
    layout = {"roots": ["/venv/lib/python3.11/site-packages/"], "library_packages": ["torch"],
              "user_packages": ["train"], "versions": {"torch": "2.13.0"}}
    document = {"version": rng.choice((1, 2)), "worker": "w", "code_layout": layout,
                "sites": _sites_from(doc, rng)}
    roll = rng.random()
    if roll < 0.25:  # a site's fields retyped
        for site in rng.sample(document["sites"], min(len(document["sites"]), 5)):
            key = rng.choice(("step", "call", "file", "line", "function", "stack"))
            site[key] = rng.choice(ODD_VALUES + BIG_INTS)
    elif roll < 0.4:  # stack frames retyped
        for site in document["sites"]:
            if site["stack"]:
                site["stack"][0] = rng.choice((*ODD_VALUES, {"file": 1, "line": "x", "function": None}))
    elif roll < 0.55:  # the layout retyped
        key = rng.choice(("roots", "library_packages", "user_packages", "versions"))
        layout[key] = rng.choice(ODD_VALUES)
        if rng.random() < 0.3:
            document["code_layout"] = rng.choice(ODD_VALUES)
    elif roll < 0.65:
        document["sites"] = rng.choice(ODD_VALUES + ([1, 2], [{"step": 1}] * 5000))
    elif roll < 0.75:
        document = rng.choice(ODD_VALUES + ([document],))
    return json.dumps(document).encode()


def sidecar_bytes(rng, doc):
    text = json.dumps({"version": 2, "sites": _sites_from(doc, rng)}).encode()
    return rng.choice((
        lambda: text[: rng.randrange(len(text))],  # cut
        lambda: text.replace(b'"file": "', b'"file": "\xff', 1),  # invalid UTF-8
        lambda: b"",  # empty
        lambda: gzip.compress(text),  # gzipped
        lambda: b'{"sites": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested too deeply
        lambda: b'{"sites": [' + b",".join([b"{}"] * 200_000) + b"]}",  # many tiny sites
    ))()


SIDECARS = (sidecar_document, sidecar_document, sidecar_bytes)


def write_sidecar(rng, doc, folder: Path, worker: str, maker=None) -> str:
    """Write the trace's sync sites file with `maker` (one of `SIDECARS`, or "not a file"), else a
    random one; returns what was done."""
    path = folder / f"{worker}.syncsites.json"
    maker = maker or rng.choice((*SIDECARS, "not a file"))
    if maker == "not a file":
        rng.choice((path.mkdir, lambda: path.symlink_to("/dev/zero"), lambda: path.symlink_to("/nonexistent"),
                    lambda: path.symlink_to(path.name)))()  # a folder, a device, dangling, a loop
        return "sidecar not a file"
    path.write_bytes(maker(rng, doc))
    return maker.__name__


# -- the folder ----------------------------------------------------------------------------------------

HOSTILE_FILE_NAMES = (
    "w\nx", "w\x1b[2Jx", "w\x1b]0;t\x07", "gemm[x]", "[bold]w", "[link=javascript:x]w", "w\u202ex",
    "w\u2028x", "w\x85x", "rank99999999999", "rank_3", "-w", "w" * 200, "名前", "w.1.2.3",
)


def odd_folder(rng, folder: Path, text: bytes, packed: bytes, gz: bool, seed: int,
               choice: int | None = None) -> tuple[Path, str]:
    """Lay the mutant out in an odd folder (`FOLDERS[choice]`, else a random one); returns the path to
    analyse and what was done."""
    suffix = ".pt.trace.json.gz" if gz else ".pt.trace.json"
    name = f"w{seed}.1795302433816535958{suffix}"
    what = FOLDERS[rng.randrange(len(FOLDERS)) if choice is None else choice]
    if what == "two traces":  # windows of one worker, or two ranks
        (folder / name).write_bytes(packed)
        second = rng.choice((f"w{seed}.1795302433816535959", f"rank1_w{seed}.1795302433816535960"))
        (folder / f"{second}.pt.trace.json").write_bytes(text)
    elif what == "runs":  # a log folder of runs: the newest is analysed
        for run in ("run-a", "run-b"):
            (folder / run).mkdir()
            (folder / run / name).write_bytes(packed)
    elif what == "plain json names":  # no profiler file names: every other JSON is tried
        (folder / "trace.json").write_bytes(text)
        (folder / rng.choice(("truth.json", "notes.json"))).write_bytes(rng.choice((b'{"a": 1}', b"{", b"")))
    elif what == "odd entry":  # things that are not trace files, named as trace files
        (folder / name).write_bytes(packed)
        odd = folder / f"x{seed}.1795302433816535959.pt.trace.json"
        rng.choice((odd.mkdir, lambda: odd.symlink_to("/nonexistent"), lambda: odd.symlink_to(odd.name),
                    lambda: odd.write_bytes(b"")))()
    elif what == "hostile file name":
        hostile = folder / (rng.choice(HOSTILE_FILE_NAMES) + f".1795302433816535958{suffix}")
        hostile.write_bytes(packed)
        return (folder if rng.random() < 0.5 else hostile), what
    else:  # the same trace twice, through a link
        (folder / name).write_bytes(packed)
        (folder / "link.1795302433816535959.pt.trace.json").symlink_to(name)
    return folder, what


FOLDERS = ("two traces", "runs", "plain json names", "odd entry", "hostile file name", "linked twice")


# -- one mutant ----------------------------------------------------------------------------------------

CLASSES = (
    *(("document", m) for m in DOCUMENT_MUTATIONS),
    *(("fields", kind) for kind in FIELD_MUTATIONS),
    *(("compression", c) for c in dict.fromkeys(COMPRESSIONS)),
    *(("sidecar", s) for s in dict.fromkeys(SIDECARS)),
    ("sidecar", "not a file"),
    *(("folder", index) for index in range(len(FOLDERS))),
)
"""Each seed's main mutation class, in turn (`CLASSES[seed % len(CLASSES)]`): any run of this many
consecutive seeds draws every class. The rest of a mutant is drawn at random."""


def _base_with(bases: tuple[dict, ...], first: int, kind: str | None) -> dict:
    """The first base from index `first` on (cyclically) that has an event of class `kind`."""
    for i in range(len(bases)):
        base = bases[(first + i) % len(bases)]
        if kind is None or any(event_class(e) == kind for e in base["traceEvents"]):
            return base
    return bases[first]


def make_mutant(seed: int, folder: Path, fixtures: Path) -> tuple[Path, str]:
    """Write mutant `seed` of the traces under `fixtures` into `folder`; returns its path (file or
    folder) and a description. `folder/base/` holds the unmutated base, for `trainprof diff`."""
    rng = random.Random(seed)
    phase, forced = CLASSES[seed % len(CLASSES)]
    bases = base_documents(fixtures)
    base = _base_with(bases, rng.randrange(len(bases)), forced if phase == "fields" else None)
    doc = {**base, "traceEvents": list(base["traceEvents"])}
    del doc["_name"]
    (folder / "base").mkdir()
    (folder / "base" / "base.1795302433816535950.pt.trace.json").write_text(json.dumps(doc))
    folder = folder / "m"
    folder.mkdir()
    applied = []
    text = None
    if phase == "document":
        text = forced(rng, doc)
        applied.append(forced.__name__)
    elif phase == "fields":
        class_fields(rng, doc, forced)
        applied.append(f"fields of {forced}")
    for _ in range(rng.choice((0, 0, 1, 2)) if text is None else 0):
        if not isinstance(doc["traceEvents"], list):  # odd_metadata replaced the events: nothing to mutate
            break
        mutation = rng.choice(MUTATIONS)
        applied.append(mutation.__name__)
        text = mutation(rng, doc)
        if text is not None:
            break
    if text is None:
        text = json.dumps(doc).encode()
    if text[:2] == b"\x1f\x8b":  # already compressed (and damaged) by a document mutation
        packed, gz = text, True
    else:
        compression = forced if phase == "compression" else rng.choice(COMPRESSIONS)
        packed, gz = compression(rng, text)
        applied.append(compression.__name__)
    roll = rng.random()
    if phase == "folder" or (phase != "sidecar" and roll < 0.2):
        target, what = odd_folder(rng, folder, text, packed, gz, seed, forced if phase == "folder" else None)
        applied.append(what)
    else:
        target = folder / f"w{seed}.1795302433816535958.pt.trace.json{'.gz' if gz else ''}"
        target.write_bytes(packed)
        if phase == "sidecar" or roll < 0.4:
            maker = forced if phase == "sidecar" else None
            applied.append(write_sidecar(rng, doc, folder, f"w{seed}", maker))
            target = folder if rng.random() < 0.7 else target
    return target, f"seed {seed}: {base['_name']} + {', '.join(applied)}"


# -- running it ----------------------------------------------------------------------------------------

DIFF_EVERY = 5
"""One mutant in this many also goes through `trainprof diff` against its base (it analyses both)."""
SCALARS_EVERY = 8
"""One analysed mutant in this many also writes TensorBoard scalars (a SummaryWriter costs ~20 ms)."""
UNSAFE_CHARACTERS = "\u2028\u2029\u202e\u061c\x85\x9b"
"""Characters no output may hold raw (line and paragraph separators, a bidi override, the Arabic letter
mark, C1's NEL and CSI): the renderers escape them (`trainprof.report.text.safe_text`, JSON's `\\uXXXX`)."""


class Outcome(Exception):
    """A mutant's run ended in neither a result nor one clean line."""


def _quiet(call, *args):
    """`call(*args)` with stdout/stderr captured and warnings recorded: (result, out, err, warnings)."""
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        result = call(*args)
    return result, out.getvalue(), err.getvalue(), [str(w.message) for w in caught]


def run_in_process(path: Path) -> tuple[int, str, str, list[str], float, object]:
    """`trainprof analyze PATH --json --debug` in this process: code, stdout, stderr, warnings, CPU
    seconds, and the `Analysis` it printed (None when it printed none), for the writers.

    CPU time, not wall time: on a shared machine the wall clock measures the neighbours.
    """
    from trainprof.cli import main
    from trainprof.report import json as report_json

    printed = []
    real_write = report_json.write_json_to

    def keeping(value, *args, **kwargs):
        printed.append(value)
        return real_write(value, *args, **kwargs)

    start = time.process_time()
    with mock.patch.object(report_json, "write_json_to", keeping):
        code, out, err, caught = _quiet(main, ["analyze", str(path), "--json", "--debug"])
    return code, out, err, caught, time.process_time() - start, printed[0] if printed else None


def check_outcome(code: int, out: str, err: str, caught: list[str], seconds: float) -> str:
    """'ok' (exit 0, one JSON object), 'rejected' (exit 2, one line); raises AssertionError otherwise."""
    assert seconds < SECONDS_PER_MUTANT, f"took {seconds:.1f} s of CPU"
    assert not caught, f"warnings: {caught[:3]}"
    if code == 0:
        assert err == "" or _one_note(err), err[:500]
        json.loads(out)
        return "ok"
    assert code == 2, code
    lines = err.rstrip("\n").split("\n")  # lines as a terminal ends them (U+2028 is checked apart)
    assert out == "" and lines and lines[-1].startswith("trainprof: error: ") and (
        len(lines) == 1 or (len(lines) == 2 and _one_note(lines[0]))), err[:500]
    return "rejected"


def _one_note(err: str) -> bool:
    """The one line a log folder of runs gets before its analysis: which run is analysed."""
    return err.count("\n") <= 1 and " holds " in err and "analysing the newest" in err


def assert_safe_text(outputs: dict[str, str]) -> None:
    """No output holds one of `UNSAFE_CHARACTERS` raw (`outputs`: where -> its text)."""
    for where, text in outputs.items():
        found = sorted({character for character in text if character in UNSAFE_CHARACTERS})
        assert not found, f"{where} holds {found} raw"


def run_writers(analysis, scratch: Path, scalars: bool) -> dict[str, str]:
    """Every writer on `analysis`: the console (rich and plain), Markdown, JSON, the run files; returns
    what each wrote (where -> text)."""
    from trainprof.report import write_reports
    from trainprof.report.console import print_report, render_text
    from trainprof.report.markdown import render_markdown

    console = io.StringIO()
    print_report(analysis, file=console, width=100)
    outputs = {"console": console.getvalue(), "plain text": render_text(analysis),
               "markdown": render_markdown(analysis)}
    written = write_reports(analysis, scratch, tensorboard_scalars=scalars, console=False)
    return outputs | {path.name: path.read_text(encoding="utf-8") for path in written.values()}


def run_diff(base: Path, path: Path, scratch: Path) -> str:
    """`trainprof diff BASE PATH --json`, then with `--markdown` (console + Markdown): 'ok' or
    'rejected'; raises AssertionError otherwise."""
    from trainprof.cli import main

    outcomes = set()
    markdown = scratch / "diff.md"
    for flags in (["--json"], ["--markdown", str(markdown)]):
        code, out, err, caught = _quiet(main, ["diff", str(base), str(path), *flags])
        assert not caught, f"diff warnings: {caught[:3]}"
        if code == 0:
            if flags == ["--json"]:
                json.loads(out)
            outputs = {f"diff {' '.join(flags)}": out}
            if markdown.is_file():
                outputs["diff.md"] = markdown.read_text(encoding="utf-8")
            assert_safe_text(outputs)
            outcomes.add("ok")
        else:
            lines = err.rstrip("\n").split("\n")
            assert code == 2 and len(lines) == 1 and lines[0].startswith("trainprof: error: "), err[:500]
            outcomes.add("rejected")
    return "rejected" if "rejected" in outcomes else "ok"


def run_mutant(seed: int, folder: Path, fixtures: Path) -> dict:
    """Make mutant `seed` and run everything on it: {"analyze", "writers", "diff", "seconds"}; raises
    `Outcome` (with the mutant's description) on a failure."""
    path, description = make_mutant(seed, folder, fixtures)
    record = {"seed": seed, "description": description}
    try:
        *result, analysis = run_in_process(path)
        record["seconds"] = result[-1]
        record["analyze"] = check_outcome(*result)
        assert (analysis is not None) == (record["analyze"] == "ok"), "the printed Analysis was not caught"
        if analysis is not None:
            start = time.process_time()
            (folder / "out").mkdir()
            outputs, *_ = _quiet(run_writers, analysis, folder / "out", seed % SCALARS_EVERY == 0)
            assert_safe_text({"analyze --json": result[1], **outputs})
            record["writers"] = "ok"
            record["seconds"] += time.process_time() - start
        if seed % DIFF_EVERY == 0:
            start = time.process_time()
            record["diff"] = run_diff(folder / "base", path, folder)
            record["seconds"] += time.process_time() - start
    except BaseException as error:
        raise Outcome(f"{description}: {type(error).__name__}: {str(error)[:500]}") from error
    return record


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_MUTANTS))
def test_mutant(seed, tmp_path, fixtures_dir):
    run_mutant(seed, tmp_path, fixtures_dir)


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_SUBPROCESS))
def test_mutant_in_a_subprocess_with_bounded_memory(seed, tmp_path, fixtures_dir):
    path, description = make_mutant(seed * 7919 + 1, tmp_path, fixtures_dir)  # other seeds than in-process
    run = ("import runpy, sys; sys.argv = ['trainprof'] + sys.argv[1:]; "
           "runpy.run_module('trainprof', run_name='__main__')")
    if sys.platform != "win32":  # Windows has no RLIMIT_AS: the time bound still holds there
        run = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30)); " + run
    start = resource.getrusage(resource.RUSAGE_CHILDREN) if resource else None
    result = subprocess.run([sys.executable, "-c", run, "analyze", str(path), "--json"],
                            capture_output=True, text=True, timeout=120)
    try:
        end = resource.getrusage(resource.RUSAGE_CHILDREN) if resource else None
        cpu = (end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime) if start and end else 0.0
        check_outcome(result.returncode, result.stdout, result.stderr, [], max(cpu - 1.0, 0.0))  # 1 s: import
    except AssertionError as error:
        raise AssertionError(f"{description}: {error}") from error
