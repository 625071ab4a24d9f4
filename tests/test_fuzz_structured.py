"""An independent fuzzer for `trainprof analyze` (issue #33), built the other way round from
tests/test_fuzz.py: that one mutates the checked-in fixtures field by field; this one generates
traces from a small model of training steps and mutates them as structure.

The model (`generate`): steps (`ProfilerStep#`) on a loop thread, and maybe a second thread,
holding nested Python frames and ops; each op launches kernels (correlation ids, `ac2g` flows from
launch to kernel) on one or two streams; copies and syncs; `[memory]` instants; a collective with
its `record_param_comms` record; Kineto's metadata. Mutations (`MUTATIONS`, one to three per
mutant, the first by the seed) work on that structure: types swapped, events reordered, nesting
broken, time running backwards, ids duplicated, flows left dangling, very many tiny events, NaN and
Infinity literals, odd phases and top-level shapes, deep nesting; then the writer (`write`) picks a
layout, an encoding (UTF-8 with or without a BOM, UTF-16) and a container (plain, gzip, gzip in
several concatenated members).

Every mutant must end in a result (exit 0: one JSON object on stdout, nothing on stderr) or one
line (exit 2: `trainprof: error: ...`), run in process under `--debug` so that an internal error
raises here with its seed; within `SECONDS_PER_MUTANT` of CPU time; and, on Linux, with its peak
RSS above the RSS before it (VmHWM, reset through /proc/self/clear_refs) within the stated bound,
3x the counted size of what is read (`budget.counted`), or `MEMORY_FLOOR` for small inputs. Memory
the process freed before and reuses is not seen as growth: the check can only under-count.

CI: `N_MUTANTS` (300) mutants, seeds from `FIRST_SEED`; `TRAINPROF_FUZZ2_N` and `TRAINPROF_FUZZ2_SEED`
change them (`TRAINPROF_FUZZ2_N=10000` is the local batch).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import random
import time
from pathlib import Path

import pytest

from trainprof.cli import main
from trainprof.trace import budget

N_MUTANTS = int(os.environ.get("TRAINPROF_FUZZ2_N", "300"))
FIRST_SEED = int(os.environ.get("TRAINPROF_FUZZ2_SEED", "1000000"))
SECONDS_PER_MUTANT = 20.0
MEMORY_FLOOR = 24 * 2**20
"""Below this, peak growth is the allocator's noise (arenas, numpy's caches), not the input's cost."""
TINY_EVENTS = (2_000, int(os.environ.get("TRAINPROF_FUZZ2_TINY", "40000")))
"""How many tiny events `many_tiny` adds (a uniform draw between; the local batch takes more)."""
GPU_PID, LOOP_TID = 0, 1001
KERNELS = ("ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4>(float*)",
           "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
           "triton_poi_fused_add_0", "Memcpy DtoH (Device -> Pageable)")
OPS = ("aten::linear", "aten::addmm", "aten::gelu", "aten::add_", "aten::copy_", "aten::item", "aten::mm")


# -- the model ----------------------------------------------------------------------------------------


