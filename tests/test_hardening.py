"""The fault matrix of issue #9 for the session, the reports and the install (docs/reliability.md).

Each test reproduces one way trainprof used to crash, lose or clobber a file, inject text, or say
nothing; each failed before its fix.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from training_loop import model_and_optimizer, train, trainprof_warnings

import trainprof
from trainprof.analysis.result import Analysis, Finding, Summary, Where
from trainprof.config import SessionConfig
from trainprof.report.console import print_report, render_text
from trainprof.report.json import write_json
from trainprof.report.markdown import render_markdown

session_module = importlib.import_module("trainprof.session")  # `trainprof.session` is the function
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}


def _run_python(code: str, *flags: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


# -- another profiler ------------------------------------------------------------------------------


def test_nested_sessions_step_aside_instead_of_crashing(tmp_path):
    """Two sessions at once crashed torch with SIGSEGV; the inner one now steps aside with a warning."""
    result = _run_python(f"""
        import warnings, torch, trainprof
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with trainprof.session(log_dir={str(tmp_path)!r}, run_name="outer", console=False,
                                   tensorboard_scalars=False) as outer:
                with trainprof.session(log_dir={str(tmp_path)!r}, run_name="inner", console=False,
                                       tensorboard_scalars=False):
                    for _ in range(8):
                        model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        print("WARNINGS", [str(w.message)[:60] for w in caught if "trainprof" in str(w.message)])
        print("OUTER", outer.summary.verdict, len(outer.trace_files))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OUTER cpu-only 1" in result.stdout
    assert result.stdout.count("another trainprof session") == 1


def test_user_profiler_inside_a_window_gets_the_events(tmp_path):
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning) as caught:
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=3, **FAST) as sess:
            train(model, optimizer, 2)  # inside the recorded window
            with torch.profiler.profile() as own:
                train(model, optimizer, 2)
            done = train(model, optimizer, 4)
    assert done == 4
    messages = trainprof_warnings(caught)
    assert len(messages) == 1 and "another torch profiler" in messages[0]
    assert len(own.events()) > 0  # the user's profiler recorded (it got nothing before)
    assert sess.summary.verdict == "not-profiled"
    assert not torch.autograd._profiler_enabled()


def test_user_profiler_around_a_session_keeps_recording(tmp_path):
    model, optimizer = model_and_optimizer()
    with torch.profiler.profile() as own:
        with pytest.warns(RuntimeWarning) as caught:
            with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
                done = train(model, optimizer, 6)
    assert done == 6
    assert len(trainprof_warnings(caught)) == 1 and "already running" in trainprof_warnings(caught)[0]
    assert len(own.events()) > 0  # it ended with 0 events when the session took over
    assert sess.trace_files == []


# -- warnings as errors ----------------------------------------------------------------------------


def test_warnings_as_errors_never_end_the_loop(tmp_path):
    """Under `python -W error`: warmup=0 trained 0 steps, an internal failure stopped at step 3."""
    result = _run_python(f"""
        import torch, trainprof
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def loop(sess_kwargs):
            done = 0
            with trainprof.session(log_dir={str(tmp_path)!r}, console=False, tensorboard_scalars=False,
                                   **sess_kwargs):
                for _ in range(8):
                    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
                    done += 1
            return done
        print("WARMUP0", loop(dict(wait=1, warmup=0, active=2)))
        def broken(*args, **kwargs):
            raise OSError(28, "No space left on device")
        torch.profiler.profile.export_chrome_trace = broken
        print("FAILURE", loop(dict(wait=1, warmup=1, active=1, repeat=2)))
    """, "-W", "error")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "WARMUP0 8" in result.stdout and "FAILURE 8" in result.stdout
    assert "No space left on device" in result.stderr  # said once, through logging
    assert "won't be using warmup" not in result.stderr


# -- files -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", ".", "a/b", "a\\b", "x\x00y", ""])
def test_run_name_cannot_leave_the_log_dir(name):
    with pytest.raises(ValueError, match="run_name"):
        SessionConfig(run_name=name)


