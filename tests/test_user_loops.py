"""The loop as users write it (issue #33): an optimizer built mid-run, several optimizers in one
iteration, names with quotes, `repeat=0` re-analysed, a forked child, a trace without host launches.
Each case failed before its fix."""

from __future__ import annotations

import gc
import gzip
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import trainprof
from trainprof.trace import load_traces

session_module = importlib.import_module("trainprof.session")
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _iteration(model, *optimizers) -> None:
    model(torch.randn(16, 32)).pow(2).mean().backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


# -- optimizers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("old_one", ["dropped", "kept"])
def test_an_optimizer_built_mid_run_counts_its_steps(tmp_path, old_one):
    """Stage-wise fine-tuning (a new optimizer per stage) was counted for 1 step of 10: only the
    first optimizer ever seen ended steps, and the report said "not-profiled"."""
    model = _model()
    kept = []
    with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
        for stage in range(2):
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3 * (stage + 1))
            if old_one == "kept":
                kept.append(optimizer)  # (a scheduler or a checkpoint callback holding on to it)
            for _ in range(5):
                _iteration(model, optimizer)
            del optimizer
            gc.collect()
    # A replaced optimizer that is gone ends no more steps: its successor's first step ends one. One
    # still alive may yet step again: the successor's first step joins the last one's iteration.
    assert sess.steps_ended == (10 if old_one == "dropped" else 9)
    assert sess.summary.verdict == "cpu-only" and len(sess.analysis.steps) == 3


def test_several_optimizers_in_one_iteration_count_it_once(tmp_path):
    """A GAN's generator and discriminator step in every iteration: one step each iteration."""
    model = _model()
    generator = torch.optim.SGD(model[0].parameters(), lr=1e-3)
    discriminator = torch.optim.SGD(model[2].parameters(), lr=1e-3)
    with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
        for _ in range(8):
            _iteration(model, generator, discriminator)
    assert sess.steps_ended == 8 and len(sess.analysis.steps) == 3


# -- names with quotes -----------------------------------------------------------------------------


_QUOTED_NAMES = """
    import json, torch, trainprof
    Odd = type('Odd"Block', (torch.nn.Linear,), {{}})  # a module class with a quote in its name
    model = torch.nn.Sequential(Odd(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    def forward(x):
        return model(x).pow(2).mean()
    forward.__code__ = forward.__code__.replace(co_name='forward"pass')  # a function's name with a quote
    with trainprof.session(log_dir={log!r}, run_name="run", console=False, tensorboard_scalars=False) as sess:
        for _ in range(6):
            with torch.profiler.record_function('phase "warm" "x"'):
                forward(torch.randn(16, 32)).backward()
            opt.step(); opt.zero_grad()
    print(json.dumps([sess.summary.verdict, sess.summary.reason, len(sess.analysis.steps)]))
"""