def generate(rng: random.Random) -> dict:
    """A trace document of a few training steps (module docstring), as Kineto lays it out."""
    events: list[dict] = []
    correlation = iter(range(rng.randrange(1, 10**6), 10**9))
    threads = [LOOP_TID] + ([LOOP_TID + 1] if rng.random() < 0.3 else [])
    streams = [7] + ([13] if rng.random() < 0.4 else [])
    at = rng.uniform(0, 1e9)
    gpu_at = at
    for step in range(rng.randint(1, 6)):
        step_start, ops = at, rng.randint(1, 12)
        at += 5
        loop = _span("python_function", f"train.py({10 + step}): train", at, 0, LOOP_TID)
        events.append(loop)
        for index in range(ops):
            op = _span("cpu_op", rng.choice(OPS), at, rng.uniform(3, 60), rng.choice(threads),
                       {"Sequence number": rng.randrange(10**4), "Fwd thread id": 0,
                        "Input Dims": [[rng.randrange(1, 512), 64]], "Input type": ["float"]})
            module = _span("python_function", f"nn.Module: Linear_{index}", at - 1, op["dur"] + 2, op["tid"])
            events += [module, op]
            launch_at = at + 1
            for _ in range(rng.randint(0, 3)):
                ident = next(correlation)
                launch = _span("cuda_runtime", "cudaLaunchKernel", launch_at, 2.5, op["tid"],
                               {"correlation": ident, "cbid": 211})
                gpu_at = max(gpu_at, launch_at + rng.uniform(1, 30))
                kernel = _span("kernel", rng.choice(KERNELS), gpu_at, rng.uniform(1, 200),
                               rng.choice(streams), {"correlation": ident, "device": 0, "stream": 7},
                               pid=GPU_PID)
                gpu_at = kernel["ts"] + kernel["dur"]
                events += [launch, kernel, _flow("s", ident, launch), _flow("f", ident, kernel)]
                launch_at += 3
            if rng.random() < 0.3:
                events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                               "pid": 1, "tid": op["tid"], "ts": at + 2,
                               "args": {"Device Type": 1, "Device Id": 0, "Addr": rng.randrange(2**40),
                                        "Bytes": rng.randrange(-2**20, 2**20),
                                        "Total Allocated": rng.randrange(2**30), "Total Reserved": 2**31}})
            if rng.random() < 0.15:
                events.append(_span("cuda_runtime", "cudaStreamSynchronize", at + op["dur"] - 2, 1.5,
                                    op["tid"], {"correlation": next(correlation)}))
            if rng.random() < 0.1:
                events.append(_span("cpu_op", "record_param_comms", at, 4, op["tid"],
                                    {"Collective name": "allreduce", "In msg nelems": 4096,
                                     "Out msg nelems": 4096, "dtype": "Float", "Group size": 2}))
            at += op["dur"] + rng.uniform(0, 20)
        loop["dur"] = at - loop["ts"]
        at += 5
        events.append(_span("user_annotation", f"ProfilerStep#{step}", step_start, at - step_start, LOOP_TID))
        events.append(_span("gpu_user_annotation", f"ProfilerStep#{step}", step_start + 5, at - step_start,
                            7, pid=GPU_PID))
        at += rng.uniform(0, 50)
    document = {"schemaVersion": 1, "traceEvents": events,
                "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150 * 2**30}]}
    if rng.random() < 0.3:
        document["distributedInfo"] = {"backend": "nccl", "rank": rng.randrange(4), "world_size": 4}
    return document


def _span(cat: str, name: str, ts: float, dur: float, tid: int, args: dict | None = None,
          pid: int = 1) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3),
             "dur": round(dur, 3)}
    if args is not None:
        event["args"] = args
    return event


def _flow(phase: str, ident: int, at: dict) -> dict:
    flow = {"ph": phase, "id": ident, "pid": at["pid"], "tid": at["tid"], "ts": at["ts"], "cat": "ac2g",
            "name": "ac2g"}
    if phase == "f":
        flow["bp"] = "e"
    return flow


# -- mutations ----------------------------------------------------------------------------------------


def _some(rng: random.Random, events: list, share: float = 0.2) -> list:
    return rng.sample(events, max(1, int(len(events) * rng.uniform(0.01, share)))) if events else []


def _of(events: list, *cats: str) -> list:
    return [event for event in events if isinstance(event, dict) and event.get("cat") in cats]


ODD = (None, True, 0, -1, 2**64, -(2**63) - 1, 1e308, -0.0, "", "12", "ProfilerStep#1", [], {}, [1, [2]],
       {"a": {"b": None}}, "x" * 3000)
"""Values of any type: most of them the wrong one for the field they land in."""
ODD_NUMBERS = (0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 0.5, 1e-300, 1e15, 2.0**60, -7.25)
ODD_STRINGS = ("", " ", "ProfilerStep#", "ProfilerStep#-3", "ProfilerStep#99999999999999999999",
               "cudaLaunchKernel", "nn.Module: ", "a\u0000b", "\ud83d", "名前", "x" * 3000)
