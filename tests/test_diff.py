"""trainprof.analysis.diff on two real H200 fixtures (gpt2_pathologies -> gpt2_clean) and on minimal
synthetic traces; the `trainprof diff` command line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from trainprof.analysis.diff import ADDED, REMOVED, SAME, TraceDiff, diff_traces, range_cost
from trainprof.cli import main


@pytest.fixture(scope="module")
def fixture_diff(fixtures_dir):
    return diff_traces(fixtures_dir / "traces/gpt2_pathologies", fixtures_dir / "traces/gpt2_clean")


def test_fixture_diff_per_step_headline(fixture_diff):
    head = {row.metric: (row.a, row.b) for row in fixture_diff.headline}
    assert fixture_diff.a.steps == 3 and fixture_diff.b.steps == 3
    # The per-parameter grad-norm loop (~230 tiny kernels) is gone; fused AdamW replaces foreach.
    assert head["kernels / step"] == (820.0, 591.0)
    assert head["launches / step"] == (820.0, 591.0)
    # Two .item() syncs and a pageable copy per step in A; none in B.
    assert head["syncs / step"][0] == 3.0 and head["syncs / step"][1] == 0.0


def test_fixture_diff_removed_loop_ops_and_kernels(fixture_diff):
    pow_row = fixture_diff.op("aten::pow")
    assert pow_row.calls_a == 94.0 and pow_row.calls_b == 18.0  # 76 loop calls (one per parameter) gone
    assert fixture_diff.op("aten::sum").calls_a - fixture_diff.op("aten::sum").calls_b == 152.0
    # Fused AdamW appears, the foreach AdamW pieces go.
    assert fixture_diff.op("aten::_fused_adamw_").status == ADDED
    assert fixture_diff.op("aten::_foreach_addcdiv_").status == REMOVED
    sum_kernels = [
        k
        for k in fixture_diff.kernels
        if k.kind == "kernel" and "sum_functor<float" in k.name and k.status == REMOVED
    ]
    assert sum_kernels and sum_kernels[0].count_a == 76.0  # the loop's .sum() of each parameter


def test_fixture_diff_memcpy_change(fixture_diff):
    copies = {k.name: k for k in fixture_diff.kernels if k.kind == "memcpy"}
    assert copies["Memcpy HtoD (Pageable -> Device)"].status == REMOVED
    assert copies["Memcpy HtoD (Pinned -> Device)"].status == ADDED
    assert copies["Memcpy DtoH (Device -> Pinned)"].count_a == 2.0  # the two .item() reads
    assert copies["Memcpy DtoH (Device -> Pinned)"].status == REMOVED


def test_diff_reads_back_from_its_json_form(fixture_diff):
    """An A/B result carries its diffs as JSON; the report reads them back into a TraceDiff."""
    data = json.loads(json.dumps(fixture_diff.to_dict()))
    assert TraceDiff.from_dict(data) == fixture_diff


def test_fixture_diff_findings(fixture_diff):
    changes = {(c.kind, c.status) for c in fixture_diff.findings}
    assert ("sync_point", REMOVED) in changes
    assert not any(c.kind == "sync_point" and c.status == ADDED for c in fixture_diff.findings)
    top = next(c for c in fixture_diff.findings if c.kind == "top_kernels")
    assert top.per_step_a == 820.0 and top.per_step_b == 591.0


def test_same_trace_diffs_to_nothing(fixtures_dir):
    clean = fixtures_dir / "traces/gpt2_clean"
    result = diff_traces(clean, clean)
    assert all(row.status == SAME for row in result.ops + result.kernels)
    assert all(change.status == "changed" for change in result.findings)


# ---- minimal synthetic traces -------------------------------------------------------------------


def _event(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _kernel(name, ts, dur, correlation):
    """A kernel on device 0's stream 7, run by the launch of the same `correlation`."""
    return {**_event(name, "kernel", ts, dur, tid=7, correlation=correlation, device=0, stream=7), "pid": 0}


def _trace(path: Path, with_gelu: bool) -> Path:
    """One step: an annotated range holding an op whose launch runs a kernel; optionally a gelu op."""
    events = [_event("ProfilerStep#1", "user_annotation", 0, 1000)]
    events += [
        _event("trainprof.ab.replaced", "user_annotation", 100, 300),
        _event("aten::layer_norm", "cpu_op", 110, 200),
        _event("cudaLaunchKernel", "cuda_runtime", 150, 10, correlation=1),
        _kernel("layer_norm_kernel", 170, 50, correlation=1),
    ]
    if with_gelu:
        events += [
            _event("aten::gelu", "cpu_op", 500, 100),
            _event("cudaLaunchKernel", "cuda_runtime", 520, 10, correlation=2),
            _kernel("gelu_kernel", 540, 30, correlation=2),
        ]
    path.mkdir(parents=True, exist_ok=True)
    file = path / "worker.1.pt.trace.json.gz"
    file.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return file


