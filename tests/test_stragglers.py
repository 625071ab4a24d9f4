"""Stragglers that hold on real runs: ranks with the same work never make a straggler, whichever host
the profiler slowed; a rank with more work or a cause of its own is named with it; a collective's wait
is told from its transfer.

Two gloo jobs on the CPU (tests/rank_skew_job.py, 2 and 4 ranks), each started once for the module:
the same work, the same work with the last rank's host slowed only while profiled, a sleep in the
last rank's input function, and a larger batch on the last rank; in sessions (with un-profiled steps)
and as plain `torch.profiler` traces. Then the rules on records written here, against figures
worked out in the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.collectives import Collective, comm_wait
from trainprof.analysis.distributed import RankRow
from trainprof.analysis.links import Link
from trainprof.analysis.rank_work import HostTime, OpFlops, RankWork
from trainprof.analysis.stragglers import judged, lateness, straggler_findings
from trainprof.analysis.thresholds import Thresholds

pytestmark = pytest.mark.xdist_group("gloo")

JOB = Path(__file__).resolve().parent / "rank_skew_job.py"
SERIOUS = ("high", "medium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(out: Path, world: int) -> Path:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(JOB), str(out), str(world), str(_free_port())],
                          capture_output=True, text=True, timeout=420, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def job(request, tmp_path_factory) -> tuple[Path, int]:
    world = request.param
    return _run_job(tmp_path_factory.mktemp(f"skew{world}"), world), world


def _session(job: tuple[Path, int], case: str) -> dict:
    out, _ = job
    return json.loads((out / "result.rank0.json").read_text())[case]


def _stragglers(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["kind"] == "straggler" and f["severity"] in SERIOUS]


@pytest.mark.parametrize("case", ["equal", "slowed"])
def test_ranks_with_the_same_work_have_no_straggler_in_a_session(job, case):
    result = _session(job, case)
    assert not result["verdict"].startswith("straggler"), result
    assert not _stragglers(result["findings"]), result["findings"]


@pytest.mark.parametrize("case", ["equal", "slowed"])
def test_ranks_with_the_same_work_have_no_straggler_in_plain_traces(job, case):
    out, world = job
    analysis = analyze(out / f"plain-{case}")
    assert len(analysis.ranks) == world
    assert not analysis.summary.verdict.startswith("straggler")
    assert analysis.summary.straggler_rank is None
    assert not [f for f in analysis.findings if f.kind == "straggler" and f.severity in SERIOUS]


def test_the_host_slowed_only_while_profiled_is_profiler_skew_not_a_straggler(job):
    # the last rank's ops are slower only while recorded: it runs late, with the others' FLOPs
    out, world = job
    analysis = analyze(out / "plain-slowed")
    (skew,) = [f for f in analysis.findings if f.kind == "profiler_skew"]
    assert skew.severity == "info" and skew.rank == world - 1 and skew.gpu_ms_per_step == 0.0
    late = skew.details.lateness
    assert late.gflop_ratio == pytest.approx(1.0) and late.uneven_ops == []
    assert late.own_excess_ms_per_step < max(5.0, 0.15 * analysis.summary.mean_step_ms)


def test_a_sleep_in_one_ranks_input_function_is_named_and_holds_un_profiled(job):
    from rank_skew_job import SLEEP_MS

    out, world = job
    result = _session(job, "sleep")
    assert result["verdict"] == f"straggler: rank {world - 1}"
    (straggler,) = _stragglers(result["findings"])
    assert straggler["rank"] == world - 1 and "load_batch" in straggler["title"]
    assert "input" in straggler["title"] and "un-profiled too" in straggler["title"]
    gathered = json.loads((out / "sleep" / "summary.ranks.json").read_text())
    (finding,) = [f for f in gathered["findings"] if f["kind"] == "straggler"]
    late = finding["details"]["lateness"]
    assert late["own_cause"] == "input"
    assert late["own_excess_ms_per_step"] == pytest.approx(SLEEP_MS, rel=0.25)
    # without the profiler it reaches its first forward the sleep's length after the others
    assert late["unprofiled_late_ms_per_step"] == pytest.approx(SLEEP_MS, rel=0.25)
    rows = {row["rank"]: row for row in gathered["cross_rank"]["ranks"]}
    assert rows[world - 1]["unprofiled_late_ms"] == pytest.approx(SLEEP_MS, rel=0.25)
    # rank 0's console report waits for the other ranks: its first finding is the straggler
    console = (out / "console.sleep.rank0.txt").read_text()
    first = console.split("Top findings", 1)[1].splitlines()[1]
    assert f"rank {world - 1}" in first.lower() and "straggler" in first.lower(), console[:2000]
    assert console.index("Top findings") < console.index(f"trainprof: {world} ranks")


def test_a_larger_batch_on_one_rank_is_named_by_its_op_shapes(job):
    from rank_skew_job import WORK_FACTOR

    out, world = job
    result = _session(job, "work")
    assert result["verdict"] == f"straggler: rank {world - 1}"
    (straggler,) = _stragglers(result["findings"])
    assert straggler["rank"] == world - 1 and "more compute" in straggler["title"]
    assert f"[{64 * WORK_FACTOR}, 512]" in straggler["title"]  # the shape the others lack
    gathered = json.loads((out / "work" / "summary.ranks.json").read_text())
    (finding,) = [f for f in gathered["findings"] if f["kind"] == "straggler"]
    # all its matrix products are WORK_FACTOR times the others'
    assert finding["details"]["lateness"]["gflop_ratio"] == pytest.approx(WORK_FACTOR, rel=0.01)


def test_rank_0_s_own_report_names_the_straggler_it_waited_for(job):
    out, world = job
    own = json.loads((out / "sleep" / "summary.rank0.json").read_text())
    assert own["trace"]["summary"]["verdict"] == f"straggler: rank {world - 1}"
    exposed = [f for f in own["findings"] if f["kind"] == "exposed_communication" and f["rank"] == 0]
    assert exposed and exposed[0]["details"]["held_elsewhere"][0]["kind"] == "straggler"


# ---- the rules on records written here -------------------------------------------------------------


def _row(rank: int, step_ms: float, comm_ms: float, wait_ms: float = 0.0) -> RankRow:
    return RankRow(rank=rank, step_ms=step_ms, comm_ms=comm_ms, non_comm_ms=step_ms - comm_ms,
                   step_ms_by_step=[step_ms], comm_exposed_ms=comm_ms, verdict="mixed",
                   last_arrival_pct=None, waited_ms_per_step=wait_ms, exposed_wait_ms_per_step=wait_ms)


def _work(compute_ms: float, host: list[HostTime], gflop: float = 100.0, pre_forward: float | None = None,
          shapes: str = "[8, 2048, 2048] [2048, 2048]") -> RankWork:
    return RankWork(compute_ms_per_step=compute_ms, kernels_per_step=500.0, gflop_per_step=gflop,
                    ops=[OpFlops("aten::mm", shapes, 4.0, gflop)], host=host, on_gpu=True,
                    unprofiled_pre_forward_ms=pre_forward)


def _summaries(works: dict[int, RankWork]):
    from trainprof.analysis.distributed import RankSummary

    return [RankSummary(rank=r, worker=f"rank{r}", device="NVIDIA H200", visible_gpus=2, step_numbers=[1],
                        step_ms_by_step=[100.0], comm_ms_by_step=[10.0], exposed_comm_ms_by_step=[10.0],
                        verdict="mixed", doing="", collectives=[], work=w) for r, w in works.items()]


# Host time every rank spends in the same frames: the profiler's cost makes rank 1's 1.5x longer.
SHARED = [HostTime("host", "torch/nn/modules/module.py(1780): _call_impl", 8.0, 0.0, 0.3)]
SLOWER = [HostTime("host", "torch/nn/modules/module.py(1780): _call_impl", 12.0, 0.0, 0.4),
          HostTime("unknown", None, 30.0, 0.0, 0.2)]  # spread thin: no stretch of a millisecond


def test_launch_and_host_overhead_on_the_same_work_is_profiler_skew():
    rows = [_row(0, 100.0, 60.0, wait_ms=50.0), _row(1, 100.0, 10.0)]  # rank 1: 50 ms/step later
    works = {0: _work(40.0, SHARED), 1: _work(40.5, SLOWER)}
    (finding,) = straggler_findings(rows, _summaries(works), Thresholds())
    assert finding.kind == "profiler_skew" and finding.severity == "info" and finding.rank == 1
    assert "to confirm without the profiler" in finding.title


def test_a_one_rank_stall_is_a_cause_of_its_own():
    # one 45 ms stretch of unrecorded code per step on rank 1 (a sleep without stacks)
    stalled = [*SHARED, HostTime("unknown", None, 46.0, 45.0, 45.0)]
    rows = [_row(0, 100.0, 60.0, wait_ms=50.0), _row(1, 100.0, 10.0)]
    works = {0: _work(40.0, SHARED), 1: _work(40.0, stalled)}
    late = lateness(1, works, {r.rank: r for r in rows}, Thresholds())
    assert (late.own_cause, late.own_event, late.own_excess_ms_per_step) == ("unknown", None, 45.0)
    assert judged(late, True, 15.0, Thresholds()) == "cause"
    (finding,) = straggler_findings(rows, _summaries(works), Thresholds())
    assert finding.kind == "straggler" and finding.rank == 1 and finding.severity == "high"


def test_more_gpu_compute_is_more_work_named_by_the_shapes_the_others_lack():
    rows = [_row(0, 100.0, 60.0, wait_ms=50.0), _row(1, 100.0, 10.0)]
    wider = "[8, 4096, 2048] [2048, 2048]"
    works = {0: _work(40.0, SHARED), 1: _work(90.0, SHARED, gflop=200.0, shapes=wider)}
    (finding,) = straggler_findings(rows, _summaries(works), Thresholds())
    late = finding.details.lateness
    assert finding.kind == "straggler" and late.compute_excess_ms_per_step == 50.0 and late.gflop_ratio == 2.0
    assert late.uneven_ops == ["aten::mm [8, 4096, 2048] [2048, 2048]"] and "+100% FLOPs" in finding.title


def test_a_cause_the_un_profiled_steps_do_not_show_takes_no_verdict():
    stalled = [*SHARED, HostTime("input", "train.py(12): get_batch", 46.0, 45.0, 45.0)]
    rows = [_row(0, 100.0, 60.0, wait_ms=50.0), _row(1, 100.0, 10.0)]
    works = {0: _work(40.0, SHARED, pre_forward=1.0), 1: _work(40.0, stalled, pre_forward=1.5)}
    (finding,) = straggler_findings(rows, _summaries(works), Thresholds())
    assert finding.kind == "straggler" and finding.severity == "low"
    assert "holds while recorded only" in finding.title


def test_late_un_profiled_with_no_cause_in_the_trace_is_still_a_straggler():
    rows = [_row(0, 100.0, 60.0, wait_ms=50.0), _row(1, 100.0, 10.0)]
    works = {0: _work(40.0, SHARED, pre_forward=1.0), 1: _work(40.5, SLOWER, pre_forward=31.0)}
    (finding,) = straggler_findings(rows, _summaries(works), Thresholds())
    assert finding.kind == "straggler" and finding.details.lateness.unprofiled_late_ms_per_step == 30.0


# ---- wait against transfer on one rank's own collectives ----------------------------------------------


def _call(step: int, index: int, nbytes: int, duration_us: float) -> Collective:
    return Collective(step=step, index=index, op="all_reduce", library="NCCL", group_size=2, bytes=nbytes,
                      duration_us=duration_us, exposed_us=duration_us, launch_offset_us=0.0,
                      start_offset_us=0.0)


NVLINK = Link("NVLink", 450.0, "test", assumed=False)


def test_a_rank_that_waits_in_some_calls_has_its_wait_told_from_its_transfer():
    # 64 MiB at 200 GB/s bus bandwidth takes 335.5 µs (2 ranks: algbw = busbw); one call waits 5 ms more
    nbytes = 64 << 20
    transfer = nbytes / 200e3  # µs at 200 GB/s
    calls = [_call(1, 0, nbytes, transfer), _call(1, 1, nbytes, transfer + 5000.0),
             _call(2, 0, nbytes, transfer)]
    wait = comm_wait(calls, lambda group: NVLINK, 1 << 20, 0.25)
    assert wait.undecided == [] and wait.exposed_wait_ms_by_step == {1: pytest.approx(5.0), 2: 0.0}


def test_a_rank_that_waits_in_every_call_cannot_tell_its_wait_alone():
    # every call 8 ms: 8 GB/s, 2% of NVLink: a slow link or a late peer, from this rank alone
    nbytes = 64 << 20
    calls = [_call(step, 0, nbytes, 8000.0) for step in (1, 2, 3)]
    wait = comm_wait(calls, lambda group: NVLINK, 1 << 20, 0.25)
    assert wait.undecided == ["all_reduce"] and wait.exposed_wait_ms_by_step == {}
    assert wait.best_link_pct == pytest.approx(100 * nbytes / 8000.0 / 1e3 / 450.0, abs=0.1)


# ---- two H200s (examples/multi_gpu_llama.py, 2026-11-29; tests/fixtures/README.md) -----------------


def _plain(folder: Path, tmp_path: Path) -> Path:
    """The folder's traces alone, as a user's plain torch.profiler traces: no session sidecars."""
    for trace in folder.glob("*.pt.trace.json.gz"):
        shutil.copy(trace, tmp_path)
    return tmp_path


@pytest.mark.parametrize("sidecars", [True, False], ids=["session", "plain"])
def test_two_h200_ranks_with_the_same_work_have_no_straggler(fixtures_dir, tmp_path, sidecars):
    # DDP, the same work on both ranks; recorded with stacks, the ranks' steps were 1.6x and 1.8x
    # their un-profiled 191 ms, and one rank's host fell behind the other's
    folder = fixtures_dir / "ranks" / "h200x2_ddp_plain"
    analysis = analyze(folder if sidecars else _plain(folder, tmp_path))
    assert len(analysis.ranks) == 2
    assert analysis.summary.straggler_rank is None and not analysis.summary.verdict.startswith("straggler")
    assert not [f for f in analysis.findings if f.kind == "straggler" and f.severity in SERIOUS]
    if sidecars:  # judged on the un-profiled steps, where the GPU is busy throughout
        assert analysis.summary.verdict == "gpu-bound" and analysis.summary.verdict_caveat is None
    else:  # the traces alone say the profiler may have made their verdict
        assert "profiler may have made this verdict" in analysis.summary.verdict_caveat


@pytest.mark.parametrize("sidecars", [True, False], ids=["session", "plain"])
def test_two_h200_ranks_one_with_longer_sequences_names_it_by_its_work(fixtures_dir, tmp_path, sidecars):
    # rank 1's sequences are 1.5x as long (3,072 tokens against 2,048): its matrix products do 1.5x
    # the FLOPs, its attention 2.25x; the step's ratio lies between
    folder = fixtures_dir / "ranks" / "h200x2_ddp_uneven"
    analysis = analyze(folder if sidecars else _plain(folder, tmp_path))
    assert analysis.summary.verdict == "straggler: rank 1"
    (straggler,) = [f for f in analysis.findings if f.kind == "straggler"]
    late = straggler.details.lateness
    assert straggler.rank == 1 and "more GPU compute" in straggler.title
    assert 1.5 < late.gflop_ratio < 2.25
    assert any("3072" in op or "12288" in op for op in late.uneven_ops)  # 4 x 3,072 tokens
    assert late.compute_excess_ms_per_step > 0.2 * analysis.ranks[0].compute_ms
