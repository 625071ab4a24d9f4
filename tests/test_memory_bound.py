"""`trainprof analyze` holds its memory bound (docs/analyze.md "Memory", trainprof/trace/budget.py; issue #21,
items 10-11): each case runs in a child process that reports its peak RSS above the RSS it had
once the analysis was imported.

    peak RSS above the loaded interpreter <= 3 x the trace's counted size (+ 8 x the sidecar's)

The full-size cases of the issue (64 MiB of `{}` events, a 4 GiB gzip bomb, a 300 MB trace) are
`python -m benchmarks.memory_bound`; these are their small, fast versions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from trainprof.trace import budget

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")

MiB = 2**20
ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, resource, sys
import msgspec, numpy, trainprof.report.json
from trainprof.analysis import analyze  # imports every analysis module: not counted below
from trainprof.cli import main

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

room, argv = int(sys.argv[1]), sys.argv[2:]
if room:  # ulimit -v: the address space in use now, plus `room` MiB
    limit = status("VmSize:") + room * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
base = status("VmHWM:")
code = main(["analyze", *argv, "--json"])
sys.stderr.write(json.dumps({"code": code, "peak_growth": status("VmHWM:") - base}) + "\n")
"""


def _analyze(path: Path, *flags: str, room_mib: int = 0) -> tuple[int, str, int]:
    """Exit code, the one-line error (or ""), and the peak RSS growth in bytes."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(room_mib), str(path), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 0 and lines, (done.returncode, done.stderr[-2000:])  # no crash, no segfault
    report = json.loads(lines[-1])
    assert len(lines) <= 2 and (report["code"] == 0) == (len(lines) == 1), done.stderr[-2000:]
    return report["code"], lines[0] if len(lines) == 2 else "", report["peak_growth"]


def _repeated(head: bytes, item: bytes, tail: bytes, size: int) -> bytes:
    count = (size - len(head) - len(tail)) // (len(item) + 1)
    return head + b",".join([item] * count) + tail


def _compact_events(size: int) -> bytes:
    """Valid op + launch + kernel triples, compact JSON (~60 bytes per object: counted by objects)."""
    step = ('{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{t},"dur":20,'
            '"args":{{"Sequence number":{i}}}}},{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel",'
            '"pid":1,"tid":1,"ts":{t2},"dur":5,"args":{{"correlation":{i}}}}},{{"ph":"X","cat":"kernel",'
            '"name":"gemm","pid":0,"tid":7,"ts":{t3},"dur":30,"args":{{"correlation":{i}}}}}')
    parts, total, i = [], 0, 0
    while total < size:
        part = step.format(t=i * 100, t2=i * 100 + 2, t3=i * 100 + 10, i=i).encode()
        parts.append(part)
        total += len(part) + 1
        i += 1
    return b'{"traceEvents":[' + b",".join(parts) + b"]}"


def _counted(text: bytes) -> int:
    return budget.counted(text)[0]


SMALL_TRACE = _compact_events(4096)


def test_valid_events_stay_within_the_bound(tmp_path):
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(text := _compact_events(16 * MiB))
    code, error, growth = _analyze(path)
    assert code == 0, error
    assert growth <= budget.TRACE_MEMORY_FACTOR * _counted(text)


def test_tiny_objects_are_refused_before_decoding(tmp_path):
    """`{}` events cost ~60x their JSON once decoded (64 MiB took 3.7 GB): counted by objects, 16 MiB
    of them is over a 256 MiB limit, refused having held only the text."""
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(_repeated(b'{"traceEvents":[', b"{}", b"]}", 16 * MiB))
    code, error, growth = _analyze(path, "--max-trace-bytes", "256M")
    assert code == 2 and "JSON objects" in error and "more than 268,435,456" in error
    assert growth < 2 * 16 * MiB


def test_a_large_sync_sites_file_is_refused_beside_a_small_trace(tmp_path):
    """The sidecar had no limit of its own and was decoded twice (64 MiB took 3.2 GB, exit 0)."""
    (tmp_path / "w.1795302433816535958.pt.trace.json").write_bytes(SMALL_TRACE)
    (tmp_path / "w.syncsites.json").write_bytes(_repeated(b'{"version":2,"sites":[', b"{}", b"]}", 8 * MiB))
    code, error, growth = _analyze(tmp_path)
    assert code == 2 and "w.syncsites.json" in error and "sync sites file" in error
    assert growth < 2 * 8 * MiB


def test_a_gzip_bomb_is_refused_without_holding_its_text(tmp_path):
    """1 GiB of JSON in a 1 MB gzip whose trailer claims 32 MiB: refused at the 512 MiB limit while
    holding at most the trusted trailer's size and one piece (it held the whole 512 MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = b" " * (16 * MiB)
    head = packer.compress(b'{"traceEvents":[' + spaces) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(spaces) + packer.flush(zlib.Z_FULL_FLUSH)  # self-contained: repeatable
    bomb = head + block * 63 + packer.compress(b"]}") + packer.flush()
    assert len(bomb) < 4 * MiB
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(bomb)
    code, error, growth = _analyze(path, "--max-trace-bytes", "512M")
    assert code == 2 and "after gunzip" in error
    assert growth < budget.TRUSTED_TRAILER_BYTES + 3 * 16 * MiB


def test_out_of_address_space_is_refused_early_with_one_line(tmp_path):
    """Under `ulimit -v`, running out of memory inside msgspec sometimes crashed (SIGSEGV): a trace
    whose bound does not fit in what the process may still allocate is refused before decoding."""
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(text := _compact_events(24 * MiB))
    assert budget.TRACE_MEMORY_FACTOR * _counted(text) > 120 * MiB
    code, error, growth = _analyze(path, room_mib=120)
    assert code == 2 and "ulimit" in error and "needs up to" in error
    assert growth < 2 * len(text)


def _steps(count: int) -> bytes:
    """`count` back-to-back steps of one tiny op each: the densest steps (issue #33: 20-26x their
    counted size when a step counted as its bytes; 10^6 of them took 2.43 GB)."""
    events = []
    for step in range(count):
        events.append(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step}","pid":1,"tid":1,'
                      f'"ts":{step * 10},"dur":9}}')
        events.append(f'{{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":{step * 10 + 1},"dur":1}}')
    return ('{"traceEvents":[' + ",".join(events) + "]}").encode()


def test_dense_steps_stay_within_the_bound(tmp_path):
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(text := _steps(20_000))
    code, error, growth = _analyze(path)
    assert code == 0, error
    assert _counted(text) == budget.BYTES_PER_STEP * 20_000  # the steps, not the bytes, count
    assert growth <= budget.TRACE_MEMORY_FACTOR * _counted(text)


def test_dense_steps_that_cannot_fit_under_an_rlimit_are_refused_before_decoding(tmp_path):
    """Counted by their objects, 20,000 dense steps "needed" 15 MB and were decoded under a 60 MiB
    address-space limit; they take ~62 MiB (2-core CPU machine, 2026-11-28)."""
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(text := _steps(20_000))
    code, error, growth = _analyze(path, room_mib=60)
    assert code == 2 and "ulimit" in error and "needs up to" in error
    assert growth < 2 * len(text) + 8 * MiB
