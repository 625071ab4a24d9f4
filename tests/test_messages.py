"""Messages from the user's point of view (issue #37, item 5): warnings from the user's own frame,
advice that fits how trainprof was started, no trainprof frames in a script's traceback, no empty
run folders, each subcommand's own usage, and `COLUMNS` on a pipe."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from training_loop import model_and_optimizer, train

import trainprof
from trainprof.cli import main
from trainprof.report.console import print_report, terminal_width

session_module = importlib.import_module("trainprof.session")  # `trainprof.session` is the function
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}
RUN_FAST = ["--wait", "0", "--warmup", "1", "--active", "2"]


def _trainprof_warnings(caught) -> list[warnings.WarningMessage]:
    return [w for w in caught if str(w.message).startswith("trainprof")]


def test_a_session_warning_points_at_the_users_with_line(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainprof.session(log_dir=tmp_path, run_name="r", **FAST):  # the line warned from
            pass
    (warning,) = _trainprof_warnings(caught)
    assert warning.filename == __file__
    with open(__file__) as source:
        assert "the line warned from" in source.read().splitlines()[warning.lineno - 1]
    assert "sess.step()" in str(warning.message)  # a session's own loop can call it


def test_a_failure_inside_a_step_hook_warns_from_the_users_loop(tmp_path, monkeypatch):
    def broken(self, step):
        raise RuntimeError("planted")

    monkeypatch.setattr(session_module.Session, "_window_edge", broken)
    model, optimizer = model_and_optimizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainprof.session(log_dir=tmp_path, run_name="r", **FAST):
            train(model, optimizer, 3)
    (warning,) = _trainprof_warnings(caught)
    assert "planted" in str(warning.message)
    assert warning.filename.endswith("training_loop.py")  # optimizer.step()'s line, not torch's


NO_STEP_SCRIPT = """
import torch

x = torch.randn(8, 8)
for _ in range(3):
    x = x @ x / 8
"""


def test_trainprof_run_advice_names_what_a_run_user_can_do(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(NO_STEP_SCRIPT))
    done = subprocess.run(
        [sys.executable, "-m", "trainprof", "run", "--log-dir", str(tmp_path / "log"), *RUN_FAST,
         str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    (line,) = [line for line in lines if "nothing was profiled" in line]
    assert line.startswith("trainprof: no step ended")  # one line: no file, line number or category
    assert "`trainprof run`" in line and "wrap its loop in" in line
    assert not any("session.py" in line or line.startswith("  ") for line in lines)  # no source line
    assert not list((tmp_path / "log").glob("*"))  # nothing recorded: no empty run folder left


def test_callback_advice_speaks_of_the_frameworks_steps(tmp_path):
    from trainprof.integrations._session import TrainingSession

    training = TrainingSession({"log_dir": tmp_path, **FAST})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training.begin()
        training.end()
    (warning,) = _trainprof_warnings(caught)
    assert "sess.step()" not in str(warning.message) and "framework's optimizer steps" in str(warning.message)
    assert not list(tmp_path.glob("*"))


def test_a_scripts_syntax_error_shows_no_trainprof_frame(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n    pass\n")
    assert main(["run", "--log-dir", str(tmp_path / "log"), *RUN_FAST, str(script)]) == 1
    err = capsys.readouterr().err
    assert "SyntaxError" in err and f'File "{script}", line 1' in err
    assert "Traceback" not in err and "trainprof" not in err and "runpy" not in err
    assert not list((tmp_path / "log").glob("*"))  # the failed run left no empty folder


def test_a_loop_that_raises_leaves_no_empty_run_folder(tmp_path):
    with pytest.raises(ValueError), trainprof.session(log_dir=tmp_path, **FAST):
        raise ValueError("the user's")
    assert not list(tmp_path.glob("*"))


@pytest.mark.parametrize("command", [["analyze", "x"], ["report", "x"], ["demo"], ["run", "x.py"],
                                     ["ab"], ["diff", "a", "b"], ["ncu", "r"]])
def test_a_misspelled_flag_shows_the_subcommands_usage(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([command[0], "--jsno", *command[1:]])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: trainprof {command[0]} ")
    assert f"trainprof {command[0]}: error: unrecognized arguments: --jsno" in err


def test_columns_is_honoured_on_a_pipe(monkeypatch, fixtures_dir):
    from trainprof.analysis import analyze

    monkeypatch.setenv("COLUMNS", "80")
    assert terminal_width(io.StringIO()) == 80
    out = io.StringIO()
    print_report(analyze(fixtures_dir / "traces/gpt2_pathologies"), out)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80
    monkeypatch.setenv("COLUMNS", "lots")
    assert terminal_width(io.StringIO()) == 160
