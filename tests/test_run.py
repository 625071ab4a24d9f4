"""`trainprof run script.py args`: an unchanged script under a session, alone and under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainprof.cli import main
from trainprof.run import shared_run_name

FAST = ["--wait", "0", "--warmup", "1", "--active", "2", "--quiet"]

# A training script as users write them: argv, a sibling import, `if __name__ == "__main__"`.
SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import torch

    from helper import STEPS  # a module beside the script: its folder is sys.path[0]


    def main():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        with open(sys.argv[1], "w") as f:
            json.dump({"argv": sys.argv, "name": __name__}, f)
        if sys.argv[2] == "raise":
            raise ValueError("planted failure")
        sys.exit(int(sys.argv[2]))


    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def script(tmp_path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "helper.py").write_text("STEPS = 4\n")
    path = tmp_path / "code" / "train.py"
    path.write_text(SCRIPT)
    return path


def _summaries(run_dir: Path) -> list[Path]:
    """Each process's own summary (not rank 0's cross-rank `summary.ranks.json`)."""
    return sorted(p for p in run_dir.rglob("summary*.json") if p.name != "summary.ranks.json")


def test_script_runs_as_main_with_its_argv_and_exit_code(tmp_path, script, monkeypatch):
    monkeypatch.delenv("TRAINPROF_RUN_NAME", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    argv_before, path_before = list(sys.argv), list(sys.path)
    seen = tmp_path / "seen.json"
    code = main(["run", "--log-dir", str(tmp_path / "log"), "--run-name", "r", *FAST,
                 str(script), str(seen), "3", "--wait", "9"])  # options after the script are the script's
    assert code == 3
    assert json.loads(seen.read_text()) == {"argv": [str(script), str(seen), "3", "--wait", "9"],
                                            "name": "__main__"}
    assert sys.argv == argv_before and sys.path == path_before
    run_dir = tmp_path / "log" / "r"
    assert len(list(run_dir.glob("*.pt.trace.json.gz"))) == 1
    (summary,) = _summaries(run_dir)  # sys.exit(3) ended the script's work: its steps are reported
    assert [row["step"] for row in json.loads(summary.read_text())["steps"]] == [1, 2]
    assert not torch.autograd._profiler_enabled()


def test_script_exception_is_the_scripts_own(tmp_path, script, capsys):
    code = main(["run", "--log-dir", str(tmp_path / "log"), "--run-name", "r", *FAST,
                 str(script), str(tmp_path / "seen.json"), "raise"])
    assert code == 1
    err = capsys.readouterr().err
    traceback_lines = err[err.index("Traceback (most recent call last):"):].splitlines()
    assert traceback_lines[1].startswith(f'  File "{script}", line ')  # the script's frames first
    assert "runpy" not in err and "trainprof" + os.sep + "run.py" not in err
    assert traceback_lines[-1] == "ValueError: planted failure"
    assert not _summaries(tmp_path / "log" / "r")  # a failed run writes traces but no report
    assert not torch.autograd._profiler_enabled()


def test_missing_script_and_bad_option_are_one_line_errors(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    missing = tmp_path / "nope.py"
    assert capsys.readouterr().err.strip().splitlines() == [f"trainprof: error: {missing}: no such file"]
    (tmp_path / "s.py").write_text("")
    assert main(["run", "--active", "0", str(tmp_path / "s.py")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_python_dash_m_keeps_the_exit_code(tmp_path, script):
    done = subprocess.run(
        [sys.executable, "-m", "trainprof", "run", "--log-dir", str(tmp_path / "log"), "--run-name", "r",
         *FAST, str(script), str(tmp_path / "seen.json"), "5"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 5, done.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["name"] == "__main__"
    assert _summaries(tmp_path / "log" / "r")


def test_shared_run_name_rules(monkeypatch):
    for variable in ("TRAINPROF_RUN_NAME", "TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    assert shared_run_name() is None  # no launcher: the session's timestamped default
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert shared_run_name() == f"run-{os.uname().nodename.split('.')[0]}-{os.getppid()}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default id: per node
    assert shared_run_name() == f"run-{os.uname().nodename.split('.')[0]}-{os.getppid()}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f2a9c1b-77e0-4a6b-9d1e-0123456789ab")
    assert shared_run_name() == "run-torchrun-3f2a9c1b"
    monkeypatch.setenv("TRAINPROF_RUN_NAME", "../my run")
    assert shared_run_name() == "-my-run"  # one plain folder name, never a path


def test_ranks_of_one_launch_write_into_one_run_folder(tmp_path, script, monkeypatch, capsys):
    """torchrun's environment, one rank after the other in this process (the real torchrun is the
    next test)."""
    monkeypatch.delenv("TRAINPROF_RUN_NAME", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "5b0c2e9a-0000-4000-8000-000000000000")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        capsys.readouterr()
        loud = [option for option in FAST if option != "--quiet"]
        code = main(["run", "--log-dir", str(tmp_path / "log"), *loud, str(script),
                     str(tmp_path / f"seen{rank}.json"), "0"])
        assert code == 0
        printed = capsys.readouterr().out
        assert bool(printed.strip()) == (rank == "0")  # only rank 0 prints the report
    (run_dir,) = (tmp_path / "log").iterdir()
    assert run_dir.name == "run-torchrun-5b0c2e9a"
    traces = sorted(p.name.split("_")[0] for p in run_dir.glob("*.pt.trace.json.gz"))
    assert traces == ["rank0", "rank1"]
    assert len(_summaries(run_dir)) == 2  # one report per rank, none overwritten


def test_real_torchrun_of_a_ddp_script(tmp_path):
    """Two processes under torchrun (gloo on the CPU), an unchanged DDP script: one run folder, a
    trace and a summary per rank, the report printed once, and the folder analysed as two ranks."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this python")
    script = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRAINPROF_RUN_NAME", None)
    done = subprocess.run(
        [str(torchrun), "--nproc_per_node=2", "-m", "trainprof", "run", "--log-dir", str(tmp_path / "log"),
         "--wait", "1", "--warmup", "1", "--active", "2", str(script), "--steps", "6"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "log").iterdir()
    assert run_dir.name.startswith("run-torchrun-")
    assert sorted(p.name.split("_")[0] for p in run_dir.glob("*.pt.trace.json.gz")) == ["rank0", "rank1"]
    assert len(_summaries(run_dir)) == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("trainprof: wrote") == 1  # rank 0 alone reports
    assert (run_dir / "report.ranks.md").exists()  # from both ranks' summaries, gathered by rank 0
    analysed = subprocess.run([sys.executable, "-m", "trainprof", "analyze", str(run_dir), "--json"],
                              capture_output=True, text=True, timeout=300)
    assert analysed.returncode == 0, analysed.stderr[-2000:]
    ranks = json.loads(analysed.stdout)["trace"]["ranks"]
    assert sorted(row["rank"] for row in ranks) == [0, 1]