def test_ranks_sharing_a_run_folder_keep_their_own_summary(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with trainprof.session(log_dir=tmp_path, run_name="shared", wait=0, warmup=1, active=1, **FAST):
            train(model, optimizer, 3)
    files = sorted(p.name for p in (tmp_path / "shared").iterdir() if not p.name.endswith(".gz"))
    assert [f for f in files if f.startswith(("summary", "report"))] == [
        "report.rank0.html", "report.rank0.md", "report.rank1.html", "report.rank1.md",
        "summary.rank0.json", "summary.rank1.json"]
    summary = json.loads((tmp_path / "shared" / "summary.rank1.json").read_text())
    assert summary["trace"]["traces"][0]["rank"] == 1


def test_full_disk_leaves_the_old_summary_whole(tmp_path):
    """A write that fails half way (here: a file size limit, as a full disk) must not truncate."""
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')
    findings = [Finding("sync_point", f"finding {i}", "low", None, Where(), 1, 1.0, 1.0, None)
                for i in range(2000)]
    big = Analysis(summary=Summary(verdict="gpu-bound"), findings=findings)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError):
            write_json(big, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary file left


@pytest.mark.parametrize("failure", ["raises_midway", "empty_trace"])
def test_failed_export_leaves_no_trace_file(tmp_path, monkeypatch, failure):
    """A failed export left a truncated trace; a full TMPDIR left a 63-byte 'trace'."""

    def export(profiler, path):
        if failure == "raises_midway":
            Path(path).write_bytes(b'{"traceEvents": [{"name": "x"')
            raise OSError(28, "No space left on device")
        Path(path).write_bytes(b"")  # what Kineto leaves when the disk is full

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", export)
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning) as caught:
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, **FAST):
            assert train(model, optimizer, 4) == 4
    assert len(trainprof_warnings(caught)) == 1
    assert not list((tmp_path / "run").glob("*.pt.trace.json.gz"))
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not list((tmp_path / "run").glob(".*"))  # no private export folder, no temporary file


@pytest.mark.parametrize("value", ["²", "1" * 5000, "three"])
def test_bad_rank_variable_is_ignored_with_a_warning(tmp_path, monkeypatch, value):
    monkeypatch.setenv("RANK", value)
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning, match="ignoring RANK"):
        sess = trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1,
                                 analyze=False, **FAST)
    with sess:
        train(model, optimizer, 3)
    assert not sess.worker.startswith("rank") and len(sess.trace_files) == 1


# -- what is reported ------------------------------------------------------------------------------


def test_a_loop_shorter_than_the_window_reports_only_steps_that_ran(tmp_path):
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=3, **FAST) as sess:
        train(model, optimizer, 4)  # steps 2 and 3 recorded; step 4 starts and never ends
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [2, 3]
    mean = sum(s["duration_ms"] for s in steps) / 2
    assert sess.summary.mean_step_ms == pytest.approx(mean, rel=1e-3)


def test_analysis_runs_at_exit_not_inside_the_loop(tmp_path, monkeypatch):
    import trainprof.analysis as analysis_module

    real = analysis_module.analyze
    calls = []
    inside_loop = [True]

    def counting(*args, **kwargs):
        calls.append(inside_loop[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis_module, "analyze", counting)
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, repeat=2, **FAST):
        train(model, optimizer, 5)
        inside_loop[0] = False
    assert calls == [False]  # once, after the loop; it ran at each window's end inside optimizer.step()


def test_repeat_zero_keeps_memory_bounded(tmp_path):
    model, optimizer = model_and_optimizer()
    windows = session_module.MAX_WINDOWS + 3
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, repeat=0,
                           **FAST) as sess:
        train(model, optimizer, 2 * windows)
    assert sess.windows_written == windows
    assert len(sess.trace_files) == session_module.MAX_WINDOWS
    assert len({s.times.number for s in sess.analysis.steps}) == session_module.MAX_WINDOWS


def test_a_loop_without_steps_says_what_happened(tmp_path):
    model, _ = model_and_optimizer()
    with pytest.warns(RuntimeWarning, match=r"sess\.step\(\)") as caught:
        with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
            for _ in range(6):
                model(torch.randn(16, 32)).sum().backward()  # no optimizer.step(), no sess.step()
    assert len(trainprof_warnings(caught)) == 1
    assert sess.summary.verdict == "not-profiled" and "optimizer.step()" in sess.summary.reason


def test_a_loop_ending_before_the_window_says_so(tmp_path):
    model, optimizer = model_and_optimizer()
    with pytest.warns(RuntimeWarning, match="ended after 2 step"):
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=2, warmup=1, active=1, **FAST) as sess:
            train(model, optimizer, 2)
    assert sess.summary.verdict == "not-profiled"


