"""Sessions under a process group: every rank analyses its own trace, rank 0 gathers the summaries
over the group's store and writes the cross-rank report; `trainprof analyze DIR` merges the same
summaries from the traces, in worker processes.

One 4-rank gloo job on the CPU (tests/distributed_job.py: DDP with a planted straggler, FSDP2 with
gradient accumulation and no `set_requires_gradient_sync`, a run where one rank's loop raises) is
started once for the module; the gather's waiting rules are checked in-process on a HashStore.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.distributed import RankSummary
from trainprof.config import SessionConfig
from trainprof.gather import GroupHandle, gather_summaries

pytestmark = pytest.mark.xdist_group("gloo")

WORLD = 4
JOB = Path(__file__).resolve().parent / "distributed_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gloo_job")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(JOB), str(out), str(WORLD), str(_free_port())],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _results(job: Path) -> dict[int, dict]:
    return {rank: json.loads((job / f"result.rank{rank}.json").read_text()) for rank in range(WORLD)}


def _gathered(job: Path, run: str) -> dict:
    return json.loads((job / run / "summary.ranks.json").read_text())


def test_ddp_cross_rank_report_is_written_by_rank_0_from_the_gathered_summaries(job):
    results = _results(job)
    assert [results[r]["ddp"]["cross_rank"] for r in range(WORLD)] == [True, False, False, False]
    assert all((job / "ddp" / f"summary.rank{r}.json").exists() for r in range(WORLD))
    report = _gathered(job, "ddp")
    assert (report["ranks_reported"], report["world_size"], report["missing_ranks"]) == (WORLD, WORLD, [])
    cross = report["cross_rank"]
    rows = {row["rank"]: row for row in cross["ranks"]}
    # rank 3 sleeps 30 ms before each step: it arrives last, the others wait for it inside gloo's all-reduce
    assert cross["straggler_rank"] == 3
    assert rows[3]["last_arrival_pct"] == 100.0 and rows[3]["waited_ms_per_step"] == 0.0
    for rank in (0, 1, 2):
        assert rows[rank]["comm_exposed_ms"] > 15 and rows[rank]["waited_ms_per_step"] > 15
    (straggler,) = [f for f in report["findings"] if f["kind"] == "straggler"]
    assert straggler["rank"] == 3 and straggler["severity"] in ("high", "medium")
    markdown = (job / "ddp" / "report.ranks.md").read_text()
    assert "Rank 3 is the straggler" in markdown and "| all\\_reduce | gloo | 4 |" in markdown
    # each rank's own costliest finding beside the cross-rank ones, as its own summary has it first
    # (rank 0's summary.json also holds the cross-rank findings merged in after it handed its own over,
    # which can lower its own ones and name the straggler in their titles)
    for rank in range(WORLD):
        own = [f for f in json.loads((job / "ddp" / f"summary.rank{rank}.json").read_text())["findings"]
               if rank or f["kind"] != "straggler"]
        top = rows[rank]["top_finding"]
        if rank:  # its summary.json is its own analysis, as it handed it over
            first = next((f for f in own if f["severity"] != "info"), None)
            assert top == (f"[{first['severity']}] {first['title']}" if first else None), rank
        else:  # rank 0 waits for rank 3: its own view blames that wait
            assert top is not None and any(f["title"].startswith(top.split("] ", 1)[1]) for f in own), top
    assert "## Each rank's costliest finding of its own" in markdown


def test_fsdp2_accumulation_without_gradient_sync_off_is_found_on_every_rank(job):
    report = _gathered(job, "fsdp")
    assert report["ranks_reported"] == WORLD
    assert {row["op"] for row in report["cross_rank"]["collectives"]} >= {"all_gather"}
    for rank in range(WORLD):
        findings = json.loads((job / "fsdp" / f"summary.rank{rank}.json").read_text())["findings"]
        kinds = {f["kind"]: f for f in findings}
        assert "set_requires_gradient_sync(False)" in kinds["no_sync_missing"]["fix"]
        assert kinds["no_sync_missing"]["details"]["micro_batches_per_step"] == 2
        communication = kinds.get("exposed_communication")
        if communication is not None:
            assert communication["details"]["framework"] == "FSDP2"


def test_a_rank_whose_loop_raised_is_reported_missing_without_waiting_for_it(job):
    results = _results(job)
    assert results[2]["fail"]["verdict"] == "not-profiled"
    report = _gathered(job, "fail")
    assert report["missing_ranks"] == [2] and report["ranks_reported"] == WORLD - 1
    # rank 2 handed over an empty summary: rank 0 did not wait out its 60 s gather timeout
    assert results[0]["fail"]["exit_s"] < 20


def test_analyze_dir_in_worker_processes_merges_the_same_summaries(job):
    analysis = analyze(job / "ddp", workers=2)
    gathered = _gathered(job, "ddp")["cross_rank"]
    assert analysis.cross_rank.straggler_rank == gathered["straggler_rank"] == 3
    for row, expected in zip(analysis.cross_rank.ranks, gathered["ranks"], strict=True):
        assert row.rank == expected["rank"]
        assert row.step_ms_by_step == expected["step_ms_by_step"]
        assert row.comm_exposed_ms == pytest.approx(expected["comm_exposed_ms"])
    assert analysis.to_dict() == analyze(job / "ddp", workers=1).to_dict()


# ---- the gather's rules, on an in-process store ------------------------------------------------------


def _summary(rank: int) -> RankSummary:
    return RankSummary(rank=rank, worker=f"rank{rank}", device=None, visible_gpus=0, step_numbers=[1],
                       step_ms_by_step=[10.0 + rank], comm_ms_by_step=[1.0], exposed_comm_ms_by_step=[0.5],
                       verdict="cpu-only", doing="cpu-only", collectives=[])


def _handle(store, rank: int, world: int = 3) -> GroupHandle:
    return GroupHandle(session_number=7, rank=rank, world_size=world, store=store)


def test_the_gather_returns_what_arrived_within_the_timeout_and_names_the_rest():
    import torch.distributed as dist

    store = dist.HashStore()
    assert gather_summaries(_handle(store, 1), _summary(1), timeout_s=60) is None  # never waits
    start = time.monotonic()
    summaries, missing = gather_summaries(_handle(store, 0), _summary(0), timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 5
    assert [s.rank for s in summaries] == [0, 1] and missing == [2]
    assert summaries[1] == _summary(1)


def test_a_rank_without_a_summary_does_not_keep_rank_0_waiting():
    import torch.distributed as dist

    store = dist.HashStore()
    gather_summaries(_handle(store, 1), None, timeout_s=60)
    gather_summaries(_handle(store, 2), _summary(2), timeout_s=60)
    start = time.monotonic()
    summaries, missing = gather_summaries(_handle(store, 0), _summary(0), timeout_s=60)
    assert time.monotonic() - start < 5
    assert [s.rank for s in summaries] == [0, 2] and missing == [1]


def test_without_a_process_group_there_is_nothing_to_gather():
    handle = GroupHandle.new()
    handle.capture()
    assert not handle.ready
    assert gather_summaries(handle, _summary(0), timeout_s=60) is None


@pytest.mark.parametrize("bad", [-1, float("inf"), "10", True])
def test_gather_timeout_must_be_a_number(bad):
    with pytest.raises(ValueError, match="gather_timeout_s"):
        SessionConfig(gather_timeout_s=bad)