WRONG_TYPE_SHARE = 0.3
"""Of `retype`'s changes, those of another type (the trace is then refused in one line, mostly):
the rest keep the field's type, so that the analysis behind the loader meets them."""


def retype(rng, doc):
    """Fields given odd values of their own type (huge, negative, empty, hostile) or of another type
    (a string time, a list name, an object pid, args that is a number)."""
    for event in _some(rng, doc["traceEvents"]) + _some(rng, [a for e in doc["traceEvents"]
                                                            if isinstance(a := e.get("args"), dict) and a]):
        key = rng.choice(list(event))
        value = event[key]
        if rng.random() < WRONG_TYPE_SHARE:
            event[key] = rng.choice(ODD)
        elif isinstance(value, str):
            event[key] = rng.choice(ODD_STRINGS)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            event[key] = rng.choice(ODD_NUMBERS)


def reorder(rng, doc):
    """The same events in another order: shuffled, reversed, by name, GPU first."""
    events = doc["traceEvents"]
    how = rng.randrange(4)
    if how == 0:
        rng.shuffle(events)
    elif how == 1:
        events.reverse()
    elif how == 2:
        events.sort(key=lambda e: str(e.get("name")))
    else:
        events.sort(key=lambda e: e.get("pid") != GPU_PID)


def break_nesting(rng, doc):
    """Children longer than their parents, parents of no length, spans crossing, twins."""
    frames = _of(doc["traceEvents"], "cpu_op", "python_function", "user_annotation", "cuda_runtime")
    for event in _some(rng, frames, 0.5):
        how, dur = rng.randrange(4), event.get("dur")
        if how == 0:
            event["dur"] = dur * rng.uniform(2, 1000) if isinstance(dur, float) else 1e6
        elif how == 1:
            event["dur"] = 0
        elif how == 2 and isinstance(event.get("ts"), float):
            event["ts"] -= rng.uniform(0, 500)
        else:
            doc["traceEvents"].append(dict(event))


def time_backwards(rng, doc):
    """Negative durations, steps in reverse time, kernels before their launches, times near 0 and far."""
    for event in _some(rng, doc["traceEvents"], 0.5):
        if not isinstance(event.get("ts"), float | int) or isinstance(event.get("ts"), bool):
            continue
        how, dur = rng.randrange(4), event.get("dur")
        if how == 0:
            event["dur"] = -abs(dur) if isinstance(dur, float | int) and not isinstance(dur, bool) else -1.0
        elif how == 1:
            event["ts"] = -event["ts"]
        elif how == 2:
            event["ts"] = rng.choice((0, 1e-9, 2.0**53, 2.0**60, 9e15))
        else:
            event["ts"] -= rng.uniform(1, 1e6)


def duplicate_ids(rng, doc):
    """Correlation ids, step numbers and flow ids shared by several events."""
    events = doc["traceEvents"]
    linked = [e for e in events if isinstance(e.get("args"), dict) and "correlation" in e["args"]]
    if linked:
        shared = rng.choice(linked)["args"]["correlation"]
        for event in _some(rng, linked, 0.6):
            event["args"]["correlation"] = shared
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    for event in _some(rng, steps, 1.0):
        event["name"] = "ProfilerStep#0"
    for event in _some(rng, [e for e in events if "id" in e], 0.5):
        event["id"] = 1


def dangling_flows(rng, doc):
    """Flow starts without ends, ends without starts, flows to events that are not there."""
    events = doc["traceEvents"]
    flows = [e for e in events if e.get("ph") in ("s", "f")]
    for flow in _some(rng, flows, 0.7):
        events.remove(flow)
    for _ in range(rng.randint(1, 50)):
        events.append({"ph": rng.choice("sft"), "id": rng.randrange(2**62), "pid": rng.choice((1, GPU_PID)),
                       "tid": rng.randrange(5000), "ts": rng.uniform(-1e6, 1e12), "cat": "ac2g",
                       "name": "ac2g", **({"bp": "e"} if rng.random() < 0.5 else {})})


