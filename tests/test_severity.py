"""Severity follows the GPU time at stake (`trainprof.analysis.severity`), for every finding kind.

Synthetic traces pin the sync rule (the idle a sync causes, not the host time it blocks) and the
ranking (one-off costs after the steady ones); every checked-in fixture is held to the contract: a
finding is `high` only when it could win back at least a fifth of its step, and the shared and
third-party traces keep their verdicts.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from test_idle_causes import STEP_US, TraceBuilder

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.severity import severity_for
from trainprof.analysis.thresholds import Thresholds

# One worker analyses each fixture once for the tests that read it (`_analysed`).
pytestmark = pytest.mark.xdist_group("severity")

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _gpu_busy_step_with_a_sync(refill_us: float) -> TraceBuilder:
    """One 100 ms step: a kernel over [0.03, 60] ms, a device synchronize from 1 ms until it ends,
    then `refill_us` of the user's Python before the next launch, whose kernel runs to the end."""
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0.0, STEP_US)
    trace.py("train.py(5): train", 0.5, STEP_US - 1)
    trace.call("cudaLaunchKernel", 1.0, 10, kernels=[(30.0, 59_970.0)])
    trace.call("cudaDeviceSynchronize", 1_000.0, 59_000.0)
    launch_at = 60_000.0 + refill_us
    trace.call("cudaLaunchKernel", launch_at, 10, kernels=[(launch_at + 20, STEP_US - launch_at - 20)])
    return trace


def _sync(result):
    (finding,) = [f for f in result.findings if f.kind == "sync_point"]
    return finding


def test_a_sync_while_the_gpu_is_busy_costs_nothing(tmp_path):
    # The host blocks 59 ms, but the GPU runs throughout and the next kernel follows at once.
    finding = _sync(analyze(_gpu_busy_step_with_a_sync(refill_us=20.0).write(tmp_path)))
    assert finding.cost_ms == pytest.approx(59.0, abs=0.1)  # host time blocked, as before
    assert finding.gpu_ms_per_step == pytest.approx(0.04, abs=0.02)
    assert finding.severity == "low"


def test_a_sync_costs_the_refill_after_it_at_most_the_hosts_lead(tmp_path):
    # After the sync the host spends 30 ms before its next launch; it was 59 ms ahead before the
    # sync, so without the sync the GPU would not have waited: 30 ms of a 100 ms step, high.
    finding = _sync(analyze(_gpu_busy_step_with_a_sync(refill_us=30_000.0).write(tmp_path)))
    assert finding.gpu_ms_per_step == pytest.approx(30.0, abs=0.1)
    assert finding.severity == "high"


def test_a_sync_costs_no_more_than_the_lead_it_removed(tmp_path):
    # A 2 ms sync (the host was 2 ms ahead), then 30 ms of host Python: the sync is worth 2 ms; the
    # rest of the idle is the host's own (the host-bound finding's).
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0.0, STEP_US)
    trace.call("cudaLaunchKernel", 1.0, 10, kernels=[(30.0, 2_970.0)])
    trace.call("cudaStreamSynchronize", 1_000.0, 2_000.0)
    trace.py("train.py(9): log_metrics", 3_010.0, 29_980.0)
    trace.call("cudaLaunchKernel", 33_000.0, 10, kernels=[(33_020.0, STEP_US - 33_020.0)])
    finding = _sync(analyze(trace.write(tmp_path)))
    assert finding.gpu_ms_per_step == pytest.approx(2.0, abs=0.05)
    assert finding.severity == "low"


def test_the_severity_cut_offs_are_overridable_by_their_names(tmp_path):
    path = _gpu_busy_step_with_a_sync(refill_us=30_000.0).write(tmp_path)
    assert _sync(analyze(path, thresholds={"severity_high_step_share": 0.5})).severity == "medium"
    assert _sync(analyze(path, thresholds={"severity_medium_step_share": 0.4,
                                           "severity_high_step_share": 0.5})).severity == "low"
    for retired in ("sync_high_severity_pct", "high_severity_idle_share"):
        with pytest.raises(ValueError, match="unknown threshold"):
            analyze(path, thresholds={retired: 1.0})


