"""Reports render what the analysis holds: headline, findings, kernels; JSON is exact."""

from __future__ import annotations

import io
import json

from trainprof.report.console import print_report, render_text
from trainprof.report.json import dumps, write_json
from trainprof.report.markdown import render_markdown

# The shape `Analysis.to_dict()` has: the headline numbers live in `trace["summary"]`.
ANALYSIS = {
    "trace": {"files": ["/runs/a/w.123.pt.trace.json.gz"],
              "summary": {"verdict": "sync-bound", "mean_step_ms": 41.25, "gpu_busy_pct": 61.5,
                          "syncs_per_step": 2.0, "kernels_per_step": 412, "peak_memory_bytes": 3326501273}},
    "steps": [{"step": 3, "duration_ms": 41.0, "gpu_busy_pct": 60.0, "kernel_count": 410, "sync_count": 2}],
    "findings": [{"kind": "sync", "title": "GPU sync in the loop", "severity": "high", "op": "aten::item",
                  "where": {"file": "/home/me/train.py", "line": 49, "function": "train"}, "count": 6,
                  "per_step": 2.0, "cost_ms": 3.25, "fix": "keep the loss on the GPU; log every N steps"},
                 {"kind": "idle", "title": "idle GPU", "severity": "low", "op": None,
                  "where": {"file": None, "line": None, "function": None}, "count": 1,
                  "per_step": None, "cost_ms": None, "fix": "overlap input"}],
}


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
    assert json.loads(dumps(ANALYSIS)) == ANALYSIS
    assert json.loads(write_json(ANALYSIS, tmp_path / "summary.json").read_text()) == ANALYSIS
    assert json.loads(dumps({"x": float("nan")})) == {"x": None}


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
    result = trainprof.analyze(str(path)).to_dict()
    summary = result["trace"]["summary"]
    out = io.StringIO()
    print_report(result, file=out)
    for text in (out.getvalue(), render_text(result), render_markdown(result)):
        assert summary["verdict"] == "cpu-only" and "cpu-only" in text
        assert f"{summary['mean_step_ms']:,.1f} ms" in text  # the headline's step time, as computed
        assert "w.1234567890123.pt.trace.json" in text