def test_synthetic_diff_op_removed(tmp_path):
    a, b = _trace(tmp_path / "a", with_gelu=True), _trace(tmp_path / "b", with_gelu=False)
    result = diff_traces(a, b)
    gelu = result.op("aten::gelu")
    assert gelu.status == REMOVED and gelu.calls_a == 1.0 and gelu.gpu_ms_a == 0.03 and gelu.kernels_a == 1.0
    layer_norm = result.op("aten::layer_norm")
    assert layer_norm.status == SAME and layer_norm.gpu_ms_a == layer_norm.gpu_ms_b == 0.05
    kernels = {k.name: k.status for k in result.kernels}
    assert kernels == {"gelu_kernel": REMOVED, "layer_norm_kernel": SAME}


def test_synthetic_range_cost(tmp_path):
    file = _trace(tmp_path / "a", with_gelu=True)
    cost = range_cost(file, "trainprof.ab.replaced")
    # Only the layer_norm kernel was launched inside the range; the range's host time is 300 µs.
    assert cost == {
        "gpu_ms_per_step": 0.05,
        "kernels_per_step": 1.0,
        "host_ms_per_step": 0.3,
        "ranges_per_step": 1.0,
    }


def test_cli_diff_json_and_bad_input(tmp_path, capsys):
    a, b = _trace(tmp_path / "a", with_gelu=True), _trace(tmp_path / "b", with_gelu=False)
    assert main(["diff", str(a), str(b), "--json", "--markdown", str(tmp_path / "diff.md")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"a", "b", "headline", "ops", "kernels", "findings"}
    assert "aten::gelu" in (tmp_path / "diff.md").read_text()
    assert main(["diff", str(a), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error:") and err.count("\n") == 1
    assert main(["diff", str(a), str(b)]) == 0
    assert "aten::gelu" in capsys.readouterr().out


def test_diff_names_its_runs_and_shows_change_and_ratio(fixture_diff, capsys):
    """The two runs are named by their folders (not `a`/`b`), and each figure has its change and ratio."""
    from trainprof.report.ab import diff_tables, print_diff

    assert (fixture_diff.a.name, fixture_diff.b.name) == ("gpt2_pathologies", "gpt2_clean")
    headline, ops, *_ = diff_tables(fixture_diff)
    columns = [c.name for c in headline.columns]
    assert columns == ["metric", "gpt2_pathologies", "gpt2_clean", "change", "ratio"]
    kernels = next(row for row in headline.rows if row[0] == "kernels / step")
    assert kernels[1:] == ("820.00", "591.00", "-229.00", "0.72x")
    assert {"GPU ms gpt2_clean", "GPU ms change", "GPU ms ratio"} <= {c.name for c in ops.columns}
    print_diff(fixture_diff, width=120)
    out = capsys.readouterr().out
    assert "gpt2_pathologies" in out and "gpt2_clean" in out and "ratio" in out


def test_diff_of_two_files_of_one_name_falls_back_to_a_and_b(tmp_path):
    a, b = _trace(tmp_path / "x", with_gelu=True), _trace(tmp_path / "y", with_gelu=False)
    assert a.name == b.name
    result = diff_traces(a, b)
    assert (result.a.name, result.b.name) == ("a", "b")
    assert diff_traces(a, b, names=("before", "after")).b.name == "after"


def test_a_run_whose_host_ran_ahead_is_compared_by_its_gpu_step(fixtures_dir):
    """Two H200 runs of a 128,256-token head (tests/fixtures/busy/vocab_head): the bare loop's host
    ran ahead of the GPU (21.5 ms step windows, 49.7 ms steps; 51.0 ms timed without the profiler),
    Liger's did not (48.3 and 48.8; 49.1). By the windows Liger's loss made the step 2.25x longer;
    the GPU steps say 0.98x, as the loops' own timing does (0.96x)."""
    result = diff_traces(fixtures_dir / "busy/vocab_head/bare", fixtures_dir / "busy/vocab_head/liger_flce")
    head = {row.metric: row for row in result.headline}
    assert list(head)[:2] == ["step ms (host window)", "GPU step ms"]
    assert head["step ms (host window)"].ratio > 2
    assert 0.9 < head["GPU step ms"].ratio < 1.0
    plain = diff_traces(fixtures_dir / "traces/gpt2_pathologies", fixtures_dir / "traces/gpt2_clean")
    assert "GPU step ms" not in {row.metric for row in plain.headline}