def test_one_off_costs_rank_after_every_steady_finding_of_their_severity(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0.0)
    trace.step(2, STEP_US)
    # Step 1: 80 ms of context creation (one-off). Step 2: a 17 µs synchronize in the user's loop.
    trace.op("aten::to", 9_990, 80_000)
    trace.call("cudaDeviceGetStreamPriorityRange", 10_000, 79_980)
    trace.py("train.py(10): train", STEP_US + 10_000, 80_000)
    trace.call("cudaDeviceSynchronize", STEP_US + 10_010, 17)
    result = analyze(trace.write(tmp_path))
    kinds = [f.kind for f in result.findings if f.severity == "low"]
    assert "one_off" in kinds and "sync_point" in kinds
    assert kinds.index("sync_point") < kinds.index("one_off")
    (one_off,) = [f for f in result.findings if f.kind == "one_off"]
    assert one_off.gpu_ms_per_step == 0.0 and one_off.cost_ms == pytest.approx(80.0, abs=0.1)


def test_a_sync_inside_a_cudnn_search_belongs_to_the_warm_up_finding(tmp_path):
    # cuDNN's benchmark search waits on each candidate's kernel: those waits are the warm-up's cost.
    trace = TraceBuilder()
    trace.step(1, 0.0)
    trace.op("aten::cudnn_convolution", 9_990, 80_005)
    for i in range(20):
        start = 10_000 + i * 4_000
        trace.call("cudaLaunchKernel", start, 10, kernels=[(start + 20, 1_000)])
        trace.call("cudaEventSynchronize", start + 100, 1_000)
    result = analyze(trace.write(tmp_path))
    assert not [f for f in result.findings if f.kind == "sync_point"]
    assert [f for f in result.findings if f.kind == "one_off" and "cudnn" in f.title]
    assert result.steps[0].syncs.blocked_ms == pytest.approx(20.0)  # still the step's blocked time


def _fixture_dirs() -> list[str]:
    dirs = [p for group in ("traces", "thirdparty", "stacks") for p in sorted((FIXTURES / group).iterdir())]
    dirs += sorted(p.parent for p in (FIXTURES / "busy").glob("*/*/*.pt.trace.json.gz"))
    return [str(p.relative_to(FIXTURES)) for p in dirs if p.is_dir()]


# The verdicts the shared and third-party traces keep (checked in detail by test_thirdparty and
# test_analysis; here all at once, with the severity contract).
VERDICTS = {
    "traces/ddp_straggler": "straggler: rank 1",
    "traces/gpt2_clean": "launch-bound",
    "traces/gpt2_pathologies": "launch-bound",
    "thirdparty/hta_cp_simple_add": "mixed",
    "thirdparty/hta_trace_diff_control": "communication-bound",
    "thirdparty/kineto_resnet50_num_workers_4": "launch-bound",
    "thirdparty/param_resnet_kineto": "input-bound",
    "thirdparty/tl_b200_eager": "host-bound",
    "thirdparty/tl_h100_bert_small": "mixed",
    "thirdparty/tl_mi300_resnet_act_ckpt": "communication-bound",
    "thirdparty/tl_xdit_flux_aiter_sage": "gpu-bound",
}


@functools.cache
def _analysed(folder: str) -> Analysis:
    return analyze(FIXTURES / folder)


@pytest.mark.parametrize("folder", _fixture_dirs())
def test_no_finding_is_high_unless_it_costs_the_gpu_a_fifth_of_its_step(folder):
    result = _analysed(folder)
    if folder in VERDICTS:
        assert result.summary.verdict == VERDICTS[folder]
    for finding in result.findings:
        if finding.severity == "info":
            continue
        assert finding.gpu_ms_per_step is not None, finding.kind
        if finding.severity == "high":
            # The step a finding is judged against: the un-profiled one where the profiler slowed it.
            steps = [_judged_step(t) for t in result.traces if t.rank == finding.rank] or [
                _judged_step(t) for t in result.traces
            ]
            assert finding.gpu_ms_per_step >= 0.2 * min(steps), (finding.kind, finding.title)


