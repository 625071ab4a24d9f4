"""A seeded fuzzer for `trainprof analyze`: mutants of real traces must end in exit 0 (one JSON object)
or exit 2 with one line on stderr, in bounded time and memory.

Mutants are made from the checked-in fixtures (tests/fixtures: the H200 traces and the third-party
ones, cut to their first ~1500 events so each mutant analyses in tens of ms): fields dropped,
retyped or enlarged, events dropped or duplicated, names made hostile, metadata retyped, values
nested deeply, and the bytes truncated, corrupted, given invalid UTF-8 or gzipped and cut.

Each mutant runs the CLI's `main` in process with `--debug`, so a bug raises here with its traceback
(the seed in the test id reproduces it); a sample also runs as a subprocess under a memory limit.
CI runs 300 mutants; `TRAINPROF_FUZZ_N=5000` runs more, `TRAINPROF_FUZZ_SEED` moves the seeds.
`python tests/test_fuzz.py N` runs N mutants and prints the outcome counts.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import heapq
import io
import json
import os
import random
import subprocess
import sys
import time
import warnings
from collections import Counter
from functools import cache
from pathlib import Path

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
    return [rng.randrange(len(events)) for _ in range(rng.randint(1, most))] if events else []


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
    t0 = min((e["ts"] for e in events if isinstance(e.get("ts"), (int, float))), default=0)
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
        if events:
            i = rng.randrange(len(events))
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


MUTATIONS = (
    drop_field, retype_field, enlarge_numbers, drop_or_duplicate_events, hostile_names, swap_categories,
    many_steps, odd_metadata, deep_nesting, truncate_bytes, corrupt_bytes, invalid_utf8, odd_number_text,
    gzip_damage,
)


def make_mutant(seed: int, folder: Path, fixtures: Path) -> tuple[Path, str]:
    """Write mutant `seed` of the traces under `fixtures` into `folder`; returns its path (file or
    folder) and a description."""
    rng = random.Random(seed)
    bases = base_documents(fixtures)
    base = rng.choice(bases)
    doc = {**base, "traceEvents": list(base["traceEvents"])}
    del doc["_name"]
    applied = []
    content = None
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        mutation = rng.choice(MUTATIONS)
        applied.append(mutation.__name__)
        content = mutation(rng, doc)
        if content is not None:
            break
    if content is None:
        content = json.dumps(doc).encode()
    target = folder / f"w{seed}.1795302433816535958.pt.trace.json"
    if content[:2] == b"\x1f\x8b":
        target = target.with_name(target.name + ".gz")
    elif rng.random() < 0.2:
        content = gzip.compress(content, compresslevel=1)
        target = target.with_name(target.name + ".gz")
    target.write_bytes(content)
    description = f"seed {seed}: {base['_name']} + {', '.join(applied)}"
    if rng.random() < 0.15:  # sync sites beside it, some wrong-typed
        site = {"step": rng.choice(ODD_VALUES + (1, 2)), "call": rng.choice(ODD_VALUES + ("implicit",)),
                "file": rng.choice(ODD_VALUES + ("/a/train.py",)), "line": rng.choice(ODD_VALUES + (3,)),
                "function": rng.choice(ODD_VALUES + ("train",)), "stack": rng.choice(ODD_VALUES)}
        (folder / f"w{seed}.syncsites.json").write_text(json.dumps({"version": 1, "sites": [site] * 3}))
        return folder, description + " + sync sites"
    return target, description


def run_in_process(path: Path) -> tuple[int, str, str, list[str], float]:
    """`trainprof analyze PATH --json --debug` in this process: code, stdout, stderr, warnings, CPU seconds.

    CPU time, not wall time: on a shared machine the wall clock measures the neighbours.
    """
    from trainprof.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        code = main(["analyze", str(path), "--json", "--debug"])
    return code, out.getvalue(), err.getvalue(), [str(w.message) for w in caught], time.process_time() - start


def check_outcome(code: int, out: str, err: str, caught: list[str], seconds: float) -> str:
    """'ok' (exit 0, one JSON object), 'rejected' (exit 2, one line); raises AssertionError otherwise."""
    assert seconds < SECONDS_PER_MUTANT, f"took {seconds:.1f} s of CPU"
    assert not caught, f"warnings: {caught[:3]}"
    if code == 0:
        assert err == "", err[:500]
        json.loads(out)
        return "ok"
    assert code == 2, code
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("trainprof: error: "), err[:500]
    return "rejected"


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + N_MUTANTS))
def test_mutant(seed, tmp_path, fixtures_dir):
    path, description = make_mutant(seed, tmp_path, fixtures_dir)
    try:
        check_outcome(*run_in_process(path))
    except BaseException as error:
        raise AssertionError(f"{description}: {type(error).__name__}: {error}") from error


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


def main(count: int, first_seed: int = 0) -> int:
    """Run `count` mutants in process; print the outcome counts and every failure."""
    import tempfile

    from conftest import FIXTURES_DIR  # run as a script, this file's folder is sys.path[0]

    outcomes: Counter = Counter()
    slowest = 0.0
    for seed in range(first_seed, first_seed + count):
        with tempfile.TemporaryDirectory() as folder:
            path, description = make_mutant(seed, Path(folder), FIXTURES_DIR)
            try:
                result = run_in_process(path)
                slowest = max(slowest, result[-1])
                outcomes[check_outcome(*result)] += 1
            except BaseException as error:  # noqa: BLE001 - every failure is counted and shown
                outcomes["failed"] += 1
                print(f"FAIL {description}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        if (seed - first_seed + 1) % 250 == 0:
            print(f"after {seed - first_seed + 1}: {dict(outcomes)}; slowest {slowest:.2f} s", flush=True)
    print(f"{count} mutants (seeds {first_seed}..{first_seed + count - 1}): {dict(outcomes)}; "
          f"slowest {slowest:.2f} s")
    return 1 if outcomes["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else N_MUTANTS,
                  int(sys.argv[2]) if len(sys.argv) > 2 else FIRST_SEED))
