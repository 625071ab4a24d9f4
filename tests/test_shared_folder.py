"""A log folder others can write to (issue #33): a link planted at any name trainprof writes never
makes it write outside the folder, and a device or FIFO is never replaced by a file.

The planted names are those trainprof used before (`<worker>.syncsites.json.tmp`,
`.summary.json.<pid>.tmp`, `.report.md.<pid>.tmp`, `.report.html.<pid>.tmp`,
`<worker>.peaks.json.<pid>.tmp`), where links overwrote 4 of 4 files outside the folder, and every
final name. What the TensorBoard tab reads and serves: tests/test_tensorboard.py.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
from training_loop import model_and_optimizer, train, trainprof_warnings

import trainprof
from trainprof.capture.peaks import write_beside
from trainprof.cli import main
from trainprof.files import write_atomically

session_module = importlib.import_module("trainprof.session")
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}
PRECIOUS = "not trainprof's to write\n"
REPORTS = ("summary.json", "report.md", "report.html")


def _victims(tmp_path: Path, names: list[str]) -> dict[str, Path]:
    """A file outside the run folder for each name, holding `PRECIOUS`."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {}
    for index, name in enumerate(names):
        victims[name] = outside / f"victim-{index}"
        victims[name].write_text(PRECIOUS)
    return victims


def _plant(folder: Path, victims: dict[str, Path]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, victim in victims.items():
        (folder / name).symlink_to(victim)


def _untouched(victims: dict[str, Path]) -> bool:
    return all(victim.read_text() == PRECIOUS for victim in victims.values())


def test_links_at_the_temporary_names_are_never_followed(tmp_path):
    worker, pid = session_module._worker_name(None), os.getpid()
    temporaries = [f"{worker}.syncsites.json.tmp", *(f".{name}.{pid}.tmp" for name in REPORTS)]
    victims = _victims(tmp_path, temporaries)
    run = tmp_path / "log" / "run"
    _plant(run, victims)
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=run.parent, run_name="run", wait=0, warmup=1, active=2, **FAST) as sess:
        assert train(model, optimizer, 5) == 5
    assert _untouched(victims)
    assert sess.summary.verdict == "cpu-only"
    for name in (*REPORTS, f"{worker}.syncsites.json"):
        assert (run / name).is_file() and not (run / name).is_symlink(), name
    assert all((run / name).is_symlink() for name in temporaries)  # left as they were
    traces = list(run.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and not traces[0].is_symlink()


def test_links_at_the_final_names_are_refused_and_training_goes_on(tmp_path):
    worker = session_module._worker_name(None)
    victims = _victims(tmp_path, list(REPORTS))
    run = tmp_path / "log" / "run"
    _plant(run, victims)
    model, optimizer = model_and_optimizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainprof.session(log_dir=run.parent, run_name="run", wait=0, warmup=1, active=2,
                               **FAST) as sess:
            assert train(model, optimizer, 5) == 5
    assert _untouched(victims)
    assert all((run / name).is_symlink() for name in REPORTS)  # the planted entries stay as they are
    messages = trainprof_warnings(caught)
    assert len(messages) == 1 and "summary.json" in messages[0] and "a symbolic link" in messages[0]
    assert "\n" not in messages[0] and sess.summary.verdict == "not-profiled"
    assert (run / f"{worker}.syncsites.json").is_file()  # written before the refusal


def test_a_link_at_the_sync_sites_name_stops_the_session_not_the_loop(tmp_path):
    worker = session_module._worker_name(None)
    name = f"{worker}.syncsites.json"
    victims = _victims(tmp_path, [name])
    run = tmp_path / "log" / "run"
    _plant(run, victims)
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning, match="a symbolic link") as caught:
        with trainprof.session(log_dir=run.parent, run_name="run", wait=0, warmup=1, active=2, **FAST):
            assert train(model, optimizer, 5) == 5
    assert len(trainprof_warnings(caught)) == 1 and _untouched(victims)


def test_peaks_file_beside_the_traces(tmp_path):
    worker, pid = "host_1", os.getpid()
    name = f"{worker}.peaks.json"
    victims = _victims(tmp_path, [f"{name}.{pid}.tmp"])
    run = tmp_path / "run"
    _plant(run, victims)
    assert write_beside(run, worker, {"version": 1}) == run / name
    assert (run / name).is_file() and _untouched(victims)
    (run / name).unlink()
    (run / name).symlink_to(victims[f"{name}.{pid}.tmp"])
    assert write_beside(run, worker, {"version": 1}) is None  # refused, logged
    assert _untouched(victims)


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    def chunks():
        yield b"half"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomically(tmp_path / "summary.json", chunks())
    assert list(tmp_path.iterdir()) == []


def test_report_command_refuses_a_planted_report_link(tmp_path, fixtures_dir, capsys):
    run = tmp_path / "run"
    run.mkdir()
    source = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    (run / source.name).write_bytes(source.read_bytes())
    victims = _victims(tmp_path, ["report.html", f".report.html.{os.getpid()}.tmp"])
    _plant(run, victims)
    assert main(["report", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a symbolic link" in err
    assert _untouched(victims) and (run / "report.html").is_symlink()
    (run / "report.html").unlink()
    assert main(["report", str(run), "--quiet"]) == 0
    assert (run / "report.html").is_file() and not (run / "report.html").is_symlink()
    assert _untouched(victims)


def test_report_to_a_device_the_user_named_is_written_through(tmp_path, fixtures_dir):
    """`--html /dev/stdout` as root replaced the device node with a 388 KB file. Here the same
    through a link the test owns (`stdout` -> /dev/stdout, as /dev/stdout -> /proc/self/fd/1)."""
    trace = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/dev/stdout")
    result = subprocess.run([sys.executable, "-m", "trainprof", "report", str(trace), "--html", str(stdout)],
                            capture_output=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(b"<!doctype html>") and result.stdout.rstrip().endswith(b"</html>")
    assert stdout.is_symlink() and os.readlink(stdout) == "/dev/stdout"
    assert not (tmp_path / "report.html").exists()


def test_report_to_a_fifo_the_user_named_is_written_through(tmp_path, fixtures_dir, capsys):
    trace = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    fifo = tmp_path / "page"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["report", str(trace), "--html", str(fifo), "--quiet"]) == 0
    reader.join(timeout=60)
    assert received and received[0].startswith(b"<!doctype html>")
    assert fifo.is_fifo()  # not replaced by a regular file
    assert capsys.readouterr().out == ""
