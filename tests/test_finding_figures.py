"""Every figure of a finding says its unit and scope (`trainprof.analysis.figures`), in the same words
in the console, report.md, report.html and the JSON: the GPU time at stake per step and its share of
the step, what a count counts, what a cost measures and over what; memory findings no time at all.

Before: `347.0 per step` (of what?), `cost 19.23 ms in all` beside an op (the predicted saving over
the recorded steps, read as the op's cost) and `cost 0.00 ms in all` on memory findings.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import pytest

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.figures import FIGURES
from trainprof.report._format import finding_facts, gpu_at_stake
from trainprof.report.console import render_text
from trainprof.report.html import render_html
from trainprof.report.markdown import render_markdown

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
FOLDERS = [
    "busy/llama_swap/bare",  # fusible layers: 347 kernels per step
    "busy/vocab_head/bare",  # a memory finding
    "busy/small_mlp/eager",  # launch overhead and host code, judged un-profiled
    "thirdparty/hta_cp_simple_add",  # syncs and one-off costs
    "thirdparty/tl_mi300_resnet_act_ckpt",  # exposed communication
]


@functools.cache
def _analysed(folder: str) -> Analysis:
    return analyze(FIXTURES / folder)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_figure_stands_without_its_unit(folder):
    result = _analysed(folder)
    for finding in result.findings:
        for fact in finding_facts(finding, result):
            assert not re.fullmatch(r"[\d.,]+ per step", fact), (finding.kind, fact)
            assert "in all" not in fact, (finding.kind, fact)
            if fact.startswith("cost "):
                assert re.fullmatch(r"cost [\d.,]+ ms .+", fact), fact
    for text in (render_text(result), render_markdown(result), render_html(result)):
        assert "ms in all" not in text and "cost ms, all steps" not in text


def test_a_count_per_step_says_what_it_counts():
    result = _analysed("busy/llama_swap/bare")
    (fusion,) = [f for f in result.findings if f.kind == "fusible_layers"]
    assert fusion.per_step == 347.0
    facts = finding_facts(fusion, result)
    assert "347 kernels per step" in facts
    # Its cost over the recorded steps is its gain again: said once, per step, with its share.
    assert not [fact for fact in facts if fact.startswith("cost")]
    pct = 100 * fusion.gpu_ms_per_step / result.traces[0].step_basis.judged_ms
    assert f"at stake {fusion.gpu_ms_per_step:.2f} ms of GPU time per step ({pct:.0f}% of the step)" in facts


def test_a_cost_says_what_it_measures():
    result = _analysed("thirdparty/hta_cp_simple_add")
    sync = next(f for f in result.findings if f.kind == "sync_point")
    facts = finding_facts(sync, result)
    assert f"cost {sync.cost_ms:,.2f} ms of CPU time blocked in the syncs, over the recorded steps" in facts
    assert f"{sync.per_step:g} syncs per step" in facts
    trainer = _analysed("stacks/hf_trainer_session")  # an `.item()` once a step
    once = [f for f in trainer.findings if f.kind == "sync_point" and f.per_step == 1.0]
    assert once and all("1 sync per step" in finding_facts(f, trainer) for f in once)
    # 3.9 ms of GPU time per step of a 41.6 s step (the trace's first step holds the context creation).
    assert any(fact.endswith("(under 1% of the step)") for fact in facts)
    one_off = next(f for f in result.findings if f.kind == "one_off")
    facts = finding_facts(one_off, result)
    assert f"cost {one_off.cost_ms:,.2f} ms of GPU idle time, once" in facts
    assert not [fact for fact in facts if fact.startswith("at stake")]  # paid once, not per step


@pytest.mark.parametrize("folder", ["busy/vocab_head/bare", "busy/llama_swap/bare"])
def test_memory_findings_say_no_time(folder):
    result = _analysed(folder)
    (memory,) = [f for f in result.findings if f.kind == "memory_peak"]
    assert memory.cost_ms == 0.0 and memory.gpu_ms_per_step == 0.0  # the JSON keeps its fields
    assert not [fact for fact in finding_facts(memory, result) if " ms" in fact]
    document = next(f for f in result.to_dict()["findings"] if f["kind"] == "memory_peak")
    assert (document["gpu_step_pct"], document["cost_of"], document["count_of"]) == (None, None, None)


def test_the_same_words_in_every_report_and_the_json():
    result = _analysed("busy/llama_swap/bare")
    (fusion,) = [f for f in result.findings if f.kind == "fusible_layers"]
    at_stake = gpu_at_stake(fusion, result.gpu_step_pct(fusion))
    assert at_stake.startswith(f"{fusion.gpu_ms_per_step:.2f} ms of GPU time per step (")
    assert at_stake in render_text(result)
    assert at_stake in render_markdown(result)
    assert html.escape(at_stake) in render_html(result)
    markdown = render_markdown(result)
    assert "| per step | GPU time at stake | cost |" in markdown and "| 347 kernels |" in markdown
    document = next(f for f in result.to_dict()["findings"] if f["kind"] == "fusible_layers")
    # The old fields stay; beside them what each measures, in the reports' words.
    assert document["gpu_ms_per_step"] == fusion.gpu_ms_per_step and document["per_step"] == 347.0
    assert document["count_of"] == "kernels" and document["cost_of"] is None
    judged = result.traces[0].step_basis.judged_ms
    assert document["gpu_step_pct"] == round(100 * fusion.gpu_ms_per_step / judged, 2)
    sync = next(f for f in _analysed("thirdparty/hta_cp_simple_add").to_dict()["findings"]
                if f["kind"] == "sync_point")
    assert sync["cost_of"] == "ms of CPU time blocked in the syncs, over the recorded steps"


def _kinds_in_source() -> set[str]:
    """Every finding kind the analysis makes: `kind="..."` in its modules, the busy findings' kinds
    (passed to `_Context.finding` first) and the GPU-idle causes' (`_CAUSE_FINDINGS`)."""
    source = "".join(path.read_text() for path in (ROOT / "trainprof" / "analysis").glob("*.py"))
    kinds = set(re.findall(r'kind="([a-z_]+)"', source)) - {"stable"}
    kinds |= set(re.findall(r'context\.finding\(\s*"([a-z_]+)"', source))
    kinds |= set(re.findall(r'\(\s*Cause\.[A-Z]+,\s*"([a-z_]+)"', source))
    return kinds


def test_every_kind_has_its_figures():
    kinds = _kinds_in_source()
    assert {"sync_point", "fusible_layers", "profiler_overhead", "memory_peak"} <= kinds
    assert kinds <= set(FIGURES), sorted(kinds - set(FIGURES))