def many_tiny(rng, doc):
    """Very many tiny events: ops of no length at one instant, or one-µs kernels, or instants."""
    events = doc["traceEvents"]
    count = rng.randint(*TINY_EVENTS)
    start = next((e["ts"] for e in events if isinstance(e.get("ts"), float)), 0.0)
    kind = rng.randrange(3)
    for index in range(count):
        if kind == 0:
            events.append({"ph": "X", "cat": "cpu_op", "name": "t", "pid": 1, "tid": LOOP_TID, "ts": start,
                           "dur": 0})
        elif kind == 1:
            events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": GPU_PID, "tid": 7,
                           "ts": start + index, "dur": 1, "args": {"correlation": index}})
        else:
            events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                           "tid": LOOP_TID, "ts": start + index / 10})


def nan_literals(rng, doc):
    """NaN, Infinity and -Infinity where numbers go (Python's json writes them as bare literals)."""
    for event in _some(rng, doc["traceEvents"]):
        event[rng.choice(("ts", "dur", "pid", "tid"))] = rng.choice((math.nan, math.inf, -math.inf))
    for event in _some(rng, _of(doc["traceEvents"], "cpu_instant_event")):
        event.setdefault("args", {})["Total Allocated"] = math.nan


def odd_phases(rng, doc):
    """Begin/end pairs that do not pair, counters, metadata events, unknown phases."""
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 40)):
        events.append({"ph": rng.choice(("B", "E", "C", "M", "i", "I", "b", "e", "n", "?", "XX", "")),
                       "name": rng.choice(("ProfilerStep#3", "thread_name", "x", "aten::mm")), "pid": 1,
                       "tid": rng.choice((LOOP_TID, "main", -1)), "ts": rng.uniform(0, 1e9),
                       "args": rng.choice(({"name": "loop"}, {"value": 3}, {}, {"name": 7}))})


def odd_top(rng, doc):
    """The top level reshaped: events only, events as an object, metadata of the wrong type."""
    how = rng.randrange(4)
    if how == 0:
        doc["__top__"] = "object"  # written as an object of events (`write`: after the other mutations)
    elif how == 1:
        doc["deviceProperties"] = rng.choice(("H200", [None, 1, "x"], {"id": 0}))
    elif how == 2:
        doc["distributedInfo"] = rng.choice(([], {"rank": "zero", "world_size": -4}, {"rank": 2**40}))
    else:
        doc["__top__"] = "list"  # written as the bare list of events


DEEP = "\x00deep"
"""Where `write` puts the deep nesting of `deep_args` (json.dumps itself recurses)."""


def deep_args(rng, doc):
    """Arguments nested deeply: objects and lists, 50 to 50,000 levels."""
    depth = rng.choice((50, 500, 5000, 50_000))
    doc["__deep__"] = "".join(rng.choice(('{"a":', "[")) for _ in range(depth))
    rng.choice(doc["traceEvents"])["args"] = DEEP


MUTATIONS = (retype, reorder, break_nesting, time_backwards, duplicate_ids, dangling_flows, many_tiny,
             nan_literals, odd_phases, odd_top, deep_args)
AT_THE_DOOR = (nan_literals, deep_args)
"""Mutations the loader refuses at once, mostly: never added to another (it would hide it)."""


# -- the writer ---------------------------------------------------------------------------------------


