"""A session never ends a training thread or the code after it (issue #21, items 1-6).

Each test reproduces a way a session ended, hid or changed the user's program: two sessions in two
threads, a closed stdout, `-W error` with MarkupSafe loaded, a loop shorter than the schedule
re-analysed, Ctrl-C during the export, and the smaller ones (an odd RANK, the user's showwarning, a
forked child, `~` in log_dir).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from training_loop import model_and_optimizer, train, trainprof_warnings

import trainprof
from trainprof.analysis import analyze
from trainprof.cli import main as cli_main

session_module = importlib.import_module("trainprof.session")  # `trainprof.session` is the function
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}


def _script(code: str, tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# -- 1. two sessions in two threads ------------------------------------------------------------------


def test_sessions_in_two_threads_never_end_either_thread(tmp_path):
    """Thread B waits inside torch's loop over the global optimizer hooks (a user's hook holds it
    there) while thread A's session starts, records and ends. Removing A's hook then raised
    `RuntimeError: OrderedDict mutated during iteration` out of B's `optimizer.step()`."""
    a_started, a_ended = threading.Event(), threading.Event()

    def user_hook(optimizer, args, kwargs):  # a user's own global hook, registered before any session
        if threading.current_thread().name == "b" and not a_ended.is_set():
            a_ended.wait(timeout=60)

    results: dict[str, object] = {}

    def thread_a():
        model, optimizer = model_and_optimizer(1)
        with trainprof.session(log_dir=tmp_path, run_name="a", wait=1, warmup=1, active=2, **FAST) as sess:
            a_started.set()
            results["a_done"] = train(model, optimizer, 8)
        a_ended.set()
        results["a"] = sess

    def thread_b():
        model, optimizer = model_and_optimizer(2)
        a_started.wait(timeout=60)
        with trainprof.session(log_dir=tmp_path, run_name="b", **FAST) as sess:
            results["b_done"] = train(model, optimizer, 8)
        results["b"] = sess

    def run(target):
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - the thread's death is what is checked
            results[f"{threading.current_thread().name}_error"] = error
            a_ended.set()
            a_started.set()

    handle = register_optimizer_step_post_hook(user_hook)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            threads = [threading.Thread(target=run, args=(target,), name=name)
                       for target, name in ((thread_a, "a"), (thread_b, "b"))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
    finally:
        handle.remove()
    assert "a_error" not in results and "b_error" not in results, results
    assert results["a_done"] == 8 and results["b_done"] == 8
    a, b = results["a"], results["b"]
    assert a.steps_ended == 8  # its own thread's steps only, not B's
    assert [s.times.number for s in a.analysis.steps] == [2, 3]
    assert b.summary.verdict == "not-profiled" and "another trainprof session" in b.summary.reason
    messages = trainprof_warnings(caught)
    assert len(messages) == 1 and "another trainprof session" in messages[0]
    assert not torch.autograd._profiler_enabled()


def test_the_step_hook_is_installed_once_and_inert_outside_a_session(tmp_path):
    model, optimizer = model_and_optimizer()
    for run in ("one", "two"):
        with trainprof.session(log_dir=tmp_path, run_name=run, wait=0, warmup=1, active=1, analyze=False,
                               **FAST):
            train(model, optimizer, 3)
    import torch.optim.optimizer as torch_optimizer

    ours = [h for h in torch_optimizer._global_optimizer_post_hooks.values()
            if h is session_module._dispatch_optimizer_step]
    assert len(ours) == 1 and session_module.hooks._ACTIVE is None
    train(model, optimizer, 2)  # outside a session the hook does nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]


# -- 2. a closed stdout --------------------------------------------------------------------------------


def test_a_closed_stdout_leaves_the_users_program_and_exit_status_alone(tmp_path):
    """`python train.py | head`: rich's SystemExit(1) on the broken pipe left the session's __exit__;
    the checkpoint after the loop was never saved and the exit status was 1."""
    script = _script(f"""
        import torch, trainprof
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with trainprof.session(log_dir={str(tmp_path)!r}, run_name="run", wait=0, warmup=1, active=1,
                               tensorboard_scalars=False):
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        torch.save(model.state_dict(), {str(tmp_path / "checkpoint.pt")!r})
    """, tmp_path)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=_env(), cwd=tmp_path)
    process.stdout.close()  # `| true`: nobody reads
    _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err.decode()[-2000:]
    assert (tmp_path / "checkpoint.pt").is_file()
    assert (tmp_path / "run" / "summary.json").is_file()
    assert b"Traceback" not in err