def test_python_api_returns_plain_numbers(tmp_path):
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=2, **FAST) as sess:
        train(model, optimizer, 4)
    analysis = trainprof.analyze(str(sess.trace_files[0]))

    def numpy_values(value, path="") -> list[str]:
        if path.endswith((".pieces", ".views")):  # bulk data for drawing (idle runs, report views): arrays
            return []
        fields = getattr(type(value), "__struct_fields__", None)  # the result's records
        if fields is not None:
            return [p for name in fields for p in numpy_values(getattr(value, name), f"{path}.{name}")]
        if isinstance(value, dict):
            return [p for key, item in value.items() for p in numpy_values(item, f"{path}.{key}")]
        if isinstance(value, (list, tuple)):
            return [p for i, item in enumerate(value) for p in numpy_values(item, f"{path}[{i}]")]
        return [path] if type(value).__module__ == "numpy" else []

    assert numpy_values(analysis) == [] and numpy_values(analysis.to_dict()) == []
    assert numpy_values(sess.summary) == [] and numpy_values(sess.findings) == []
    assert type(analysis.summary.mean_step_ms) is float


# -- NVTX ------------------------------------------------------------------------------------------


def test_nvtx_ranges_per_phase_and_step(tmp_path, monkeypatch):
    """With CUDA the session marks each phase and step; faked here (NVTX raises on a CPU build)."""
    events = []

    class FakeNvtx:
        @staticmethod
        def range_push(name):
            events.append(("push", name))

        @staticmethod
        def range_pop():
            events.append(("pop",))

    real_nvtx_module = session_module.lifecycle._nvtx_module  # the session starts NVTX there
    monkeypatch.setattr(session_module.lifecycle, "_nvtx_module", lambda: FakeNvtx)
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2, analyze=False,
                           **FAST):
        train(model, optimizer, 4)
    pushes = [e[1] for e in events if e[0] == "push"]
    assert pushes == ["trainprof wait", "trainprof step 0", "trainprof warmup", "trainprof step 1",
                      "trainprof record", "trainprof step 2", "trainprof step 3",
                      "trainprof wait", "trainprof step 4"]
    assert len(pushes) == len([e for e in events if e[0] == "pop"])  # every range closed
    if not torch.cuda.is_available():
        assert real_nvtx_module() is None


# -- names and messages ----------------------------------------------------------------------------


def test_default_run_names_never_collide(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt, *a: "run-20261122-050000")  # the same second
    model, optimizer = model_and_optimizer()
    dirs = []
    for _ in range(2):
        with trainprof.session(log_dir=tmp_path, wait=0, warmup=1, active=1, analyze=False, **FAST) as sess:
            train(model, optimizer, 3)
        dirs.append(sess.run_dir)
    assert [d.name for d in dirs] == ["run-20261122-050000", "run-20261122-050000-2"]
    assert all(len(list(d.glob("*.pt.trace.json.gz"))) == 1 for d in dirs)


def test_session_says_where_its_files_went(tmp_path, capsys):
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1,
                           tensorboard_scalars=False) as sess:
        train(model, optimizer, 3)
    out = capsys.readouterr().out
    assert f"trainprof: wrote {sess.run_dir}/" in out and "summary.json" in out and "report.md" in out


# -- text from traces ------------------------------------------------------------------------------

HOSTILE = Analysis(
    summary=Summary(verdict="sync-bound", mean_step_ms=41.25),
    files=["/runs/a/w.1.pt.trace.json.gz"],
    findings=[
        Finding(kind="sync_point", severity="high", rank=0,
                title="\x1b]0;owned\x07sync in \x1b[2Jgemm[/x] [link=https://evil.example]click[/link]\r",
                op="<script>alert(1)</script>",
                where=Where("/x/<img src=x onerror=alert(1)>.py", 3, "f[bold]"),
                count=1, per_step=1.0, cost_ms=1.0, fix="[see](javascript:alert(1)) *now*"),
        Finding(kind="sync_point", severity="low", rank=1, title="plain", op=None, where=Where(), count=1,
                per_step=1.0, cost_ms=0.5, fix=None),
    ],
)


def test_console_shows_trace_names_as_text_without_escape_sequences():
    out = io.StringIO()
    print_report(HOSTILE, file=out, width=160)  # rich raised MarkupError on `gemm[/x]`
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "gemm[/x]" in text and "[link=https://evil.example]click[/link]" in text and "f[bold]" in text
    assert "rank 1" in text  # findings from two ranks show whose they are
    assert "\x1b" not in render_text(HOSTILE)


def test_markdown_report_escapes_html_and_links():
    text = render_markdown(HOSTILE)
    assert "<script>" not in text and "<img" not in text and "\r" not in text and "\x1b" not in text
    assert "&lt;script&gt;" in text
    assert not re.search(r"(?<!\\)\]\(", text) and "\\[see\\](javascript:" in text  # no link forms
    assert "| rank |" in text