def write(rng: random.Random, doc: dict, folder: Path) -> tuple[Path, bytes]:
    """The document as a file, in a layout, encoding and container drawn from `rng`; its path and
    the bytes trainprof reads once gunzipped."""
    deep, top_shape = doc.pop("__deep__", ""), doc.pop("__top__", None)
    top: object = doc["traceEvents"] if top_shape == "list" else doc
    if top_shape == "object":
        doc["traceEvents"] = {str(i): event for i, event in enumerate(doc["traceEvents"])}
    text = json.dumps(top, indent=rng.choice((None, 1, 2)), separators=rng.choice(((",", ":"), (", ", ": "))),
                      ensure_ascii=rng.random() < 0.5)
    if deep:
        closing = "".join({"{": "}", "[": "]"}.get(char, "") for char in reversed(deep))
        text = text.replace(json.dumps(DEEP), deep + "1" + closing, 1)
    if rng.random() < 0.1:  # a key twice (JSON allows it; the last one counts for most readers)
        text = '{"traceEvents": [],' + text[1:] if text.startswith("{") else text
    encoding = rng.choices(("utf-8", "utf-8-sig", "utf-16", "utf-16-be"), weights=(91, 3, 3, 3))[0]
    read = text.encode(encoding, "surrogatepass")  # a lone surrogate, unescaped: bytes that are not UTF-8
    container = rng.choices(("plain", "gzip", "members"), weights=(40, 40, 20))[0]
    if container == "plain":
        raw = read
    elif container == "gzip":
        raw = gzip.compress(read, compresslevel=1)
    else:  # gzip's concatenated members, empty ones among them
        cuts = sorted(rng.sample(range(len(read) + 1), min(len(read) + 1, rng.randint(1, 5))))
        pieces = [read[a:b] for a, b in zip([0, *cuts], [*cuts, len(read)], strict=True)]
        raw = b"".join(gzip.compress(piece, compresslevel=1) for piece in pieces)
    path = folder / ("w.1795302433816535958.pt.trace.json" + ("" if container == "plain" else ".gz"))
    path.write_bytes(raw)
    return path, read


def mutant(seed: int, folder: Path) -> tuple[Path, bytes, str]:
    """Mutant `seed`: its file, what trainprof reads of it, and what was done (for a failure's message)."""
    rng = random.Random(seed)
    doc = generate(rng)
    # The first by the seed: any len(MUTATIONS) consecutive seeds try every class.
    first = MUTATIONS[seed % len(MUTATIONS)]
    others = [m for m in MUTATIONS if m is not first and m not in AT_THE_DOOR]
    chosen = [first, *rng.sample(others, rng.randint(0, 2))]
    for mutation in chosen:
        mutation(rng, doc)
    path, read = write(rng, doc, folder)
    return path, read, f"seed {seed}: {', '.join(m.__name__ for m in chosen)} -> {len(read):,} bytes"


# -- outcomes -----------------------------------------------------------------------------------------


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))
    except (OSError, StopIteration):
        return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS (Linux 4.0+)
        return True
    except OSError:
        return False


def analyse(path: Path) -> tuple[int, str, str, float, int | None]:
    """`trainprof analyze PATH --json --debug --quiet` in this process: exit code, stdout, stderr,
    CPU seconds, and peak RSS growth (None where it cannot be read)."""
    out, err = io.StringIO(), io.StringIO()
    measured = _reset_peak()
    before = _status_bytes("VmRSS:")
    start = time.process_time()  # CPU time: a machine shared with other jobs stretches wall time 10x
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["analyze", str(path), "--json", "--debug", "--quiet"])
    seconds = time.process_time() - start
    peak = _status_bytes("VmHWM:")
    growth = peak - before if measured and peak is not None and before is not None else None
    return code, out.getvalue(), err.getvalue(), seconds, growth


def check(code: int, out: str, err: str, seconds: float, growth: int | None, read: bytes) -> None:
    """What every mutant must give (module docstring); AssertionError says what it gave instead."""
    assert "Traceback" not in err, err[-2000:]
    if code == 0:
        document = json.loads(out)
        assert isinstance(document, dict) and {"trace", "steps", "findings"} <= set(document), out[:300]
        assert err == "", err[-1000:]
    else:
        assert code == 2 and out == "", (code, out[:300])
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainprof: error: "), err[-1000:]
    assert seconds < SECONDS_PER_MUTANT, seconds
    if growth is not None:
        bound = max(budget.TRACE_MEMORY_FACTOR * budget.counted(read)[0], MEMORY_FLOOR)
        assert growth <= bound, f"peak grew {growth:,} bytes, bound {bound:,}"


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_MUTANTS))
def test_mutant_gives_a_result_or_one_line(seed, tmp_path):
    path, read, what = mutant(seed, tmp_path)
    try:
        check(*analyse(path), read)
    except Exception as error:  # the seed and the mutations, then what went wrong
        raise AssertionError(f"{what}: {type(error).__name__}: {error}") from error