def _judged_step(trace) -> float:
    return trace.step_basis.judged_ms


# Judged across ranks (the ranks' median step), not by one trace's step basis.
ACROSS_RANKS = frozenset({"straggler", "profiler_skew", "slow_collective"})


@pytest.mark.parametrize("folder", _fixture_dirs())
def test_one_trace_has_one_bar_for_all_its_findings(folder):
    """Every finding of a trace is judged against its one judged step (`StepBasis.judged_ms`), idle
    and busy findings alike: before, each module handed the rule its own step (the host's window for
    GPU-idle findings, the GPU's step for busy ones). At the default bars that changed no fixture's
    severities (against main's outputs, 2026-11-29): no trace whose host ran ahead has a GPU-idle
    finding near a bar; `test_step_basis` moves the bar to show the change."""
    result = _analysed(folder)
    for finding in result.findings:
        if finding.severity == "info" or finding.gpu_ms_per_step is None or finding.kind in ACROSS_RANKS:
            continue
        (trace,) = [t for t in result.traces if (t.rank, t.window) == (finding.rank, finding.window)]
        expected = severity_for(finding.gpu_ms_per_step, trace.step_basis.judged_ms, Thresholds())
        assert finding.severity == expected, (finding.kind, finding.title)


@pytest.mark.parametrize("folder", _fixture_dirs())
def test_the_findings_of_a_step_never_put_more_gpu_time_at_stake_than_it_has(folder):
    # Per trace, the GPU time its findings could win back adds up to at most its step as the GPU
    # runs it (idle + busy: the longer of the host's window and the GPU's step). The straggler's
    # time is the other ranks' wait for it: it counts on theirs; a finding across ranks on every one.
    result = _analysed(folder)
    straggler = next((f.rank for f in result.findings if f.kind == "straggler"), None)
    for trace in result.traces:
        at_stake = sum(
            f.gpu_ms_per_step or 0.0
            for f in result.findings
            if (f.rank is None and f.window is None)
            or (f.kind == "straggler" and trace.rank != straggler)
            or (f.kind != "straggler" and f.rank == trace.rank and f.window in (None, trace.window))
        )
        step_ms = max(trace.verdict.step_ms, trace.busy.step_ms if trace.busy is not None else 0.0)
        if trace.profiler is not None and trace.profiler.slowed:  # all the time an un-profiled step has
            step_ms = trace.profiler.judged_step_ms
        assert at_stake <= step_ms * (1 + 1e-6), [(f.kind, f.gpu_ms_per_step) for f in result.findings]


@pytest.mark.parametrize(
    ("folder", "cause"),
    [
        ("busy/fp32_mlp/fp32", "device_synchronize"),  # the host waits for GEMMs that run anyway
        ("busy/gpt2_attention/eager", "pageable_copy"),  # transformers' eager_mask at 96.8% GPU busy
        ("thirdparty/hta_cp_simple_add", "device_synchronize"),  # 0.006-0.08 ms syncs
        ("thirdparty/hta_trace_diff_control", "d2h_copy"),  # 13 and 94 ms reads, GPU busy meanwhile
        ("thirdparty/tl_h100_bert_small", "device_synchronize"),
    ],
)
def test_syncs_that_cost_the_gpu_nothing_are_low(folder, cause):
    result = analyze(FIXTURES / folder)
    syncs = [f for f in result.findings if f.kind == "sync_point" and f.details.cause == cause]
    assert syncs and all(f.severity == "low" for f in syncs)


def test_context_creation_stays_out_of_the_steady_ranking():
    result = analyze(FIXTURES / "thirdparty/hta_cp_simple_add")
    kinds = [f.kind for f in result.findings if f.severity != "info"]
    one_offs = [i for i, kind in enumerate(kinds) if kind == "one_off"]
    steady = [i for i, kind in enumerate(kinds) if kind != "one_off"]
    assert one_offs and steady and max(steady) < min(one_offs)
    assert any("context creation" in f.title for f in result.findings if f.kind == "one_off")
