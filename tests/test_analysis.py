"""The analysis on real H200 traces with planted problems (numbers checked by hand against the traces)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainprof.analysis import Analysis, Finding, analyze
from trainprof.analysis.result import SCHEMA_VERSION
from trainprof.trace import load_traces

STEP_KEYS = {"step", "duration_ms", "gpu_busy_pct", "kernel_count", "sync_count"}
FINDING_KEYS = {"kind", "title", "severity", "op", "where", "count", "per_step", "cost_ms", "fix"}


@pytest.fixture(scope="module")
def pathologies(fixtures_dir) -> Analysis:
    return analyze(fixtures_dir / "traces/gpt2_pathologies")


def _syncs(result: Analysis) -> list[Finding]:
    return [f for f in result.findings if f.kind == "sync_point"]


def test_pathologies_steps(pathologies):
    steps = pathologies.steps
    assert [s.times.number for s in steps] == [3, 4, 5]
    # ProfilerStep#3..5 durations in the trace: 50055.53, 40388.635, 38848.22 µs.
    assert [s.times.duration_ms for s in steps] == pytest.approx([50.0555, 40.3886, 38.8482], abs=1e-3)
    assert all(s.times.kernel_count == 820 for s in steps)  # 2460 kernels, all launched inside the steps
    assert all(s.syncs.count == 3 for s in steps)
    assert all(s.times.gpu_busy_pct < 25 for s in steps)
    assert pathologies.summary.peak_memory_bytes > 1.9e9


def test_pathologies_pageable_copy_sync(pathologies):
    (h2d,) = [f for f in _syncs(pathologies) if "aten::copy_" in (f.op or "")]
    assert h2d.op == "aten::to -> aten::_to_copy -> aten::copy_"
    assert h2d.where.to_dict() == {"file": "make_traces.py", "line": None, "function": "gpt2_loop"}
    assert (h2d.count, h2d.per_step) == (3, 1.0)
    assert h2d.details.sync_kind == "h2d_pageable"
    # Three blocking cudaMemcpyAsync (31.446 + 16.857 + 15.481 µs) + their cudaStreamSynchronize (27.447 µs).
    assert h2d.cost_ms == pytest.approx(0.0912, abs=1e-4)


def test_pathologies_item_syncs(pathologies):
    (item,) = [f for f in _syncs(pathologies) if "aten::item" in (f.op or "")]
    assert item.where.function == "gpt2_loop"
    assert (item.count, item.per_step) == (6, 2.0)
    assert item.details.sync_kind == "d2h_copy"
    assert item.cost_ms == pytest.approx(0.0720, abs=1e-4)  # six cudaStreamSynchronize, 72.0 µs


def test_pathologies_launch_overhead(pathologies):
    (launch,) = [f for f in pathologies.findings if f.kind == "launch_overhead"]
    assert launch.where.function == "gpt2_loop"
    assert launch.severity == "high"
    assert pathologies.summary.verdict == "launch-bound"
    top_ops = {o.op for o in launch.details.regions[0].top_ops}
    assert {"aten::pow", "aten::add_", "aten::sum"} <= top_ops  # the per-parameter grad-norm loop
    assert launch.details.tiny_kernel_pct > 50


def test_clean_has_no_user_sync(fixtures_dir):
    result = analyze(fixtures_dir / "traces/gpt2_clean")
    assert _syncs(result) == []  # profiler's exit synchronize and pinned non_blocking copies excluded
    assert [s.syncs.count for s in result.steps] == [0, 0, 0]


def test_ddp_straggler(fixtures_dir):
    result = analyze(fixtures_dir / "traces/ddp_straggler")
    (straggler,) = [f for f in result.findings if f.kind == "straggler"]
    assert straggler.rank == 1
    assert result.summary.straggler_rank == 1
    ranks = {r.rank: r for r in result.ranks}
    assert ranks[0].comm_ms > 40  # rank 0 waits in NCCL all-reduce for rank 1's 40 ms sleep
    assert ranks[1].comm_ms < 1
    assert {s.times.rank for s in result.steps} == {0, 1}
    host = [f for f in result.findings if f.kind == "host_bound" and f.rank == 1]
    assert host and host[0].details.idle_host_ms_per_step > 35


def _sites(skip: tuple[int, int] | None = None) -> list[dict]:
    sites = []
    for step in (3, 4, 5):
        for line in (38, 45, 49):
            if (step, line) != skip:
                sites.append(
                    {
                        "step": step,
                        "call": "implicit",
                        "file": "/home/u/make_traces.py",
                        "line": line,
                        "function": "gpt2_loop",
                        "stack": [],
                    }
                )
    return sites


def test_sync_site_join_fills_lines(fixtures_dir):
    (trace,) = load_traces(fixtures_dir / "traces/gpt2_pathologies")
    result = analyze([trace], sync_sites=_sites())
    by_line = {f.where.line: f for f in _syncs(result)}
    assert set(by_line) == {38, 45, 49}
    assert by_line[38].details.sync_kind == "h2d_pageable"
    assert "aten::item" in by_line[45].op and "aten::item" in by_line[49].op
    assert all(
        by_line[line].count == 3 and by_line[line].where.file == "/home/u/make_traces.py"
        for line in by_line
    )


def test_sync_site_join_never_shifts_a_missing_site(fixtures_dir):
    (trace,) = load_traces(fixtures_dir / "traces/gpt2_pathologies")
    result = analyze([trace], sync_sites=_sites(skip=(4, 45)))
    for finding in _syncs(result):
        steps = [o.step for o in finding.details.occurrences]
        if finding.where.line is not None:
            assert 4 not in steps  # step 4 lost a site: none of its syncs gets a (possibly wrong) line
    assert sum(f.count for f in _syncs(result) if f.where.line is None) == 3


def test_to_dict_is_json_with_required_fields(pathologies):
    document = json.loads(json.dumps(pathologies.to_dict(), allow_nan=False))
    assert set(document) == {"schema_version", "trace", "steps", "findings"}
    assert document["schema_version"] == SCHEMA_VERSION == 2
    assert all(STEP_KEYS <= set(step) for step in document["steps"])
    assert all(FINDING_KEYS <= set(f) for f in document["findings"])
    assert all(set(f["where"]) == {"file", "line", "function"} for f in document["findings"])
    assert all(f["severity"] in {"high", "medium", "low", "info"} for f in document["findings"])


def test_import_does_not_import_torch():
    code = "import sys, trainprof.analysis, trainprof.trace; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_trainprof_demo_loop_counts_as_user_code():
    from trainprof.analysis.frames import is_user_file

    assert is_user_file("/home/me/src/trainprof/trainprof/demo.py")
    assert not is_user_file("/home/me/src/trainprof/trainprof/session/lifecycle.py")
    assert not is_user_file("torch/nn/modules/module.py")
    assert is_user_file("make_traces.py")


def test_progress_is_reported_per_file_and_per_trace(fixtures_dir):
    calls = []
    on_progress = lambda what, done, total: calls.append((done, total))
    analyze(fixtures_dir / "traces/ddp_straggler", on_progress=on_progress)
    assert calls == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


def _backlog_trace(path: Path, early_correlation: int | None) -> Path:
    """One step launching one kernel, while a kernel queued before the trace (no launch in it) runs."""

    def event(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    early_args = {} if early_correlation is None else {"correlation": early_correlation}
    events = [
        event("user_annotation", "ProfilerStep#3", 1000, 900),
        event("cpu_op", "aten::mm", 1010, 100),
        event("cuda_runtime", "cudaLaunchKernel", 1020, 10, correlation=50),
        event("kernel", "earlier_step_gemm", 1005, 200, tid=7, **early_args),
        event("kernel", "gemm", 1210, 300, tid=7, correlation=50),
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize(
    ("early_correlation", "own", "before"),
    [
        (12, 1, 1),  # launched before the trace: busy time, not the step's kernel
        (77, 2, 0),  # a higher id with no launch in the trace: not known to be earlier; the step's
        (None, 2, 0),  # no correlation id (older schemas): by where it starts, as before
    ],
)
def test_kernels_queued_before_the_trace_are_not_the_steps(tmp_path, early_correlation, own, before):
    (step,) = analyze(_backlog_trace(tmp_path / "t.json", early_correlation)).steps
    assert step.times.kernel_count == own
    assert step.times.kernels_launched_before_trace == before
    assert step.times.gpu_busy_ms == pytest.approx(0.5)  # both kernels' time: 1005-1205 and 1210-1510 µs


# A process without torch and with one thread (`trainprof analyze`): a folder is analysed by forked
# workers, and gives what one process gives; a bad file's error, and a worker that dies, are raised.
_FORKED_FOLDER = """
import json, os, sys
from trainprof.analysis import analyze, folder
from trainprof.trace import TraceLoadError
forks = []
forked = folder._forked
folder._forked = lambda *args, **kw: forks.append(args[4]) or forked(*args, **kw)
try:
    if sys.argv[2] == "die":  # the child's share: the second file
        share = folder._share
        folder._share = (lambda files, first, *rest, **kw:
                         os._exit(3) if first else share(files, first, *rest, **kw))
    result = analyze(sys.argv[1], workers=2).to_dict()
