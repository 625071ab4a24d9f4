"""`trainprof analyze` on the checked-in real traces and on bad input, as a user runs it."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path


def trainprof(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainprof", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_analyze_json_prints_one_object(fixtures_dir):
    (trace_file,) = (fixtures_dir / "traces/gpt2_pathologies").glob("*.pt.trace.json.gz")
    result = trainprof("analyze", str(trace_file), "--json", "--debug")
    assert result.returncode == 0, result.stderr
    analysis = json.loads(result.stdout)  # exactly one JSON object, nothing else on stdout
    assert set(analysis) >= {"trace", "steps", "findings"}
    assert analysis["findings"] and all({"kind", "title", "severity", "op", "where", "count", "per_step",
                                         "cost_ms", "fix"} <= set(f) for f in analysis["findings"])
    assert all({"step", "duration_ms", "gpu_busy_pct", "kernel_count", "sync_count"} <= set(s)
               for s in analysis["steps"])


def test_analyze_folder_prints_the_report(fixtures_dir):
    result = trainprof("analyze", str(fixtures_dir / "traces/gpt2_pathologies"), "--debug")
    assert result.returncode == 0, result.stderr
    assert "trainprof" in result.stdout and "Top findings" in result.stdout
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_analyze_does_not_import_torch():
    code = ("import sys, trainprof.cli, trainprof.analysis, trainprof.report.console; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Modules `trainprof analyze FILE` (--json or the console report) never needs, each imported where
# another command or a rarer input needs it: torch and the session (training), worker processes (a
# folder of several traces), the sync-site catalog's reader, statistics (random, fractions) and
# subprocess (trainprof ncu).
NOT_IMPORTED_BY_ANALYZE = (
    "torch", "trainprof.session", "trainprof.config", "multiprocessing", "concurrent.futures",
    "importlib.resources", "statistics", "subprocess",
)
_ANALYZE_IN_PROCESS = """
import contextlib, io, json, sys
import msgspec, numpy  # theirs, not trainprof's: what they import is left out of the count
before = set(sys.modules)
from trainprof.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    codes = [main(["analyze", sys.argv[1], *extra, "--quiet"]) for extra in (["--json"], [])]
print(json.dumps({"codes": codes, "imported": sorted(set(sys.modules) - before)}))
"""


def test_analyze_imports_only_what_it_needs(fixtures_dir):
    (trace_file,) = (fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz")
    done = subprocess.run([sys.executable, "-c", _ANALYZE_IN_PROCESS, str(trace_file)],
                          capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["codes"] == [0, 0]
    assert "trainprof.analysis.core" in result["imported"]  # the count holds what the command imported
    assert sorted(set(NOT_IMPORTED_BY_ANALYZE) & set(result["imported"])) == []


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    (tmp / "empty.json").write_text("")
    (tmp / "notjson.json").write_text("this is not json {")
    (tmp / "other.json").write_text(json.dumps({"hello": "world"}))
    (tmp / "list.json").write_text("[1, 2, 3]")
    events = [{"ph": "X", "name": "x", "ts": 1, "dur": 2}] * 500
    full = gzip.compress(json.dumps({"traceEvents": events}).encode())
    (tmp / "truncated.pt.trace.json.gz").write_bytes(full[: len(full) // 2])
    (tmp / "empty_folder").mkdir()
    return {
        "missing": tmp / "missing.pt.trace.json",
        **{p.name: p for p in tmp.iterdir()},
    }


def test_bad_input_exits_2_with_one_line_naming_the_file(tmp_path):
    for name, path in _bad_inputs(tmp_path).items():
        result = trainprof("analyze", str(path), "--json", "--debug")
        assert result.returncode == 2, (name, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainprof: error: "), (name, result.stderr)
        assert path.name in lines[0], (name, lines[0])
        assert result.stdout == ""


def test_usage_errors_exit_2():
    assert trainprof().returncode == 2
    assert trainprof("nonsense").returncode == 2


# A terminal's progress bar is redrawn by each step, not by a thread of rich's: the CLI process still
# runs one thread, so a folder's workers are forked (trainprof.analysis.folder).
_TERMINAL_BAR = """
import io, json, sys
from trainprof.analysis import folder
from trainprof.cli.analyze import _load_and_analyze

class Terminal(io.StringIO):
    def isatty(self):
        return True

forks = []
forked = folder._forked
folder._forked = lambda *args, **kwargs: forks.append(args[4]) or forked(*args, **kwargs)
bar = Terminal()
analysis = _load_and_analyze(sys.argv[1], bar)
print(json.dumps({"forks": forks, "traces": len(analysis.traces), "drawn": "traces" in bar.getvalue()}))
"""


def test_a_terminals_progress_bar_leaves_the_folder_to_forked_workers(fixtures_dir):
    done = subprocess.run([sys.executable, "-c", _TERMINAL_BAR, str(fixtures_dir / "traces/ddp_straggler")],
                          capture_output=True, text=True, check=True, timeout=120)
    forks = [2] if (os.cpu_count() or 1) >= 2 else []  # a worker per core
    assert json.loads(done.stdout) == {"forks": forks, "traces": 2, "drawn": True}
