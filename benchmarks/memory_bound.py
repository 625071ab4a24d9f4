"""Does `trainprof analyze` hold its memory bound (docs/analyze.md "Memory"; trainprof/trace/budget.py)?

Each case is a file written into a scratch folder (deleted after its run) and analysed by a fresh
`trainprof analyze PATH --json` in a child process, which reports its peak RSS (`VmHWM`) above the
RSS it had once trainprof's analysis was imported (the interpreter, numpy, msgspec: ~36 MB here), the
exit code and the one-line error. The bound checked per case:

    peak RSS above the loaded interpreter <= 3 x the trace's counted size + 8 x the sidecar's

where a file's counted size is max(JSON bytes, 128 x its `{`, 384 x its events, 1536 x its step
annotations). A refused file must stay far under it.

    python -m benchmarks.memory_bound                  # every case; ~2 GB of memory at most, ~1 min
    python -m benchmarks.memory_bound --only gzip_bomb_4g --out mem.json

`--address-space-mib N` runs each case under `ulimit -v` (RLIMIT_AS) of the child's own address space
after its imports plus N MiB: what does not fit must be refused with one line, never a crash.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
# trainprof.trace.budget's weights (not imported: this file runs without trainprof's deps)
WEIGHTS = ((b"{", 128), (b'"ph"', 384), (b"ProfilerStep#", 1536))
TRACE_FACTOR, SIDECAR_FACTOR = 3, 8

CHILD = r"""
import json, os, resource, sys, time
import numpy, msgspec
import trainprof.analysis, trainprof.report.json, trainprof.trace.load
from trainprof.cli import main

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

room = int(sys.argv[3])
if room:
    limit = status("VmSize:") + room * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