def test_stop_never_lets_a_systemexit_of_its_own_out(tmp_path, monkeypatch):
    import trainprof.report.console as console

    def closed(*args, **kwargs):
        raise SystemExit(1)  # what rich raises on a broken pipe

    monkeypatch.setattr(console, "print_report", closed)
    monkeypatch.setattr(console, "print_written", closed)
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1,
                           tensorboard_scalars=False) as sess:
        train(model, optimizer, 3)
    assert sess.summary.verdict == "cpu-only" and (tmp_path / "run" / "summary.json").is_file()


# -- 3. -W error with MarkupSafe loaded ----------------------------------------------------------------


def test_warnings_as_errors_with_markupsafe_loaded_still_profile(tmp_path):
    """The code layout read `module.__version__` of every library; MarkupSafe 3 warns on that, and
    under -W error the warning failed the recorded step: the run was `not-profiled`."""
    pytest.importorskip("markupsafe")
    script = _script(f"""
        import json, markupsafe, torch, trainprof
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with trainprof.session(log_dir={str(tmp_path)!r}, run_name="run", wait=0, warmup=1, active=2,
                               console=False, tensorboard_scalars=False) as sess:
            for _ in range(4):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        print("VERDICT", sess.summary.verdict)
        sites = json.load(open(sess.run_dir / (sess.worker + ".syncsites.json")))
        print("VERSION", sites["code_layout"]["versions"].get("markupsafe"))
    """, tmp_path)
    result = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True, text=True,
                            env=_env(), cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "VERDICT cpu-only" in result.stdout, result.stdout + result.stderr[-2000:]
    assert f"VERSION {importlib.metadata.version('markupsafe')}" in result.stdout
    assert "DeprecationWarning" not in result.stderr


# -- 4. re-analysis agrees with the session ------------------------------------------------------------


