"""Reports render what the analysis holds: headline, findings, kernels; JSON is exact."""

from __future__ import annotations

import io
import json

from trainprof.analysis.causes import Cause, CauseCosts
from trainprof.analysis.idle import StepIdle
from trainprof.analysis.launch import StepLaunch
from trainprof.analysis.result import Analysis, Finding, Step, Summary, Where
from trainprof.analysis.steps import StepTimes
from trainprof.analysis.syncs import StepSyncs
from trainprof.report.console import print_report, render_text
from trainprof.report.json import dumps, write_json
from trainprof.report.markdown import render_markdown


def _step(number: int, duration_ms: float, gpu_busy_pct: float, kernel_count: int, sync_count: int) -> Step:
    """A step row with the fields the reports show; the rest zero."""
    times = StepTimes(
        number=number, rank=None, start_ms=0.0, duration_ms=duration_ms, gpu_busy_ms=0.0,
        gpu_busy_pct=gpu_busy_pct, gpu_idle_ms=0.0, kernel_ms=0.0, comm_ms=0.0, memcpy_ms=0.0,
        memset_ms=0.0, kernel_count=kernel_count, kernels_launched_before_trace=0, comm_kernel_count=0,
        cpu_op_ms=0.0, cuda_runtime_ms=0.0, launch_count=0, launch_ms=0.0,
    )
    launch = StepLaunch(0, 0.0, 0.0, 0, 0, 0.0)
    syncs = StepSyncs(sync_count, 0.0)
    return Step(times=times, syncs=syncs, launch=launch, idle=None, peak_memory_bytes=None)


ANALYSIS = Analysis(
    summary=Summary(verdict="sync-bound", mean_step_ms=41.25, gpu_busy_pct=61.5, syncs_per_step=2.0,
                    kernels_per_step=412, peak_memory_bytes=3326501273),
    files=["/runs/a/w.123.pt.trace.json.gz"],
    steps=[_step(3, duration_ms=41.0, gpu_busy_pct=60.0, kernel_count=410, sync_count=2)],
    findings=[
        Finding(kind="sync_point", title="GPU sync in the loop", severity="high", op="aten::item",
                where=Where("/home/me/train.py", 49, "train"), count=6, per_step=2.0, cost_ms=3.25,
                fix="keep the loss on the GPU; log every N steps"),
        Finding(kind="memory_fragmentation", title="idle GPU", severity="low", op=None, where=Where(),
                count=1, per_step=None, cost_ms=None, fix="overlap input"),
    ],
)


def test_console_report_shows_headline_and_findings():
    out = io.StringIO()
    print_report(ANALYSIS, file=out)
    text = out.getvalue()
    for expected in ("sync-bound", "41.2", "61.5", "412", "3.10 GiB", "aten::item", "train.py:49 train",
                     "3.25", "keep the loss on the GPU"):
        assert expected in text, expected


def test_plain_text_and_markdown_carry_the_same_content():
    for text in (render_text(ANALYSIS), render_markdown(ANALYSIS)):
        for expected in ("sync-bound", "41.2 ms", "aten::item", "train.py:49 train", "3.25", "overlap input"):
            assert expected in text, expected
    assert "| 3 | 41.0 | 60.0 | 410 | 2 |" in render_markdown(ANALYSIS)


def test_json_is_exactly_the_analysis(tmp_path):
    document = ANALYSIS.to_dict()
    assert json.loads(dumps(ANALYSIS)) == document
    assert json.loads(write_json(ANALYSIS, tmp_path / "summary.json").read_text()) == document
    assert json.loads(dumps({"x": float("nan")})) == {"x": None}
    assert next(iter(document)) == "schema_version" and document["schema_version"] == 2
    assert document["steps"][0]["sync_count"] == 2 and document["trace"]["step_count"] == 1


def test_idle_costs_by_cause_write_the_per_cause_keys():
    """A step's idle costs are a row indexed by `Cause`; JSON keeps one `idle_<cause>_ms` key per cause."""
    costs = CauseCosts(tuple(float(cause) + 0.5 for cause in Cause))
    row = StepIdle(costs=costs, one_off_ms=1.25, gap_count=3).to_dict()
    causes = ("launch", "sync", "blocking", "warmup", "input", "host", "comm", "unknown", "profiler")
    assert list(row) == [f"idle_{c}_ms" for c in causes] + ["idle_one_off_ms", "idle_gap_count"]
    assert [row[f"idle_{cause.key}_ms"] for cause in Cause] == list(costs.ms)
    assert costs[Cause.HOST] == 5.5 and dict(costs.items())[Cause.PROFILER] == 8.5
    assert (row["idle_one_off_ms"], row["idle_gap_count"]) == (1.25, 3)


def test_reports_render_a_real_analysis(tmp_path):
    """The renderers read the shape `analyze()` produces, from a trace torch's profiler wrote."""
    import torch

    import trainprof

    model = torch.nn.Linear(16, 16)
    with torch.profiler.profile() as prof:
        for step in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                model(torch.randn(4, 16)).sum().backward()
    path = tmp_path / "w.1234567890123.pt.trace.json"
    prof.export_chrome_trace(str(path))
    result = trainprof.analyze(str(path))
    summary = result.summary
    out = io.StringIO()
    print_report(result, file=out)
    for text in (out.getvalue(), render_text(result), render_markdown(result)):
        assert summary.verdict == "cpu-only" and "cpu-only" in text
        assert f"{summary.mean_step_ms:,.1f} ms" in text  # the headline's step time, as computed
        assert "w.1234567890123.pt.trace.json" in text


def test_a_cpu_run_headline_has_no_gpu_rows(cpu_only_trace):
    """Issue #37: a CPU run's headline said "GPU busy 0.0 %" and "kernels / step 0": zeros that
    nothing measured."""
    from trainprof.analysis import analyze
    from trainprof.report._format import headline

    analysis = analyze(cpu_only_trace)
    labels = [label for label, _ in headline(analysis)]
    assert analysis.summary.verdict == "cpu-only" and "step time" in labels
    assert "GPU busy" not in labels and "kernels / step" not in labels