base = status("VmHWM:")
sys.stderr = open(sys.argv[2], "w")
sys.stdout = open(os.devnull, "w")
start = time.perf_counter()
code = main(["analyze", sys.argv[1], "--json"])
seconds = time.perf_counter() - start
sys.__stdout__.write(json.dumps({"code": code, "base": base, "peak": status("VmHWM:"), "s": seconds}) + "\n")
"""


def counted(text: bytes) -> int:
    return max(len(text), *(weight * text.count(token) for token, weight in WEIGHTS))


def repeated(head: bytes, item: bytes, tail: bytes, size: int) -> bytes:
    """`head` + `item` repeated (comma-separated) + `tail`, about `size` bytes."""
    count = max(1, (size - len(head) - len(tail)) // (len(item) + 1))
    return head + b",".join([item] * count) + tail


def compact_events(size: int, dense: bool = False) -> bytes:
    """Valid complete events, one op + launch + kernel per step, compact JSON (~60 bytes per `{`);
    `dense`: every number distinct and large (no small-int caching, more bytes per object)."""
    step = 0
    parts = [b'{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,'
             b'"ts":0,"dur":1e12}']
    total = len(parts[0])
    big = 10**12 if dense else 0
    while total < size:
        t, ids, host = step * 100.5 + big, step + big, 1 + big
        chunk = (
            f',{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":{host},"tid":{host},"ts":{t},"dur":20.5,'
            f'"args":{{"Sequence number":{ids},"Fwd thread id":{host}}}}}'
            f',{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{host},"tid":{host},'
            f'"ts":{t + 2},"dur":5.5,"args":{{"correlation":{ids}}}}}'
            f',{{"ph":"X","cat":"kernel","name":"gemm","pid":{big},"tid":{7 + big},"ts":{t + 10},"dur":30.5,'
            f'"args":{{"correlation":{ids},"bytes":{step * 1.5}}}}}'
        ).encode()
        parts.append(chunk)
        total += len(chunk)
        step += 1
    parts.append(b"]}")
    return b"".join(parts)


def steps_trace(steps: int, ops_per_step: int = 1, annotations_only: bool = False) -> bytes:
    """`steps` back-to-back `ProfilerStep#` annotations, each around `ops_per_step` tiny cpu_ops
    (none with `annotations_only`), compact JSON: the densest steps a trace can hold."""
    parts = [b'{"traceEvents":[']
    for step in range(steps):
        at = step * 10.0
        parts.append(b'%s{"ph":"X","cat":"user_annotation","name":"ProfilerStep#%d","pid":1,"tid":1,"ts":%.1f,'
                     b'"dur":9}' % (b"," if step else b"", step, at))
        if not annotations_only:
            parts += [b',{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":%.3f,"dur":0.001}'
                      % (at + 1 + op * 8 / ops_per_step) for op in range(ops_per_step)]
    parts.append(b"]}")
    return b"".join(parts)


ONE_STEP = (b'{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,'
            b'"ts":0,')


def tiny_ops(count: int, own: str | None = None) -> bytes:
    """One step around `count` tiny cpu_ops (the fewest bytes an op that is kept can take); `own`:
    each on a thread of its own ("tid") or with a name of its own ("name")."""
    op = {None: b',{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":%d,"dur":0.5}',
          "tid": b',{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":%d,"ts":%d,"dur":0.5}',
          "name": b',{"ph":"X","cat":"cpu_op","name":"op%d","pid":1,"tid":1,"ts":%d,"dur":0.5}'}[own]
    ops = [op % ((i + 1,) if own is None else (i + 2, i + 1)) for i in range(count)]
    return ONE_STEP + b'"dur":%d}' % (count + 10) + b"".join(ops) + b"]}"


def torch_trace(size: int) -> bytes:
    """The gpt2_pathologies fixture's events repeated (times and step numbers moved on), as Kineto
    writes them (one event per line group): ~160 bytes per `{`."""
    fixture = REPO / "tests/fixtures/traces/gpt2_pathologies"
    raw = gzip.decompress(next(fixture.glob("*.pt.trace.json.gz")).read_bytes())
    document = json.loads(raw)
    events = document["traceEvents"]
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(times) - min(times) + 1000
    out, copy = [], 0
    while len(out) * len(raw) // len(events) < size:
        for event in events:
            moved = dict(event)
            if isinstance(moved.get("ts"), (int, float)):
                moved["ts"] = moved["ts"] + copy * span
            name = moved.get("name", "")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                moved["name"] = f"ProfilerStep#{int(name[13:]) + 100 * copy}"
            out.append(moved)
        copy += 1
    document["traceEvents"] = out
    return json.dumps(document, indent=1).encode()


SMALL_TRACE = (b'{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,'
               b'"ts":0,"dur":100},{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1,'
               b'"dur":50},{"ph":"X","cat":"python_function","name":"train.py(3): train","pid":1,"tid":1,'
               b'"ts":0.5,"dur":90}]}')


def sites(size: int, empty: bool) -> bytes:
    """A sync sites file: realistic sites with 30-frame stacks, or `{}` sites."""
    if empty:
        return repeated(b'{"version":2,"sites":[', b"{}", b"]}", size)
    frame = ('{"file":"/venv/lib/python3.11/site-packages/torch/nn/modules/module.py","line":1750,'
             '"function":"_call_impl"}')
    site = ('{"step":1,"call":"implicit","file":"/code/train.py","line":42,"function":"train","stack":['
            + ",".join([frame] * 30) + "]}").encode()
    return repeated(b'{"version":2,"worker":"w","sites":[', site, b"]}", size)


def gzip_bomb(inflated: int, lie: bool = False) -> bytes:
    """One gzip member of `{"traceEvents":[` + spaces + `]}`, streamed (never held inflated).
    `lie`: the trailer's size field says 100 bytes."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = b" " * (64 * MiB)
    parts = [packer.compress(b'{"traceEvents":[')]
    left = inflated
    while left > 0:
        parts.append(packer.compress(spaces[: min(left, len(spaces))]))
        left -= len(spaces)
    parts.append(packer.compress(b"]}"))
    parts.append(packer.flush())
    packed = b"".join(parts)
    return packed[:-4] + (100).to_bytes(4, "little") if lie else packed


Case = tuple[str, Callable[[Path], dict]]


def write_trace(text: bytes, name: str = "w.1795302433816535958.pt.trace.json") -> Callable[[Path], dict]:
    def make(folder: Path) -> dict:
        path = folder / name
        path.write_bytes(text)
        return {"path": path, "json_mib": len(text) / MiB, "counted_mib": counted(text) / MiB}

    return make