except (TraceLoadError, RuntimeError) as error:
    print(json.dumps({"forks": forks, "error": f"{type(error).__name__}: {error}"}))
else:
    same = result == analyze(sys.argv[1], workers=1).to_dict()
    print(json.dumps({"forks": forks, "same": same, "torch": "torch" in sys.modules}))
"""


def _forked_run(folder: Path, how: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", _FORKED_FOLDER, str(folder), how],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_folder_is_analysed_by_forked_workers_where_forking_is_safe(fixtures_dir, tmp_path):
    ranks = fixtures_dir / "traces/ddp_straggler"
    assert _forked_run(ranks) == {"forks": [2], "same": True, "torch": False}

    bad = tmp_path / "bad"
    bad.mkdir()
    first = sorted(ranks.glob("*.json.gz"))[0]
    (bad / first.name).symlink_to(first)
    (bad / "z.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "late"}]}')
    outcome = _forked_run(bad)  # z sorts second: a forked child reads it
    assert outcome["forks"] == [2]
    assert outcome["error"].startswith("TraceLoadError: ") and "z.pt.trace.json" in outcome["error"]

    died = _forked_run(ranks, "die")
    assert died["error"].startswith("RuntimeError: the worker process analysing rank1.")


def test_a_process_that_imported_torch_or_runs_threads_never_forks_workers(monkeypatch):
    import torch  # noqa: F401 (a training process has it)

    from trainprof.analysis import folder

    forks = sys.platform.startswith("linux")
    monkeypatch.setattr(folder.threading, "active_count", lambda: 1)  # pytest-xdist runs threads
    assert not folder._can_fork()
    monkeypatch.delitem(sys.modules, "torch")
    assert folder._can_fork() == forks
    monkeypatch.setattr(folder.threading, "active_count", lambda: 2)
    assert not folder._can_fork()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_folder_numbers_each_process_windows_as_load_traces_does(fixtures_dir, workers):
    """analyze(folder) loads each file alone (in this process or in workers), yet its traces and
    findings carry the window numbers `load_traces` gives: two windows of one process, by start."""
    folder = fixtures_dir / "thirdparty/kineto_resnet50_num_workers_4"
    loaded = {trace.path.name: trace.window for trace in load_traces(folder)}
    assert sorted(loaded.values()) == [0, 1]
    analysis = analyze(folder, workers=workers)
    assert {Path(trace.file).name: trace.window for trace in analysis.traces} == loaded
    assert {finding.window for finding in analysis.findings} == {0, 1}  # each window has findings
