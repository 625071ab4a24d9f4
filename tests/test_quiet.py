"""What reaches the user's terminal besides the report: nothing of torch's profiler chatter, nothing
at all with `--quiet`, and one line (not a traceback) where an extra is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=240)


def test_torch_profiler_chatter_does_not_reach_stderr(tmp_path):
    """torch printed `USDT: ... profiler_start` / `profiler_stop` at every window and c10's
    `CPUAllocator.cpp ... Memory block of unknown size` once; the user's own stderr lines stay, in order."""
    result = _python("""
        import sys, torch, trainprof
        model = torch.nn.Linear(32, 32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with trainprof.session(log_dir="log", wait=1, warmup=1, active=2, repeat=2, console=False,
                               tensorboard_scalars=False):
            for step in range(10):
                model(torch.randn(8, 32)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                print(f"user {step}", file=sys.stderr)
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"user {step}" for step in range(10)]
    assert len(list((tmp_path / "log").glob("*/*.pt.trace.json.gz"))) == 2  # both windows recorded


def test_quiet_analyze_says_nothing_on_stderr(tmp_path, fixtures_dir):
    import shutil

    for run in ("run-1", "run-2"):
        shutil.copytree(fixtures_dir / "traces/gpt2_clean", tmp_path / run)

    def analyze(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(tmp_path), *flags],
                              capture_output=True, text=True, timeout=120)

    loud, quiet = analyze(), analyze("--quiet")
    assert loud.returncode == quiet.returncode == 0
    assert "holds 2 run(s)" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout


def test_commands_that_need_torch_say_which_extra(tmp_path):
    """In the analysis-only install, `trainprof demo` and `trainprof ab` ended in a ModuleNotFoundError
    traceback."""
    result = _python("""
        import sys
        sys.modules["torch"] = None  # as if not installed
        from trainprof.cli import main
        codes = [main(["demo", "--device", "cpu"]), main(["ab", "--device", "cpu", "--steps", "2"])]
        print(codes)
    """, tmp_path)
    assert result.stdout.strip() == "[2, 2]", result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("trainprof: error: ") for line in lines), result.stderr
    assert all("pip install 'trainprof[train]'" in line for line in lines)
    assert "Traceback" not in result.stderr


def test_stderr_filter_keeps_other_lines_and_restores_fd2(capfd):
    """Only torch's lines go; nested or concurrent use never leaves fd 2 redirected."""
    import threading

    from trainprof.capture.torch_noise import quiet_torch_stderr

    before = os.fstat(2)
    noise = (b"USDT:2026-11-25 07:15:22 15300:15300 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
             b"[W1125 07:15:22.316796374 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
             b"before the profiling started, profiler results will not include the deallocation event\n")
    with quiet_torch_stderr():
        os.write(2, b"mine 1\n" + noise)
        with quiet_torch_stderr():  # the redirection is held: the inner block runs unfiltered
            os.write(2, b"mine 2\n")
        other = threading.Thread(target=lambda: quiet_torch_stderr().__enter__())
        other.start()
        other.join()
        os.write(2, noise + b"mine 3\n")
    after = os.fstat(2)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    assert capfd.readouterr().err.splitlines() == ["mine 1", "mine 2", "mine 3"]


def test_quiet_run_silences_trainprofs_warnings_and_report(tmp_path):
    """`trainprof run --quiet`: a loop too short to record warns without it, and with it says nothing."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        print("trained")
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*flags: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "trainprof", "run", *flags, "--log-dir", "log", str(script)]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)

    loud, quiet = run(), run("--quiet")
    assert loud.returncode == quiet.returncode == 0
    assert "trainprof: the loop ended" in loud.stderr
    assert quiet.stderr == "" and quiet.stdout == "trained\n"


def test_the_allocators_warning_stays_off_through_a_long_run(tmp_path):
    """c10 prints "Memory block of unknown size" at every 1,000th free of a block allocated while
    memory profiling was off (a counter): once per ~1,000 steps of a long run it reached stderr
    between windows (issue #33). Here each recorded step frees 300 blocks made before it, 3,300 in
    all: the session re-arms its canary at each window, so c10's count never reaches 1,000 outside."""
    result = _python("""
        import sys, torch, trainprof
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        held = []
        with trainprof.session(log_dir="log", wait=1, warmup=1, active=1, repeat=0, console=False,
                               tensorboard_scalars=False, analyze=False):
            for step in range(33):
                held = [torch.empty(4) for _ in range(300)]  # freed in the next step
                model(torch.randn(2, 8)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        print("user done", file=sys.stderr)
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["user done"]