def test_console_wraps_at_words_on_80_columns():
    words = [f"word{i:02d}" for i in range(40)]
    finding = Finding(kind="launch_overhead", severity="medium", title=" ".join(words), op="aten::mm",
                      where=Where(), count=1, per_step=1.0, cost_ms=2.0, fix="fix " + " ".join(words))
    analysis = Analysis(summary=Summary(verdict="launch-bound"), findings=[finding])
    out = io.StringIO()
    print_report(analysis, file=out, width=80)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    tokens = out.getvalue().split()
    assert all(tokens.count(word) == 2 for word in words)  # title and fix whole, no word broken
    assert "…" not in out.getvalue()


# -- command line ----------------------------------------------------------------------------------


def test_version_flag(capsys):
    from trainprof.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainprof {trainprof.__version__}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_demo_on_cuda_without_a_gpu_is_one_line(capsys):
    from trainprof.cli import main

    assert main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1 and "CUDA" in err


def test_demo_without_the_hf_extra_is_one_line(capsys, monkeypatch):
    from trainprof.cli import main

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    assert main(["demo", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1 and "trainprof[hf]" in err


# -- install ---------------------------------------------------------------------------------------


def test_plain_install_analyses_without_torch():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = [re.split(r"[<>=;\[ ]", dep)[0] for dep in project["dependencies"]]
    assert "torch" not in base and "triton" not in base
    extras = project["optional-dependencies"]
    assert any(dep.startswith("torch") for dep in extras["train"])
    assert "train" in extras["all"][0]  # `make test` installs .[all,dev]: everything


def test_analysis_runs_where_torch_cannot_be_imported(tmp_path):
    model, optimizer = model_and_optimizer()
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, analyze=False,
                           **FAST) as sess:
        train(model, optimizer, 3)
    result = _run_python(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch fails
        from trainprof.cli import main
        sys.exit(main(["analyze", {str(sess.trace_files[0])!r}, "--json"]))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["trace"]["summary"]["verdict"] == "cpu-only"


@pytest.mark.parametrize("interpret", ["0", "1"])
def test_fused_layers_without_triton_swap_and_train_with_torch(interpret):
    # macOS and Windows have no triton (a Linux-only dependency): `import fused_layers` used to fail.
    result = _run_python(f"""
        import os, sys, warnings
        os.environ["TRITON_INTERPRET"] = "{interpret}"
        sys.modules["triton"] = None  # any import of triton fails
        import torch
        import fused_layers
        from fused_layers.backends.triton import language, launch
        assert not language.AVAILABLE and not launch.INTERPRETING
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 1))
        model = torch.nn.Sequential(*[layer for layer in plain])  # the same parameters
        x = torch.randn(4, 16)
        expected = plain(x).sum()
        expected.backward()
        grads = [p.grad.clone() for p in plain.parameters()]
        plain.zero_grad()
        record = fused_layers.swap(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(x).sum()
            out.backward()
            fused_layers.rms_norm(x, torch.ones(16)), fused_layers.swiglu(x, x)
        assert sorted(type(m).__name__ for m in model) == ["FusedGELU", "FusedLayerNorm", "Linear", "Linear"]
        torch.testing.assert_close(out, expected)
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, g)
        messages = [str(w.message) for w in caught if "fused_layers" in str(w.message)]
        assert len(messages) == 1 and "Triton is not installed" in messages[0], messages
        fused_layers.unswap(model, record)
        assert [type(m).__name__ for m in model] == ["Linear", "LayerNorm", "GELU", "Linear"]
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")


def test_make_honours_a_new_torch_spec_when_the_venv_exists(tmp_path):
    """An existing venv whose python only logs its arguments: what would `make` install?"""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    fake_python = venv / "bin" / "python"
    fake_python.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n")
    fake_python.chmod(0o755)

    def make(spec: str) -> str:
        log.write_text("")
        result = subprocess.run(["make", "-C", str(ROOT), f"VENV={venv}", f"TORCH_SPEC={spec}",
                                 str(venv / ".installed")], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return log.read_text()

    assert "install -q torch==2.13.0" in make("torch==2.13.0")  # first install
    assert make("torch==2.13.0") == ""  # up to date: nothing runs
    assert "install -q torch==2.11.0" in make("torch==2.11.0")  # it was ignored once .venv existed


def test_warnings_module_state_is_restored():
    assert not [f for f in warnings.filters if f[1] is not None and "Profiler clears" in f[1].pattern]