def test_reanalysing_a_short_loop_agrees_with_the_session(tmp_path, capsys):
    """The loop ends inside the recorded window: the session drops the step that never ended; the
    trace on disk kept it, so `trainprof analyze <run dir>` showed a phantom step."""
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=3, **FAST) as sess:
        train(model, optimizer, 4)  # steps 2 and 3 recorded; step 4 starts and never ends
    assert [s.times.number for s in sess.analysis.steps] == [2, 3]
    again = analyze(str(tmp_path / "run"))
    assert [s.times.number for s in again.steps] == [2, 3]
    assert again.summary.mean_step_ms == pytest.approx(sess.summary.mean_step_ms, rel=1e-9)
    assert cli_main(["analyze", str(tmp_path / "run"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in printed["steps"]] == [2, 3]


def test_a_window_whose_only_step_never_ended_is_not_a_trace_to_analyse(tmp_path, capsys):
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning, match="before a recorded step ended"):
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=3, **FAST) as sess:
            train(model, optimizer, 2)  # step 2 starts recording and never ends
    assert sess.summary.verdict == "not-profiled" and len(sess.trace_files) == 1
    assert cli_main(["analyze", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no step that ended" in err


# -- 5. Ctrl-C during the export -----------------------------------------------------------------------


def test_ctrl_c_during_the_export_leaves_no_cut_trace(tmp_path, monkeypatch):
    """SIGINT arrives while torch writes the gzip: the cut file was left (clean-up ran on Exception
    only), and the run folder then failed `trainprof analyze`."""
    def interrupted_export(profiler, path):
        Path(path).write_bytes(b'{"traceEvents": [{"name": "x"' * 50)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to this (the main) thread
        raise AssertionError("SIGINT should have interrupted the export")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", interrupted_export)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test runner may ignore it
    model, optimizer = model_and_optimizer()
    done = [0]
    with pytest.raises(KeyboardInterrupt):
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, **FAST) as sess:
            for _ in range(4):
                done[0] += train(model, optimizer, 1)
    signal.signal(signal.SIGINT, previous)
    assert done[0] == 1  # the interrupt comes out of the second step's optimizer.step(), which exports
    assert not list((tmp_path / "run").glob("*.pt.trace.json*"))
    assert not list((tmp_path / "run").glob(".*"))  # the private export folder went too
    assert sess.summary.verdict == "not-profiled" and not torch.autograd._profiler_enabled()


def test_sigkill_during_the_export_leaves_nothing_in_tmpdir_and_no_cut_trace(tmp_path):
    """SIGKILL while torch wrote a window's JSON left it in $TMPDIR (132 MB for a large window), and a
    cut trace in the run folder (issue #33). The process is killed right after Kineto wrote the
    second window's JSON."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    script = _script(f"""
        import os, signal, torch, trainprof
        real = torch.autograd.profiler.profile.export_chrome_trace
        exported = []
        def export_then_die(self, path, *args, **kwargs):
            real(self, path, *args, **kwargs)
            exported.append(path)
            if len(exported) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        torch.autograd.profiler.profile.export_chrome_trace = export_then_die
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with trainprof.session(log_dir={str(tmp_path)!r}, run_name="run", wait=0, warmup=1, active=2,
                               repeat=2, console=False, tensorboard_scalars=False):
            for _ in range(8):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    """, tmp_path)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                            env={**_env(), "TMPDIR": str(tmpdir)})
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert not list(tmpdir.rglob("*.json*"))  # (torch's own torchinductor_<user> folder may be there)
    traces = list((tmp_path / "run").glob("*.pt.trace.json*"))
    assert len(traces) == 1  # the first window, whole; the second never appeared under a trace's name
    analysed = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(tmp_path / "run"), "--json"],
                              capture_output=True, text=True, timeout=240, env=_env(), cwd=ROOT)
    assert analysed.returncode == 0, analysed.stderr
    assert [step["step"] for step in json.loads(analysed.stdout)["steps"]] == [1, 2]


# -- 6. the smaller ones -------------------------------------------------------------------------------


def test_an_odd_rank_variable_warns_once(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "three")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = trainprof.session(log_dir=tmp_path, run_name="run")
    assert [m for m in trainprof_warnings(caught) if "ignoring RANK" in m] == [
        "trainprof: ignoring RANK='three': not a rank (a number); files are named without a rank"]
    assert sess.rank is None and not sess.worker.startswith("rank")


def test_the_users_showwarning_installed_in_a_window_stays(tmp_path):
    model, optimizer = model_and_optimizer()
    shown = []

    def users_showwarning(message, category, filename, lineno, file=None, line=None):
        shown.append(str(message))

    before = warnings.showwarning
    try:
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=2, analyze=False,
                               **FAST):
            train(model, optimizer, 2)  # inside the recorded window: the capture's hook is installed
            warnings.showwarning = users_showwarning
            train(model, optimizer, 3)
        assert warnings.showwarning is users_showwarning
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("from the user", stacklevel=1)
        assert shown == ["from the user"]
    finally:
        warnings.showwarning = before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_inside_a_window_records_nothing(tmp_path):
    """The child's optimizer steps and its exit from the `with` block drove the parent's profiler
    copy: it wrote traces under the parent's pid. (The child here ends with os._exit, as
    multiprocessing's children do; one that ends through the interpreter's shutdown:
    tests/test_user_loops.py.)"""
    script = _script(f"""
        import os, sys, torch, trainprof
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def train(n):
            for _ in range(n):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        with trainprof.session(log_dir={str(tmp_path)!r}, run_name="run", wait=0, warmup=1, active=3,
                               console=False, tensorboard_scalars=False) as sess:
            train(2)  # inside the recorded window
            child = os.fork()
            if child == 0:
                train(3)  # the child trains past the window's end, then leaves the session
            else:
                _, status = os.waitpid(child, 0)
                train(3)
        if child == 0:
            print("CHILD", sess.summary.verdict, sess.windows_written, flush=True)
            os._exit(0)
        print("CHILD STATUS", os.waitstatus_to_exitcode(status))
        print("PARENT", sess.summary.verdict, os.getpid(), [p.name for p in sess.trace_files])
    """, tmp_path)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(),
                            cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "CHILD not-profiled 0" in result.stdout and "CHILD STATUS 0" in result.stdout, result.stdout
    parent = [line for line in result.stdout.splitlines() if line.startswith("PARENT")][0].split()
    assert parent[1] == "cpu-only"
    traces = sorted(p.name for p in (tmp_path / "run").glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and f"_{parent[2]}." in traces[0]  # the parent's window, under its pid


def test_a_log_dir_with_a_tilde_is_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir="~/log", run_name="run", wait=0, warmup=1, active=1, analyze=False,
                           **FAST) as sess:
        train(model, optimizer, 3)
    assert sess.run_dir == tmp_path / "home" / "log" / "run"
    assert len(list(sess.run_dir.glob("*.pt.trace.json.gz"))) == 1
    assert not (tmp_path / "~").exists()
