"""The session around real small CPU loops: schedule, step detection, outputs, robustness."""

from __future__ import annotations

import gzip
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.optim.optimizer as torch_optimizer

import trainprof
from trainprof.capture.syncs import SYNC_WARNING_RE
from trainprof.config import SessionConfig
from trainprof.session import Session, worker_name

session_module = importlib.import_module("trainprof.session")  # `trainprof.session` is the function

FAST = {"console": False, "tensorboard_scalars": False}  # outputs not under test stay off


def test_trainprof_session_is_the_function_whoever_imports_the_module_first():
    """The package imports the session on first use; the submodule imported first (as an
    integration does) must not take the name `trainprof.session` from the function."""
    code = ("import importlib, sys, trainprof; assert 'trainprof.session' not in sys.modules; "
            "module = importlib.import_module('trainprof.session'); "
            "assert trainprof.session is module.session and trainprof.Session is module.Session; "
            "from trainprof import session; assert session is module.session")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _forward_backward(model) -> torch.Tensor:
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    return loss


def _profiler_steps(trace_file: Path) -> list[int]:
    with gzip.open(trace_file, "rt") as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name", "") for e in events}
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"ProfilerStep#(\d+)", n)))


def _assert_clean_exit() -> None:
    # One step hook per process, installed once and never removed (removing it could raise in another
    # thread's optimizer.step()); inert outside a session.
    hooks = list(torch_optimizer._global_optimizer_post_hooks.values())
    assert hooks == [session_module._dispatch_optimizer_step] and session_module.hooks._ACTIVE is None
    assert not torch.autograd._profiler_enabled()
    assert warnings.showwarning is _ORIGINAL_SHOWWARNING
    assert not getattr(torch.cuda.synchronize, "__wrapped__", None)
    assert not [f for f in warnings.filters if f[1] is not None and "Profiler clears events" in f[1].pattern]


_ORIGINAL_SHOWWARNING = warnings.showwarning


def test_optimizer_loop_is_profiled_without_step_calls(tmp_path):
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2, **FAST) as sess:
        for _ in range(6):
            loss = _forward_backward(model)
            optimizer.step()
            optimizer.zero_grad()
            loss.item()

    run_dir = tmp_path / "run"
    traces = sorted(run_dir.glob("*.pt.trace.json.gz"))
    assert [t.name for t in traces] == [t.name for t in sess.trace_files] and len(traces) == 1
    assert _profiler_steps(traces[0]) == [2, 3] == SessionConfig(wait=1, warmup=1, active=2).recorded_steps()
    assert sess.steps_ended == 6
    assert (run_dir / f"{sess.worker}.syncsites.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= {"trace", "steps", "findings"}
    assert summary == json.loads(trainprof.report.json.dumps(sess.analysis.to_dict()))
    assert [s["step"] for s in summary["steps"]] == [2, 3]
    assert (run_dir / "report.md").read_text().startswith("# trainprof report")
    assert sess.findings and sess.summary
    # A CPU loop launches no GPU work: the verdict says so and the finding ranks the host ops.
    assert sess.summary.verdict == "cpu-only"
    cpu_only = [f for f in sess.findings if f.kind == "cpu_only"]
    assert len(cpu_only) == 1 and cpu_only[0].details.top_host_ops
    assert not [f for f in sess.findings if f.kind in ("launch_overhead", "host_bound")]
    _assert_clean_exit()


def test_repeated_windows_each_traced_and_analysed_together(tmp_path):
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=1, repeat=2,
                           **FAST) as sess:
        for _ in range(8):
            _forward_backward(model)
            optimizer.step()
            optimizer.zero_grad()

    traces = sorted((tmp_path / "run").glob("*.pt.trace.json.gz"))
    assert len(traces) == 2 == len(sess.trace_files)
    assert sorted(_profiler_steps(t)[0] for t in traces) == [2, 5]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert sorted(s["step"] for s in summary["steps"]) == [2, 5]  # both windows, one analysis
    _assert_clean_exit()


def test_tensorboard_scalars_and_console(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1):
        for _ in range(3):
            _forward_backward(model)
            optimizer.step()
            optimizer.zero_grad()
    assert list((tmp_path / "run").glob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert "trainprof" in out and ("Top findings" in out or "No findings" in out)


def test_manual_steps_without_optimizer(tmp_path):
    model, _ = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2,
                           analyze=False) as sess:
        for _ in range(5):
            with torch.no_grad():
                model(torch.randn(16, 32))
            sess.step()
    assert sess.steps_ended == 5
    assert _profiler_steps(sess.trace_files[0]) == [2, 3]


@pytest.mark.parametrize("order", ["optimizer_first", "session_first"])
def test_optimizer_and_manual_step_count_each_step_once(tmp_path, order):
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2,
                           analyze=False) as sess:
        for _ in range(5):
            _forward_backward(model)
            if order == "optimizer_first":
                optimizer.step()
                sess.step()
            else:
                sess.step()
                optimizer.step()
            optimizer.zero_grad()
    assert sess.steps_ended == 5
    assert _profiler_steps(sess.trace_files[0]) == [2, 3]
    _assert_clean_exit()


