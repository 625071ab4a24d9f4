"""One step per trace (`trainprof.analysis.step_basis`): its lengths, which one judges, and why; read
by every rule (one bar for "high") and by the headline, which names the step that judges and the
others only where they differ.

On the checked-in H200 runs: a host that ran ahead of its GPU (busy/vocab_head/bare: 21.5 ms
windows, 49.7 ms steps), sessions whose profiler slowed the recorded steps (busy/small_mlp/eager,
busy/gpt2_attention/sdpa_vocab64), two ranks whose un-profiled steps were timed shorter than their
GPU work (ranks/h200x2_ddp_plain), plain traces of the GPU (busy/fp32_mlp/fp32) and another tool's
traces with a one-off warm-up (thirdparty/).
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import pytest

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.result import Finding
from trainprof.analysis.severity import IDLE_KINDS
from trainprof.analysis.step_basis import STEP_BASES, step_basis
from trainprof.report._format import headline, step_split

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@functools.cache
def _analysed(folder: str, **overrides: float) -> Analysis:
    return analyze(FIXTURES / folder, thresholds=overrides or None)


def test_a_host_that_ran_ahead_is_judged_by_the_step_as_the_gpu_ran_it():
    result = _analysed("busy/vocab_head/bare")
    (trace,) = result.traces
    basis = trace.step_basis
    assert basis.judged_by == "gpu" and basis.judged_ms == trace.busy.step_ms
    assert basis.window_ms == trace.verdict.step_ms == pytest.approx(21.47, abs=0.01)
    assert basis.judged_ms == pytest.approx(49.65, abs=0.01) and basis.host_ran_ahead
    assert basis.unprofiled_ms == trace.profiler.unprofiled_step_ms == pytest.approx(49.52, abs=0.01)
    assert basis.unprofiled_idle_ms is None  # the profiler did not slow it
    # its windows' GPU-idle time counts no more than the GPU's own steps hold (host_ahead)
    rows = trace.busy.steps
    held = sum(r.kernel_span_ms - min(r.kernel_ms, r.kernel_span_ms) for r in rows) / len(rows)
    assert basis.gpu_step_idle_ms == pytest.approx(held, abs=1e-3) and held < 1.0
    assert basis.idle_kept == pytest.approx(held / sum(trace.verdict.idle.by_cause.ms), rel=1e-4)
    assert "ran ahead" in basis.why
    summary = result.summary
    assert (summary.judged_step_ms, summary.judged_step_basis) == (basis.judged_ms, "gpu")
    # The un-profiled step is within 5% of the GPU's: one length to a reader, not named again.
    assert summary.other_steps == [("window", summary.mean_step_ms)]
    assert dict(headline(result))["step time"] == (
        "49.7 ms as the GPU ran it; 21.5 ms in the host's step windows (the host runs ahead of the GPU)")


def test_a_session_the_profiler_slowed_is_judged_by_its_unprofiled_step():
    result = _analysed("busy/small_mlp/eager")
    (trace,) = result.traces
    basis, cost = trace.step_basis, trace.profiler
    assert basis.judged_by == "unprofiled"
    assert basis.judged_ms == cost.judged_step_ms == cost.unprofiled_step_ms == pytest.approx(18.45, abs=0.01)
    assert basis.window_ms == pytest.approx(37.07, abs=0.01)

    # 17.2 ms of GPU idle un-profiled, of 35.9 ms recorded: each GPU-idle gain keeps 48% of its time.
    recorded_idle = sum(trace.verdict.idle.by_cause.ms)
    assert basis.unprofiled_idle_ms == cost.unprofiled_idle_ms_per_step == pytest.approx(17.24, abs=0.01)
    assert basis.idle_kept == pytest.approx(basis.unprofiled_idle_ms / recorded_idle, rel=1e-5)
    assert basis.idle_kept == pytest.approx(0.48, abs=0.01)
    idle = [f for f in result.findings if f.kind in IDLE_KINDS and f.gpu_ms_per_step]
    assert idle and all(basis.idle_note(f.gpu_ms_per_step) in f.title for f in idle)
    assert dict(headline(result))["step time"] == (
        "18.4 ms un-profiled; 37.1 ms in the host's step windows (the profiler made the recorded steps "
        "101% longer)")


def test_ranks_whose_unprofiled_steps_were_timed_short_are_judged_by_their_gpu_work():
    """DDP on two H200s: the session's host clock timed the un-profiled steps at 191 ms, shorter than
    the 314 ms of GPU work each recorded step holds: that work is the shortest the step can be."""
    result = _analysed("ranks/h200x2_ddp_plain")
    for trace in result.traces:
        basis = trace.step_basis
        assert basis.judged_by == "gpu_busy" and basis.judged_ms == trace.profiler.gpu_busy_ms_per_step
        assert basis.judged_ms > basis.unprofiled_ms and "timed shorter" in basis.why
    assert result.summary.judged_step_basis == "gpu_busy"
    # Un-profiled, the GPU is busy all of the step: the syncs' GPU idle is all the profiler's.
    syncs = [f for f in result.findings if f.kind == "sync_point"]
    assert syncs and all(f.gpu_ms_per_step == 0.0 and "the rest is the profiler's" in f.title for f in syncs)
    assert "(the un-profiled steps were timed shorter than the GPU's work in a step)" in \
        dict(headline(result))["step time"]


@pytest.mark.parametrize("folder", ["busy/fp32_mlp/fp32", "thirdparty/kineto_resnet50_num_workers_4"])
def test_a_plain_trace_has_one_step(folder):
    result = _analysed(folder)
    for trace in result.traces:
        basis = trace.step_basis
        assert basis.judged_by == "gpu" and basis.unprofiled_ms is None and not basis.host_ran_ahead
    assert result.summary.other_steps == []
    assert dict(headline(result))["step time"] == f"{result.summary.judged_step_ms:,.1f} ms"


def test_without_gpu_work_the_hosts_window_is_the_step():
    trace = _analysed("busy/fp32_mlp/fp32").traces[0]
    basis = step_basis(trace.verdict, None, None)
    assert (basis.judged_by, basis.judged_ms, basis.gpu_ms) == ("window", trace.verdict.step_ms, None)
    assert set(STEP_BASES) == {"window", "gpu", "unprofiled", "gpu_busy"}


def test_one_bar_where_the_host_ran_ahead():
    """AMD MI300 ResNet with activation checkpointing (thirdparty/tl_mi300_resnet_act_ckpt): the host
    ran ahead (16.2 ms windows, 22.1 ms steps as the GPU ran them). Its exposed communication, 10.7
    ms/step, was judged against the window (66%), its busy findings against the GPU's step; with the
    bar for high at 50% it was high where a busy finding of the same gain was medium (48%). Judged
    against the one step, it is medium."""
    result = _analysed("thirdparty/tl_mi300_resnet_act_ckpt", severity_high_step_share=0.5)
    basis = result.traces[0].step_basis
    assert basis.host_ran_ahead and basis.judged_ms == pytest.approx(22.14, abs=0.01)
    (exposed,) = [f for f in result.findings if f.kind == "exposed_communication"]
    assert 0.5 * basis.judged_ms > exposed.gpu_ms_per_step > 0.5 * basis.window_ms
    assert exposed.severity == "medium"
    assert exposed.details.judged_step_ms == pytest.approx(basis.judged_ms, abs=1e-3)


def test_findings_are_made_once_and_never_edited(monkeypatch):
    """A finding is built with its final gain, title and severity: where the profiler slowed the
    steps no pass edits them after (the rule reads the un-profiled step from the trace's basis). A
    finding's `window` is the trace's, set as the trace's findings are gathered; its `__post_init__`
    turns numpy numbers into plain ones of the same value."""
    edited: list[str] = []

    def guarded_setattr(self, name, value):
        if name != "window" and getattr(self, name) != value:
            edited.append(f"{self.kind}.{name}")
        msgspec.Struct.__setattr__(self, name, value)

    monkeypatch.setattr(Finding, "__setattr__", guarded_setattr)

    for folder in ("busy/small_mlp/eager", "busy/gpt2_attention/sdpa_vocab64"):
        result = analyze(FIXTURES / folder)
        assert result.traces[0].profiler.slowed and result.findings
    assert edited == []


@pytest.mark.parametrize(
    ("folder", "verdict", "share"),
    [
        ("thirdparty/hta_cp_simple_add", "mixed", 97),  # CUDA context creation and cuDNN warm-up
        ("thirdparty/param_resnet_kineto", "input-bound", 15),
    ],
)
def test_the_headline_says_when_the_verdict_leaves_out_a_large_one_off(folder, verdict, share):
    result = _analysed(folder)
    assert round(result.summary.one_off_left_out_pct) == share
    assert dict(headline(result))["verdict"] == (
        f"{verdict} (leaves out one-off costs, which left the GPU idle {share}% of the recorded steps' "
        "time: see the one-off findings)")
    assert any(f.kind == "one_off" for f in result.findings)


def test_a_small_one_off_is_not_named():
    result = _analysed("busy/fp32_mlp/fp32")
    assert result.summary.one_off_left_out_pct is None
    assert dict(headline(result))["verdict"] == "gpu-bound"


def test_the_reports_read_the_shares_of_the_step_the_analysis_computed():
    """`_format.step_split` reads `Summary.idle_step_pct` and `unprofiled_gpu_busy_pct`: a renderer
    computes no metric (it had divided the idle time by the step, and the traces' busy time by the
    un-profiled step, itself)."""
    result = _analysed("busy/small_mlp/eager")
    summary = result.summary
    assert summary.idle_step_pct["launch"] == pytest.approx(
        100 * summary.idle_ms_per_step["launch"] / summary.mean_step_ms, abs=1e-3)
    assert summary.unprofiled_gpu_busy_pct == result.traces[0].profiler.unprofiled_gpu_busy_pct
    planted = msgspec.structs.replace(
        summary, idle_step_pct={**summary.idle_step_pct, "launch": 42.0}, unprofiled_gpu_busy_pct=12.0)
    line = step_split(msgspec.structs.replace(result, summary=planted))
    assert "launch 42.0%" in line and "GPU busy 12%: the rest of the idle time is the profiler's" in line