def test_names_with_quotes_still_give_a_report(tmp_path):
    """torch writes `"` in names unescaped (a record_function label, a module class, a file or
    function name): the trace was not JSON, and the session wrote no report ("writing the report
    failed"). The loader now escapes such quotes and reads the trace."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_QUOTED_NAMES.format(log=str(tmp_path))))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                            env=ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    verdict, reason, steps = json.loads(result.stdout.splitlines()[-1])
    assert (verdict, reason, steps) == ("cpu-only", None, 3)
    (trace,) = (tmp_path / "run").glob("*.pt.trace.json.gz")
    names = load_traces(trace)[0].names
    assert 'phase "warm" "x"' in names and any('Odd"Block' in name for name in names)
    assert any('forward"pass' in name for name in names)
    analysed = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(trace), "--json"],
                              capture_output=True, text=True, timeout=240, env=ENV, cwd=ROOT)
    assert analysed.returncode == 0, analysed.stderr
    assert len(json.loads(analysed.stdout)["steps"]) == 3


def test_the_quote_repair_leaves_valid_json_alone(fixtures_dir):
    """The repair's pattern matches nothing in JSON that is valid: every checked-in trace, and JSON
    with escaped quotes, empty strings and tight separators."""
    from trainprof.trace.load import _with_quotes_escaped

    quoted = {"a": ['x"y', "", '""', "\\\\", 'e\\"'], "b": {"c": 'd" e'}}
    samples = [json.dumps(quoted, separators=(",", ":")).encode(), json.dumps(quoted, indent=2).encode()]
    for sample in samples:
        assert _with_quotes_escaped(sample) is None, sample
    # The smaller traces (~28 MB/s of JSON scanned: the larger would cost seconds), torch's and others'.
    small = [path for path in sorted(fixtures_dir.rglob("*.json.gz"))
             if path.stat().st_size < SMALL_TRACE_BYTES]
    assert len(small) >= 8
    for path in small:
        assert _with_quotes_escaped(gzip.decompress(path.read_bytes())) is None, path


SMALL_TRACE_BYTES = 300_000


# -- repeat=0 --------------------------------------------------------------------------------------


def test_the_printed_command_analyses_what_the_session_analysed(tmp_path, capsys):
    """With `repeat=0` the session analyses its last `MAX_WINDOWS` windows, and printed
    `trainprof analyze <run>`, which analysed all of them (300 windows, mean step 1.371 ms, where
    the session said 1.016)."""
    from trainprof.cli import main

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    windows = session_module.MAX_WINDOWS + 3
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, repeat=0,
                           tensorboard_scalars=False) as sess:
        for _ in range(2 * windows):
            _iteration(model, optimizer)
    assert sess.windows_written == windows
    printed = capsys.readouterr().out
    command = printed.split("re-analyse: trainprof ")[1].splitlines()[0].split()
    assert command[-2:] == ["--windows", str(session_module.MAX_WINDOWS)]
    assert main([*command, "--json", "--quiet", "--debug"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [step["step"] for step in again["steps"]] == [step.times.number for step in sess.analysis.steps]
    assert again["trace"]["summary"]["mean_step_ms"] == pytest.approx(sess.summary.mean_step_ms)


# -- a forked child --------------------------------------------------------------------------------


_FORKS = """
    import os, sys, time, torch, trainprof
    model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def fork(label, end):
        child = os.fork()
        if child == 0:  # the child ends through the interpreter's shutdown, as plain code does
            print("hello from", label)
            if end == "raise":
                raise RuntimeError("the child's own error")
            sys.exit(end)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                return print(label, "exit", os.waitstatus_to_exitcode(status), flush=True)
            time.sleep(0.05)
        os.kill(child, 9)
        os.waitpid(child, 0)
        print(label, "HUNG", flush=True)

    with trainprof.session(log_dir={log!r}, run_name="run", wait=0, warmup=1, active=3, console=False,
                           tensorboard_scalars=False) as sess:
        for step in range(6):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
            if step == 1:
                fork("inside", 3)
    fork("after", 0)
    fork("raising", "raise")
    print("parent", sess.summary.verdict, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's on_exit")
def test_a_forked_child_exits_with_its_own_status(tmp_path):
    """A child forked inside a window, or after the session, hung forever at exit in Kineto's
    ConfigLoader destructor when it ended through the interpreter's shutdown."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_FORKS.format(log=str(tmp_path))))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                            env=ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for label, code in (("inside", 3), ("after", 0), ("raising", 1)):
        assert f"{label} exit {code}" in lines and f"hello from {label}" in lines, result.stdout
    assert "parent cpu-only" in lines
    assert "RuntimeError: the child's own error" in result.stderr  # its traceback, as Python prints it
    assert len(list((tmp_path / "run").glob("*.pt.trace.json.gz"))) == 1  # the parent's window only


# -- a trace without host launches -----------------------------------------------------------------


def _kernel(name: str, ts: float, dur: float, correlation: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "device": 0, "stream": 7}}


@pytest.mark.parametrize("launches", ["none", "the gemm's only"])
def test_a_collective_kernel_without_its_host_launch(tmp_path, capsys, launches):
    """A CUDA-only trace (GPU activities only): `analysis/collectives.py` raised IndexError."""
    from trainprof.cli import main

    events = []
    for step in range(4):  # the collective's ids after the launches': not queued before the trace
        at = 1000.0 * step
        events.append(_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                              at + 10, 300, 300 + step))
        events.append(_kernel("sm90_xmma_gemm_bf16bf16_bf16f32", at + 400, 200, 200 + step))
        if launches != "none":
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": at + 380, "dur": 5, "args": {"correlation": 200 + step}})
    path = tmp_path / "gpu_only.pt.trace.json"
    device = [{"id": 0, "name": "NVIDIA H200"}]
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": device}))
    assert main(["analyze", str(path), "--json", "--debug", "--quiet"]) == 0
    communication = json.loads(capsys.readouterr().out)["trace"]["traces"][0]["communication"]
    assert communication["collectives_per_step"] > 0 and communication["ops"][0]["op"] == "all_reduce"


def test_the_quote_repair_holds_one_copy_of_the_text():
    """Found by tests/test_fuzz_structured.py: a text where every quote looks stray (UTF-16 JSON,
    11.5 MB) made `re.sub` hold ~100 bytes per match, 239 MB at its peak. The repair now builds one
    buffer, and leaves a text with NUL bytes (not torch's JSON) alone."""
    import tracemalloc

    from trainprof.trace.load import _with_quotes_escaped

    assert _with_quotes_escaped('{"name": "a"b"}'.encode("utf-16")) is None
    text = b'{"traceEvents": [' + b",".join([b'{"name": "x"y"z"}'] * 200_000) + b"]}"
    tracemalloc.start()
    try:
        repaired = _with_quotes_escaped(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert repaired.count(b'\\"') == 400_000 and json.loads(repaired)["traceEvents"][0]["name"] == 'x"y"z'
    assert peak < 2.5 * len(text)


# -- Ctrl-C ----------------------------------------------------------------------------------------


_INTERRUPTED = """
    import os, signal, time, torch, trainprof
    from trainprof import session as _
    Session = __import__("trainprof.session", fromlist=["Session"]).Session
    model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def ctrl_c_inside(method):  # Ctrl-C arrives while the session runs `method`
        real = getattr(Session, method)
        def interrupted(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
            return real(self, *args, **kwargs)
        setattr(Session, method, interrupted)

    with trainprof.session(log_dir={log!r}, wait=0, warmup=1, active=2, console=False,
                           tensorboard_scalars=False):
        for step in range(6):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
            if {case!r} == "second" and step == 4:
                ctrl_c_inside("_shutdown")  # the second Ctrl-C, while the session stops
                raise KeyboardInterrupt  # the first, in the loop
        if {case!r} == "at exit":
            ctrl_c_inside("_finish")  # one Ctrl-C, while the session analyses after the loop
"""


@pytest.mark.parametrize("case", ["second", "at exit"])
def test_ctrl_c_while_the_session_stops_shows_the_users_traceback(tmp_path, case):
    """A second Ctrl-C (while the session stopped after the first) printed two tracebacks, the second
    through trainprof's frames; one during the analysis at exit printed trainprof's frames down to
    the analysis."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_INTERRUPTED.format(log=str(tmp_path), case=case)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                            env=ENV, cwd=tmp_path)
    assert result.returncode in (1, 130, -2), result.stderr[-2000:]  # KeyboardInterrupt, uncaught
    err = result.stderr
    assert err.count("Traceback") == 1 and "During handling" not in err, err
    assert err.rstrip().endswith("KeyboardInterrupt")
    inside = [line for line in err.splitlines() if "trainprof" in line and line.lstrip().startswith("File")]
    assert [line.rsplit(" in ", 1)[-1] for line in inside] == ([] if case == "second" else ["__exit__"]), err


def test_ctrl_c_under_trainprof_run_shows_the_scripts_frames(tmp_path):
    """Under `trainprof run`, Ctrl-C printed a traceback through trainprof's command line, runpy and
    the session; now the script's own frames, as `python script.py` shows them, and exit 130."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, signal, torch
        model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def train():
            for step in range(8):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
                if step == 4:
                    os.kill(os.getpid(), signal.SIGINT)
        train()
    """))
    command = [sys.executable, "-m", "trainprof", "run", "--log-dir", str(tmp_path), str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=ENV, cwd=tmp_path)
    assert result.returncode == 130, result.stderr[-2000:]
    files = [line.split('"')[1] for line in result.stderr.splitlines() if line.lstrip().startswith('File "')]
    assert files == [str(script), str(script)], result.stderr  # <module>, then train()
    assert result.stderr.rstrip().endswith("KeyboardInterrupt")
