"""The recorded steps weighed against the session's un-profiled steps (`analysis.profiler_cost`).

On the H200 runs whose sessions timed the 8 steps after their window (tests/fixtures/busy): GPT-2
with its vocabulary padded, GPU-bound un-profiled but launch-bound while recorded; a small MLP that
is launch-bound either way; two GPU-bound Llamas whose host ran ahead of the GPU. Then the rule's
edges on a planted trace, the loader, the session's timing and the report's lines.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

import trainprof
from trainprof.analysis import analyze
from trainprof.analysis.severity import IDLE_KINDS
from trainprof.report._format import headline, step_split
from trainprof.trace import load_trace

GPT2 = ("gpt2_attention", "sdpa_vocab64")
MLP = ("small_mlp", "eager")


def _findings(result, kind: str) -> list:
    return [f for f in result.findings if f.kind == kind]


def _sidecar(folder: Path) -> Path:
    (path,) = folder.glob("*.syncsites.json")
    return path


def _copy(folder: Path, into: Path, unprofiled_step_ms: list | None) -> Path:
    """`folder` copied to `into`, its sync sites file holding `unprofiled_step_ms` (None: none)."""
    shutil.copytree(folder, into)
    sidecar = _sidecar(into)
    document = json.loads(sidecar.read_text())
    document.pop("unprofiled_step_ms", None)
    if unprofiled_step_ms is not None:
        document["unprofiled_step_ms"] = unprofiled_step_ms
    sidecar.write_text(json.dumps(document))
    return into


@pytest.fixture(scope="module")
def recorded(fixtures_dir, tmp_path_factory):
    """`recorded(scenario, variant, unprofiled)`: the run analysed with the session's un-profiled steps
    (True) or with the trace alone (False), each once per module."""
    cache: dict = {}
    scratch = tmp_path_factory.mktemp("runs")

    def run(scenario: str, variant: str, unprofiled: bool = True):
        if (scenario, variant, unprofiled) not in cache:
            folder = fixtures_dir / "busy" / scenario / variant
            if not unprofiled:
                folder = _copy(folder, scratch / f"{scenario}_{variant}", None)
            cache[scenario, variant, unprofiled] = analyze(folder)
        return cache[scenario, variant, unprofiled]

    return run


def test_the_sessions_unprofiled_steps_agree_with_the_loops_own_timing(recorded, busy_run):
    """The session's 8 steps after the window, timed by CUDA events at the step ends, against
    `busy_scenarios`' CUDA events around `step()` for 10 steps before the session (timings.json).
    GPT-2 keeps the GPU busy: 47.5 against 49.5 ms (the loop's events sync after every step). The
    small MLP's GPU waits on the host: the session's step is the whole iteration, host work between
    `step()` calls included, which events around `step()` leave out: 18.4 against 14.1 ms."""
    for scenario, variant in (GPT2, MLP):
        cost = recorded(scenario, variant).traces[0].profiler
        assert cost.unprofiled_steps == 8 and cost.timing == "cuda_events"
    measured = busy_run(*GPT2)["step_ms_median"]
    assert recorded(*GPT2).traces[0].profiler.unprofiled_step_ms == pytest.approx(measured, rel=0.1)
    measured = busy_run(*MLP)["step_ms_median"]
    assert measured <= recorded(*MLP).traces[0].profiler.unprofiled_step_ms < 1.5 * measured


def test_a_step_the_profiler_made_launch_bound_is_judged_gpu_bound(recorded):
    alone, judged = recorded(*GPT2, unprofiled=False), recorded(*GPT2)
    assert alone.summary.verdict == "launch-bound"  # what the trace alone says: GPU busy 55%
    assert judged.summary.verdict == "gpu-bound"
    cost = judged.traces[0].profiler
    assert cost.slowed and cost.slowdown_pct > 50 and cost.unprofiled_gpu_busy_pct >= 90
    verdict = judged.traces[0].verdict
    assert verdict.cause is None and verdict.fix is None
    assert f"busy {cost.unprofiled_gpu_busy_pct:.0f}% of an un-profiled step" in verdict.why
    assert "launch-bound while recorded" in verdict.why
    # The GPU-idle findings claim no more than an un-profiled step leaves idle (1.8 ms of 47.5).
    idle = [f for f in judged.findings if f.kind in IDLE_KINDS]
    assert idle and sum(f.gpu_ms_per_step for f in idle) <= cost.unprofiled_idle_ms_per_step + 1e-3
    assert all("the rest is the profiler's" in f.title for f in idle)
    assert [f.severity for f in _findings(alone, "launch_overhead")] == ["high"]
    assert not [f for f in _findings(judged, "launch_overhead") if f.severity == "high"]
    (slowdown,) = _findings(judged, "profiler_slowdown")
    assert slowdown.details == cost and slowdown.gpu_ms_per_step == 0.0
    assert not _findings(alone, "profiler_slowdown")


def test_busy_findings_predict_and_rank_from_the_unprofiled_step(recorded):
    alone, judged = recorded(*GPT2, unprofiled=False), recorded(*GPT2)
    cost = judged.traces[0].profiler
    (fusion,), (fusion_alone,) = _findings(judged, "fusible_layers"), _findings(alone, "fusible_layers")
    assert fusion.gpu_ms_per_step == pytest.approx(fusion_alone.gpu_ms_per_step)  # the same kernels saved
    predicted = cost.judged_step_ms - fusion.gpu_ms_per_step
    assert f"step {cost.judged_step_ms:.1f} -> ~{predicted:.1f} ms" in fusion.fix
    # The trace alone puts launch overhead first (27.4 ms/step, at most 1.8 of it un-profiled), and
    # 16.2 ms of its 83.2 ms step is medium; of the 47.5 ms un-profiled step it is high.
    assert [f.kind for f in alone.findings[:2]] == ["launch_overhead", "fusible_layers"]
    assert (fusion_alone.severity, fusion.severity) == ("medium", "high")
    assert judged.findings[0] is fusion
    # The MFU: the same FLOPs over the un-profiled step (12.3% of the bf16 peak recorded, 21.5%).
    busy, busy_alone = judged.traces[0].busy, alone.traces[0].busy
    assert busy.step_ms == busy_alone.step_ms > cost.judged_step_ms
    assert busy.mfu_pct == pytest.approx(busy_alone.mfu_pct * busy.step_ms / cost.judged_step_ms, abs=0.01)
    assert dict(headline(judged))["MFU"].endswith("(over the un-profiled step)")


def test_a_launch_bound_loop_stays_launch_bound_with_its_gain_bounded(recorded):
    alone, judged = recorded(*MLP, unprofiled=False), recorded(*MLP)
    assert alone.summary.verdict == judged.summary.verdict == "launch-bound"
    cost = judged.traces[0].profiler
    assert cost.slowed and cost.unprofiled_gpu_busy_pct < 80  # 18.4 ms un-profiled, 37.1 recorded
    assert f"at most {cost.unprofiled_idle_ms_per_step:.1f} ms/step" in judged.traces[0].verdict.why
    # Launch overhead (22.3 ms/step recorded) and host code (12.9) cannot both be the loop's: 17.2 ms
    # is all the idle time an un-profiled step has, of 35.9 recorded: each keeps that share (48%).
    idle = {f.kind: f for f in judged.findings if f.kind in IDLE_KINDS}
    alone_idle = {f.kind: f for f in alone.findings if f.kind in IDLE_KINDS}
    assert set(idle) == set(alone_idle) == {"launch_overhead", "host_bound"}
    claimed = sum(f.gpu_ms_per_step for f in idle.values())
    assert claimed <= cost.unprofiled_idle_ms_per_step
    basis = judged.traces[0].step_basis
    assert basis.judged_by == "unprofiled" and basis.unprofiled_idle_ms == cost.unprofiled_idle_ms_per_step
    recorded_idle = sum(judged.traces[0].verdict.idle.by_cause.ms)
    assert basis.idle_kept == pytest.approx(cost.unprofiled_idle_ms_per_step / recorded_idle, rel=1e-4)
    kept = {kind: idle[kind].gpu_ms_per_step / alone_idle[kind].gpu_ms_per_step for kind in idle}
    assert kept["launch_overhead"] == pytest.approx(kept["host_bound"], rel=1e-3)
    assert kept["host_bound"] == pytest.approx(basis.idle_kept, rel=1e-3) and basis.idle_kept < 1
    assert idle["launch_overhead"].severity == "high"


@pytest.mark.parametrize("scenario", ["vocab_head", "llama_swap"])
def test_a_host_that_ran_ahead_is_weighed_by_the_step_as_the_gpu_ran_it(recorded, scenario):
    """GPU-bound loops whose host ran ahead of the GPU: its step windows (21.5 and 35.1 ms) are
    shorter than the steps (49.7 and 41.7 ms as the GPU ran them; 49.5 and 41.6 un-profiled; 51.0
    and 43.0 by the loop's own CUDA events). Weighed by the windows, the recorded steps read 57% and
    16% shorter than the un-profiled ones, the GPU 41% and 82% busy."""
    result = recorded(scenario, "bare")
    summary, cost = result.summary, result.traces[0].profiler
    assert summary.mean_step_ms < 0.9 * summary.gpu_step_ms  # the host ran ahead
    assert cost.recorded_step_ms == pytest.approx(summary.gpu_step_ms, rel=1e-3)
    assert abs(cost.slowdown_pct) < 5 and not cost.slowed
    assert cost.unprofiled_gpu_busy_pct > 95
    assert summary.verdict == "gpu-bound" and not _findings(result, "profiler_slowdown")
    # The headline's one step is the GPU's; the un-profiled one is within 5% of it: not named.
    step = dict(headline(result))["step time"]
    assert step.startswith(f"{summary.gpu_step_ms:.1f} ms as the GPU ran it;") and "un-profiled" not in step


def test_a_window_holding_kernels_queued_before_it_counts_its_own(fixtures_dir, tmp_path, busy_run):
    """Eager GPT-2 on the H200 (tests/fixtures/busy/gpt2_attention/eager): its first recorded window
    held 876 kernels that the warm-up step had queued, 137.0 ms of GPU work, where its own kernels
    spanned 124.9 ms; the loop's steps took 123.7 ms without the profiler. Given those as the
    un-profiled steps, the steps' busy time is no longer than they take (counting the window's work:
    128.5 ms)."""
    measured = busy_run("gpt2_attention", "eager")["step_ms_median"]
    folder = _copy(fixtures_dir / "busy" / "gpt2_attention" / "eager", tmp_path / "eager", [measured] * 8)
    cost = analyze(folder).traces[0].profiler
    assert cost.gpu_busy_ms_per_step <= measured
    assert cost.judged_step_ms == pytest.approx(measured)


def test_a_step_the_profiler_did_not_slow_is_judged_as_recorded(fixtures_dir, tmp_path):
    """Un-profiled steps up to 15% (`profiler_slowdown_min_share`) shorter change nothing but the
    `profiler` record and the headline row; from there the verdict is judged again."""
    source = fixtures_dir / "traces" / "gpt2_pathologies"
    base = analyze(source)
    step_ms = base.traces[0].verdict.step_ms
    assert base.summary.verdict != "gpu-bound" and base.traces[0].verdict.gpu_busy_pct < 80

    def with_unprofiled(ms: float, name: str):
        folder = tmp_path / name
        shutil.copytree(source, folder)
        (folder / (next(folder.glob("*.pt.trace.json*")).name.split(".")[0] + ".syncsites.json")).write_text(
            json.dumps({"version": 2, "sites": [], "unprofiled_step_ms": [ms] * 5})
        )
        return analyze(folder)

    close = with_unprofiled(step_ms / 1.14, "close")
    assert not close.traces[0].profiler.slowed
    assert [f.to_dict() for f in close.findings] == [f.to_dict() for f in base.findings]
    assert close.traces[0].verdict == base.traces[0].verdict
    slowed = with_unprofiled(step_ms / 1.16, "slowed")
    assert slowed.traces[0].profiler.slowed
    assert "un-profiled" in slowed.traces[0].verdict.why
    assert _findings(slowed, "profiler_slowdown")


def test_a_step_of_collectives_is_judged_communication_bound(fixtures_dir, tmp_path):
    """ddp_straggler's rank 0 waits in collectives (53 of its 56 busy ms per step, 48.7 of them for
    rank 1 as measured across ranks: `rank-wait-bound` while recorded): given un-profiled steps its
    kernels fill, it is communication-bound; its rank 1, of almost no collectives, GPU-bound."""
    source = fixtures_dir / "traces" / "ddp_straggler"
    base = analyze(source)
    folder = tmp_path / "ddp"
    shutil.copytree(source, folder)
    for trace in base.traces:
        busy_ms = trace.verdict.gpu_busy_pct * trace.verdict.step_ms / 100
        (folder / f"{trace.worker}.syncsites.json").write_text(
            json.dumps({"version": 2, "sites": [], "unprofiled_step_ms": [1.05 * busy_ms] * 5})
        )
    judged = {trace.worker: trace.verdict for trace in analyze(folder).traces}
    recorded = {t.worker: t.verdict.label for t in base.traces}
    assert recorded == {"rank0": "rank-wait-bound", "rank1": "host-bound"}
    assert judged["rank0"].label == "communication-bound" and "in collectives" in judged["rank0"].why
    assert judged["rank1"].label == "gpu-bound" and "in collectives" not in judged["rank1"].why


def test_the_loader_keeps_only_positive_finite_step_times(fixtures_dir, tmp_path):
    trace = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    shutil.copy(trace, tmp_path)
    sidecar = tmp_path / (trace.name.split(".")[0] + ".syncsites.json")
    sidecar.write_text('{"version": 2, "sites": [], "unprofiled_step_ms": [12.5, true, "3", -1, 0, 7]}')
    assert load_trace(tmp_path / trace.name).unprofiled_step_ms == [12.5, 7.0]
    sidecar.write_text('{"version": 2, "sites": [], "unprofiled_step_ms": [false, null]}')
    assert load_trace(tmp_path / trace.name).unprofiled_step_ms is None
    sidecar.write_text('{"version": 2, "sites": [], "unprofiled_step_ms": {"a": 1}}')
    assert load_trace(tmp_path / trace.name).unprofiled_step_ms is None


def test_the_session_times_the_steps_it_does_not_profile(tmp_path):
    """The steps before the first window (0-2: the loop's warm-up, here slow) and the warm-up and
    recorded steps (3-5) are not counted; each counted step is the loop's own time, from one step's
    end to the next."""
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainprof.session(log_dir=tmp_path, run_name="r", skip_first=1, wait=2, warmup=1, active=2,
                           console=False) as sess:
        for i in range(11):
            time.sleep(0.3 if i < 3 else 0.01)
            model(torch.randn(4, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    times = list(sess.unprofiled_step_ms)
    assert len(times) == 5  # steps 6-10
    assert all(10 <= ms < 300 for ms in times), times
    written = json.loads(_sidecar(tmp_path / "r").read_text())["unprofiled_step_ms"]
    assert written == [round(ms, 3) for ms in times]
    # CUDA events where the process has CUDA up (an idle GPU passes them as the host records them)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    assert sess.unprofiled_timing == ("cuda_events" if cuda else "host")


def test_no_step_mark_is_recorded_while_the_loop_captures_a_cuda_graph(tmp_path, monkeypatch):
    """An event recorded on a capturing stream would invalidate the user's graph capture: the session
    leaves it out (and its marks stay on for the steps after)."""
    import collections

    made = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", lambda **kwargs: made.append(kwargs))
    sess = trainprof.session(log_dir=tmp_path, run_name="r", wait=1, warmup=1, active=1, console=False)
    sess._gpu_marks = collections.deque()
    sess._mark_gpu()
    assert made == [] and sess._gpu_marks is not None and not sess._gpu_marks


def test_the_report_shows_the_unprofiled_step_beside_the_recorded_one(recorded):
    judged, alone = recorded(*GPT2), recorded(*GPT2, unprofiled=False)
    cost = judged.traces[0].profiler
    rows = dict(headline(judged))
    assert rows["step time"] == (
        f"{cost.unprofiled_step_ms:.1f} ms un-profiled; {judged.summary.mean_step_ms:.1f} ms in the host's "
        f"step windows (the profiler made the recorded steps {judged.summary.profiler_slowdown_pct:.0f}% "
        "longer)")
    assert "the rest of the idle time is the profiler's" in step_split(judged)
    assert f"GPU busy {cost.unprofiled_gpu_busy_pct:.0f}%:" in step_split(judged)  # as the finding says
    assert judged.summary.unprofiled_gpu_busy_pct == cost.unprofiled_gpu_busy_pct  # computed once
    assert "un-profiled" not in dict(headline(alone))["step time"] and "profiler's" not in step_split(alone)
    summary = judged.to_dict()["trace"]
    assert summary["traces"][0]["profiler"]["unprofiled_steps"] == 8
    assert summary["summary"]["unprofiled_step_ms"] == cost.unprofiled_step_ms


def test_a_diff_of_two_runs_compares_their_unprofiled_steps(fixtures_dir, tmp_path):
    from trainprof.analysis.diff import diff_traces

    gpt2 = fixtures_dir / "busy" / "gpt2_attention"
    result = diff_traces(gpt2 / "sdpa", gpt2 / "sdpa_vocab64")  # no un-profiled steps -> with them
    rows = {row.metric: (row.a, row.b) for row in result.headline}
    # sdpa's host ran ahead (GPU steps 8% longer than its windows): the GPU step row comes between
    assert list(rows)[:3] == ["step ms (host window)", "GPU step ms", "un-profiled step ms"]
    assert rows["un-profiled step ms"] == (None, analyze(gpt2 / "sdpa_vocab64").summary.unprofiled_step_ms)
    plain = diff_traces(gpt2 / "eager", gpt2 / "sdpa")
    assert "un-profiled step ms" not in {row.metric for row in plain.headline}


def test_a_trainer_run_the_profiler_made_mixed_is_judged_gpu_bound(fixtures_dir, tmp_path):
    """A real `transformers.Trainer` session on the H200 (tests/fixtures/stacks/hf_trainer_session):
    107.3 ms recorded, 68.4 un-profiled (26 steps)."""
    folder = fixtures_dir / "stacks" / "hf_trainer_session"
    judged = analyze(folder)
    alone = analyze(_copy(folder, tmp_path / "alone", None))
    cost = judged.traces[0].profiler
    assert (cost.unprofiled_steps, cost.timing) == (26, "cuda_events") and cost.slowed
    assert alone.summary.verdict == "mixed" and judged.summary.verdict == "gpu-bound"
    idle = [f for f in judged.findings if f.kind in IDLE_KINDS]
    assert sum(f.gpu_ms_per_step for f in idle) <= cost.unprofiled_idle_ms_per_step + 1e-3
    # The sync sites the session captured still name the library lines behind the syncs.
    syncs = _findings(judged, "sync_point")
    assert syncs and all(f.severity == "low" for f in syncs)
    assert {f.via.library for f in syncs if f.via is not None} >= {"transformers", "accelerate"}
    assert judged.findings[0].kind == "fusible_layers"


@pytest.mark.parametrize("folder, caveat", [
    # un-profiled, the GPU was busy 97% and 83% of these steps: their traces alone read launch-bound
    # and mixed (BENCHMARKS section 22)
    ("busy/gpt2_attention/sdpa_vocab64", True),
    ("stacks/hf_trainer_session", True),
    # launch-bound un-profiled too (the GPU busy under 10% of its steps)
    ("busy/small_mlp/eager", False),
])
def test_a_trace_alone_says_when_the_profiler_could_have_made_its_verdict(fixtures_dir, tmp_path, folder,
                                                                          caveat):
    for trace in (fixtures_dir / folder).glob("*.pt.trace.json*"):
        shutil.copy(trace, tmp_path)  # the trace alone: no un-profiled steps beside it
    alone = analyze(tmp_path)
    (estimate,) = [t.profiler_estimate for t in alone.traces]
    assert estimate.options == "stack" and estimate.ops_per_step > 1000
    assert (alone.summary.verdict_caveat is not None) is caveat
    assert estimate.could_be_gpu_bound is caveat
    if caveat:
        assert alone.summary.verdict in ("launch-bound", "mixed")
        assert "trainprof.session" in alone.summary.verdict_caveat
    # with the session's un-profiled steps the verdict is judged on them: no estimate, no caveat
    judged = analyze(fixtures_dir / folder)
    assert judged.summary.verdict_caveat is None and judged.traces[0].profiler_estimate is None