def cases(names: set[str] | None) -> list[tuple[str, Callable[[], Callable[[Path], dict]]]]:
    """Each case: name -> a thunk that builds its writer (built only when the case runs)."""

    def with_sidecar(text: bytes) -> Callable[[Path], dict]:
        def make(folder: Path) -> dict:
            trace = folder / "w.1795302433816535958.pt.trace.json"
            trace.write_bytes(SMALL_TRACE)
            (folder / "w.syncsites.json").write_bytes(text)
            return {"path": folder, "json_mib": (len(text) + len(SMALL_TRACE)) / MiB,
                    "counted_mib": counted(SMALL_TRACE) / MiB, "sidecar_counted_mib": counted(text) / MiB}

        return make

    def gz(text_size: int, lie: bool = False) -> Callable[[Path], dict]:
        def make(folder: Path) -> dict:
            path = folder / "w.1795302433816535958.pt.trace.json.gz"
            path.write_bytes(gzip_bomb(text_size, lie))
            return {"path": path, "json_mib": text_size / MiB, "counted_mib": 0.0}

        return make

    table = [
        ("empty_objects_64m", lambda: write_trace(repeated(b'{"traceEvents":[', b"{}", b"]}", 64 * MiB))),
        ("empty_objects_8m", lambda: write_trace(repeated(b'{"traceEvents":[', b"{}", b"]}", 8 * MiB))),
        ("strings_64m", lambda: write_trace(repeated(b'{"traceEvents":[', b'"a"', b"]}", 64 * MiB))),
        ("metadata_strings_64m", lambda: write_trace(
            repeated(SMALL_TRACE[:-1] + b',"deviceProperties":[', b'"a"', b"]}", 64 * MiB))),
        ("compact_events_64m", lambda: write_trace(compact_events(64 * MiB))),
        ("dense_events_64m", lambda: write_trace(compact_events(64 * MiB, dense=True))),
        ("torch_trace_256m", lambda: write_trace(torch_trace(256 * MiB))),
        ("dense_steps_100k", lambda: write_trace(steps_trace(100_000))),
        ("steps_only_100k", lambda: write_trace(steps_trace(100_000, annotations_only=True))),
        ("steps_1m", lambda: write_trace(steps_trace(1_000_000))),
        ("tiny_ops_1m", lambda: write_trace(tiny_ops(1_000_000))),
        ("threads_100k", lambda: write_trace(tiny_ops(100_000, own="tid"))),
        ("distinct_names_1m", lambda: write_trace(tiny_ops(1_000_000, own="name"))),
        ("sidecar_64m_empty_sites", lambda: with_sidecar(sites(64 * MiB, empty=True))),
        ("sidecar_64m_sites", lambda: with_sidecar(sites(64 * MiB, empty=False))),
        ("sidecar_16m_sites", lambda: with_sidecar(sites(16 * MiB, empty=False))),
        ("gzip_bomb_4g", lambda: gz(4 * 2**30)),
        ("gzip_bomb_4g_lying_trailer", lambda: gz(4 * 2**30 + 16, lie=True)),
    ]
    return [(name, build) for name, build in table if names is None or name in names]


def run_case(name: str, make: Callable[[Path], dict], room_mib: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        info = make(folder)
        err = folder / "stderr.txt"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(info["path"]), str(err), str(room_mib)],
                              capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - start
        row = {"case": name, "json_mib": round(info["json_mib"], 1),
               "counted_mib": round(info["counted_mib"], 1),
               "sidecar_counted_mib": round(info.get("sidecar_counted_mib", 0.0), 1),
               "wall_s": round(wall, 2)}
        if done.returncode != 0 or not done.stdout.strip():  # a crash: the child never reported
            said = (err.read_text() if err.exists() else "")[-300:]
            row.update(code=done.returncode, error=said + done.stderr[-300:])
            return row
        child = json.loads(done.stdout.strip().splitlines()[-1])
        peak = (child["peak"] - child["base"]) / MiB
        # A gzip bomb's text is never counted (it is refused unread): it has no bound, only its peak.
        bound = TRACE_FACTOR * info["counted_mib"] + SIDECAR_FACTOR * info.get("sidecar_counted_mib", 0.0)
        row.update(code=child["code"], analyse_s=round(child["s"], 2), peak_above_base_mib=round(peak, 1),
                   bound_mib=round(bound, 1) if bound else None,
                   within=peak <= max(bound, 16.0) if bound else None,
                   error=err.read_text().strip()[:200])
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument("--address-space-mib", type=int, default=0,
                        help="run under RLIMIT_AS = the child's address space after imports + this")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for name, build in cases(set(args.only) if args.only else None):
        row = run_case(name, build(), args.address_space_mib)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'case':28} {'JSON MiB':>9} {'counted':>9} {'peak MiB':>9} {'bound':>8} {'exit':>4}  {'s':>6}")
    nan = float("nan")
    for row in rows:
        both = row["counted_mib"] + row["sidecar_counted_mib"]
        print(f"{row['case']:28} {row['json_mib']:9.1f} {both:9.1f} "
              f"{row.get('peak_above_base_mib', nan):9.1f} {row.get('bound_mib') or nan:8.1f} "
              f"{row['code']:>4}  {row.get('analyse_s', nan):6.2f}  {row.get('error', '')[-90:]}")
    if args.out:
        args.out.write_text(json.dumps({"address_space_mib": args.address_space_mib, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