def test_sync_sites_captured_during_recorded_steps_only(tmp_path):
    """The implicit-sync path without CUDA: the warning sync debug mode would emit, raised by hand."""
    model, optimizer = _model_and_optimizer()
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # outside the recorded steps nothing is captured nor shown
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2,
                               analyze=False) as sess:
            for _ in range(5):
                _forward_backward(model)
                lines.append(_line_of_next_statement())
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
                optimizer.step()
                optimizer.zero_grad()
    sites = json.loads((tmp_path / "run" / f"{sess.worker}.syncsites.json").read_text())
    assert sites["worker"] == sess.worker and sites["version"] == 2
    assert [(s["step"], s["call"], s["line"]) for s in sites["sites"]] == [
        (2, "implicit", lines[2]), (3, "implicit", lines[3])]
    site = sites["sites"][0]
    assert site["file"] == __file__
    assert site["function"] == "test_sync_sites_captured_during_recorded_steps_only"
    assert site["stack"][-1]["file"] == __file__ and site["stack"][-1]["line"] == lines[2]


def _line_of_next_statement() -> int:
    import sys

    return sys._getframe(1).f_lineno + 1


@pytest.mark.parametrize("where", ["export", "analysis"])
def test_failure_inside_trainprof_warns_once_and_training_goes_on(tmp_path, monkeypatch, where):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "export":
        monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken)
    else:
        monkeypatch.setattr(importlib.import_module("trainprof.analysis"), "analyze", broken)
    model, optimizer = _model_and_optimizer()
    done = 0
    with pytest.warns(RuntimeWarning, match="trainprof") as caught:
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=1,
                               repeat=2, **FAST) as sess:
            for _ in range(8):
                _forward_backward(model)
                optimizer.step()
                optimizer.zero_grad()
                done += 1
    assert done == 8
    assert len([w for w in caught if "trainprof" in str(w.message)]) == 1
    # An export fails inside the step that ends the first window; the analysis runs at exit only.
    assert sess.steps_ended == (3 if where == "export" else 8)
    assert not (tmp_path / "run" / "summary.json").exists()
    assert sess.summary.verdict == "not-profiled" and "No space left" in sess.summary.reason
    _assert_clean_exit()


def test_user_exception_propagates_and_hooks_are_removed(tmp_path):
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ValueError, match="bad batch"):
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=3, **FAST):
            for step in range(6):
                _forward_backward(model)
                optimizer.step()
                optimizer.zero_grad()
                if step == 2:  # inside the recorded window: capture hooks are installed
                    assert warnings.showwarning is not _ORIGINAL_SHOWWARNING
                    raise ValueError("bad batch")
    _assert_clean_exit()
    assert not any(SYNC_WARNING_RE.pattern in str(f[1] and f[1].pattern) for f in warnings.filters)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_worker_name_carries_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert re.fullmatch(r"rank3_[A-Za-z0-9-]+_\d+", worker_name())
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1,
                           analyze=False) as sess:
        for _ in range(3):
            _forward_backward(model)
            optimizer.step()
    assert sess.trace_files[0].name.startswith(sess.worker + ".") and sess.worker.startswith("rank3_")
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert worker_name().startswith("rank1_")
    monkeypatch.delenv("LOCAL_RANK")
    assert "rank" not in worker_name().split("_")[0] or not worker_name().startswith("rank")


@pytest.mark.parametrize(
    "options, message",
    [({"active": 0}, "active"), ({"wait": -1}, "wait"), ({"repeat": 1.5}, "repeat"),
     ({"run_name": "a/b"}, "run_name")],
)
def test_config_is_checked_once(options, message):
    with pytest.raises(ValueError, match=message):
        SessionConfig(**options)


def test_session_rejects_unknown_options():
    with pytest.raises(TypeError, match="bogus"):
        trainprof.session(bogus=1)


def test_default_run_name_is_timestamped():
    assert re.fullmatch(r"run-\d{8}-\d{6}", Session().run_dir.name)


def test_sync_capture_is_prepared_in_the_warmup_step_not_a_recorded_one(tmp_path, monkeypatch):
    """On the H200 (2026-11-23) the capture's first-use work (reading the code layout, installing
    hooks: ~1 ms) sat in the first recorded step and was reported as the user's host time."""
    from trainprof.capture import syncs

    events = []
    prepare, activate = syncs.SyncCapture.prepare, syncs.SyncCapture.activate

    def spy_prepare(self):
        events.append(("prepare", self.layout is not None))
        prepare(self)

    def spy_activate(self, step_num):
        events.append(("activate", self.layout is not None))
        activate(self, step_num)

    monkeypatch.setattr(syncs.SyncCapture, "prepare", spy_prepare)
    monkeypatch.setattr(syncs.SyncCapture, "activate", spy_activate)
    model, optimizer = _model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="r", wait=1, warmup=1, active=2, analyze=False, **FAST):
        for _ in range(5):
            _forward_backward(model)
            optimizer.step()
            optimizer.zero_grad()
    first_activate = next(i for i, e in enumerate(events) if e[0] == "activate")
    assert ("prepare", False) in events[:first_activate]  # the warm-up step read the layout
    assert events[first_activate] == ("activate", True)  # the recorded step found it done
