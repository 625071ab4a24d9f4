"""A run folder as a killed or still running session leaves it (issue #33): a cut or empty window is
skipped with one warning and the rest analysed, and a run being written is analysed as it stands.
A cut file given alone stays an error (tests/test_cli.py, tests/test_trace.py).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainprof.analysis import analyze

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def cut_run(tmp_path, fixtures_dir) -> tuple[Path, Path, list[str]]:
    """A run folder: one whole window and three cut ones (0 bytes, a gzip cut in half, a JSON cut
    in half: what SIGKILL during an export and torch's own handler writing leave)."""
    source = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    run = tmp_path / "run"
    run.mkdir()
    whole = run / "host_1.1795000000000000001.pt.trace.json.gz"
    whole.write_bytes(source.read_bytes())
    cut = {
        "host_1.1795000000000000002.pt.trace.json.gz": b"",
        "host_1.1795000000000000003.pt.trace.json.gz": source.read_bytes()[: source.stat().st_size // 2],
        "host_1.1795000000000000004.pt.trace.json": gzip.decompress(source.read_bytes())[:100_000],
    }
    for name, data in cut.items():
        (run / name).write_bytes(data)
    return run, whole, sorted(cut)


def _steps(analysis_json: str) -> list[int]:
    return [step["step"] for step in json.loads(analysis_json)["steps"]]


def test_a_cut_or_empty_window_is_skipped_with_one_warning_each(cut_run):
    """`trainprof analyze <run>` refused the whole run over one 0-byte window."""
    run, whole, cut = cut_run
    result = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(run), "--json"],
                            capture_output=True, text=True, timeout=240, env=ENV, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    alone = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(whole), "--json"],
                           capture_output=True, text=True, timeout=240, env=ENV, cwd=ROOT)
    assert _steps(result.stdout) == _steps(alone.stdout) and _steps(alone.stdout)
    warnings = result.stderr.splitlines()
    assert len(warnings) == len(cut)
    for name in cut:
        assert sum(f"skipping '{name}'" in line for line in warnings) == 1, warnings
    assert any("empty file" in line for line in warnings) and any("ends early" in line for line in warnings)
    quiet = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(run), "--json", "--quiet"],
                           capture_output=True, text=True, timeout=240, env=ENV, cwd=ROOT)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_in_process_and_in_workers_alike(cut_run, caplog):
    run, _, cut = cut_run
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        analysis = analyze(run, workers=1)
    assert len(analysis.traces) == 1
    assert sorted(record.getMessage().split("'")[1] for record in caplog.records) == cut


def test_a_folder_of_nothing_but_cut_windows_is_one_line(cut_run, capsys):
    from trainprof.cli import main

    run, whole, _ = cut_run
    whole.unlink()
    assert main(["analyze", str(run), "--json", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1


_LONG_RUN = """
    import torch, trainprof
    weight = torch.nn.Parameter(torch.ones(8))
    opt = torch.optim.SGD([weight], lr=1e-3)
    with trainprof.session(log_dir={log!r}, run_name="run", wait=1, warmup=1, active=2, repeat=0,
                           console=False, tensorboard_scalars=False, analyze=False):
        for _ in range(1000):
            x = weight
            for _ in range(600):  # many small ops: a window of megabytes, exported for a while
                x = x * 1.0001
            x.sum().backward(); opt.step(); opt.zero_grad()
"""


TRIES = 12
"""`trainprof analyze` runs while the session writes (each ~0.5 s, a window exported every ~0.3 s)."""


def test_a_run_being_written_is_analysed_as_it_stands(tmp_path):
    """`trainprof analyze` of a run still being written failed 31 of 40 times on the window being
    exported (torch's handler gzips into the final name). Now every try while windows are exported
    reads whole windows only."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_LONG_RUN.format(log=str(tmp_path))))
    writer = subprocess.Popen([sys.executable, str(script)], env=ENV, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "run"
    outcomes = []
    try:
        deadline = time.monotonic() + 120
        while writer.poll() is None and time.monotonic() < deadline and len(outcomes) < TRIES:
            if not list(run.glob("*.pt.trace.json.gz")):
                time.sleep(0.2)
                continue
            command = [sys.executable, "-m", "trainprof", "analyze", str(run), "--json", "--quiet"]
            tried = subprocess.run(command, capture_output=True, text=True, timeout=120, env=ENV)
            outcomes.append((tried.returncode, tried.stderr.strip()))
    finally:
        writer.kill()
        writer.wait()
    assert len(outcomes) == TRIES, outcomes
    assert [outcome for outcome in outcomes if outcome != (0, "")] == []
