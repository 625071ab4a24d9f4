"""report.html as a file: one document that needs nothing from the network, whose trace-derived text
is always text, whose drawings' data is the analysis's views, bounded in size; written by every
session (`write_reports`) and by `trainprof report`. What a browser makes of it: test_browser.py."""

from __future__ import annotations

import html
import json
import logging
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.thresholds import TIMELINE_EVENTS_PER_LANE
from trainprof.cli import main
from trainprof.report import output_names, ranks, write_reports
from trainprof.report._format import headline
from trainprof.report.html import DATA_ELEMENT, prose, render_html

# The elements report.html is made of: a name from a trace becoming an element would show here.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "p", "nav", "a", "section",
    "div", "span", "b", "i", "code", "dl", "dt", "dd", "table", "thead", "tbody", "tr", "th", "td", "svg",
    "polygon", "polyline", "line", "details", "summary", "select", "option", "button", "script",
}
MAX_REPORT_BYTES = 1_500_000
"""A bound on report.html for the fixtures (the largest, ddp_straggler's two ranks, is ~0.5 MB)."""


class _Markup(HTMLParser):
    """The tags and attributes of a document, and its scripts' types."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.urls: list[str] = []
        self.scripts: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for name, value in attrs:
            self.attributes.add(name)
            if name in ("src", "href", "action", "srcset", "poster", "data"):
                self.urls.append(value or "")
        if tag == "script":
            self.scripts.append(dict(attrs).get("type"))


def _markup(page: str) -> _Markup:
    parser = _Markup()
    parser.feed(page)
    return parser


def _data(page: str) -> dict:
    block = re.search(rf'<script type="application/json" id="{DATA_ELEMENT}">(.*?)</script>', page, re.S)
    assert block is not None
    return json.loads(block.group(1))


@pytest.fixture(scope="module")
def pathologies_page(fixtures_dir):
    analysis = analyze(fixtures_dir / "traces" / "gpt2_pathologies", views=True)
    return analysis, render_html(analysis)


@pytest.fixture(scope="module")
def hostile_page(hostile_trace):
    return render_html(analyze(hostile_trace.folder, views=True))


def test_report_needs_nothing_from_the_network(pathologies_page):
    _, page = pathologies_page
    markup = _markup(page)
    assert markup.tags <= ALLOWED_TAGS
    assert "link" not in markup.tags and "iframe" not in markup.tags and "img" not in markup.tags
    assert all(url.startswith("#") for url in markup.urls)  # in-page links only
    assert markup.scripts == ["application/json", None]  # the data block and the inlined script
    lowered = page.lower()
    fetches = ("http://", "https://", "@import", "url(", "fetch(", "xmlhttprequest", "import(", "//cdn")
    for fetching in fetches:
        assert fetching not in lowered, fetching


def test_report_shows_the_analysis(pathologies_page):
    analysis, page = pathologies_page
    assert "launch-bound" in page and f"{analysis.summary.mean_step_ms:,.1f} ms" in page
    assert page.count('<div class="bar">') == len(analysis.steps)
    shown = [f for f in analysis.findings if f.kind not in ("top_kernels", "module_costs")]
    assert page.count('<div class="finding ') == len(shown)
    assert shown[0].fix.split()[0] in page
    sections = ("summary", "steps", "findings", "timeline", "ops", "kernels", "modules", "memory", "flame")
    for section in sections:
        assert f'<section id="{section}">' in page
    assert 'id="ranks"' not in page  # one rank
    # The drawings' data is the views', bounded per lane.
    data = _data(page)
    view = analysis.traces[0].views.timeline
    drawn = data["traces"][0]["timeline"]
    assert len(drawn["lanes"]) == len(view.lanes) and drawn["strings"] == view.strings
    for lane, source in zip(drawn["lanes"], view.lanes, strict=True):
        assert len(lane["start"]) == len(source.start_us) <= TIMELINE_EVENTS_PER_LANE
        starts = [sum(lane["start"][: i + 1]) for i in range(0, len(lane["start"]), 500)]
        assert starts == pytest.approx(source.start_us[::500].tolist(), abs=0.02)  # deltas add up
    assert len(data["traces"][0]["flame"]["parent"]) == len(analysis.traces[0].views.flame.parent)
    assert [cause["key"] for cause in data["causes"]][:2] == ["launch", "sync"]


def test_device_peaks_are_a_few_words_with_their_source_in_the_tooltip(pathologies_page):
    analysis, page = pathologies_page
    summary = analysis.summary
    assert summary.peaks_label == "H200 (measured)"
    assert "2026-11-25" in summary.peaks_source and len(summary.peaks_source) > 80  # the detail: JSON
    (shown,) = [value for label, value in headline(analysis) if label == "device peaks"]
    assert shown == summary.peaks_label
    card = re.search(r'<div class="card" title="([^"]*)"><div class="label">device peaks</div>'
                     r'<div class="value">([^<]*)</div>', page)
    assert card is not None and card.group(2) == "H200 (measured)"
    assert html.unescape(card.group(1)) == summary.peaks_source


def test_hostile_names_are_text(hostile_page, hostile_trace):
    page = hostile_page
    for name in (hostile_trace.kernel, hostile_trace.op, hostile_trace.python):
        assert name not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # in the kernel table, as text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    markup = _markup(page)
    assert markup.tags <= ALLOWED_TAGS and "img" not in markup.tags
    assert not [a for a in markup.attributes if a.startswith("on")]
    assert markup.scripts == ["application/json", None]
    # In the data block no name can close the element: every < is an escape, and the names are whole.
    block = page.split(f'id="{DATA_ELEMENT}">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block and ">" not in block
    data = _data(page)
    assert hostile_trace.kernel in data["traces"][0]["timeline"]["strings"]
    assert hostile_trace.python in data["traces"][0]["flame"]["strings"]


@pytest.mark.parametrize(
    "fixture", ["traces/gpt2_clean", "traces/ddp_straggler", "thirdparty/tl_h100_bert_small"]
)
def test_report_size_is_bounded(fixtures_dir, fixture):
    analysis = analyze(fixtures_dir / fixture, views=True)
    page = render_html(analysis)
    assert len(page.encode()) < MAX_REPORT_BYTES
    data = _data(page)
    assert len(data["traces"]) == len(analysis.traces)
    for trace in data["traces"]:
        assert all(len(lane["start"]) <= TIMELINE_EVENTS_PER_LANE for lane in trace["timeline"]["lanes"])
    if len(analysis.traces) > 1:
        assert '<section id="ranks">' in page and 'id="trace-select"' in page


def test_ranks_section_shows_the_cross_rank_report_as_the_console_does(fixtures_dir):
    analysis = analyze(fixtures_dir / "traces" / "ddp_straggler")
    page = render_html(analysis)
    section = page[page.index('<section id="ranks">'):]
    section = section[: section.index("</section>")]
    for label, value in ranks.headline(analysis.cross_rank):  # the skew and the straggler
        assert f"<b>{label}</b>: {html.escape(value)}" in section
    tables = ranks.tables(analysis.cross_rank)
    assert [t.title.split()[0] for t in tables] == ["Ranks", "Collectives", "Longest"]
    for table in tables:
        heads = re.findall(r"<th[^>]*>([^<]*)</th>", section[section.index(html.escape(table.title)):])
        assert heads[: len(table.columns)] == [html.escape(column.name) for column in table.columns]
        for row in table.rows:
            cells = "".join(
                f'<td class="{"num" if column.numeric else "text"}"[^>]*>{re.escape(html.escape(cell))}</td>'
                for column, cell in zip(table.columns, row, strict=True)
            )
            assert re.search(cells, section), row
    by_rank = {row.rank: row for row in analysis.cross_rank.ranks}
    straggler, waiter = by_rank[1], by_rank[0]  # rank 1 arrives last; rank 0 waits for it
    assert analysis.cross_rank.straggler_rank == 1 and waiter.exposed_wait_ms_per_step > 40
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", section)
    assert "1 (straggler)" in cells and "0" in cells and "0 (straggler)" not in cells
    assert f"{waiter.exposed_wait_ms_per_step:,.1f}" in cells
    assert " ".join(f"{ms:,.1f}" for ms in straggler.step_ms_by_step) in cells


def test_single_rank_report_has_no_ranks_section(fixtures_dir):
    page = render_html(analyze(fixtures_dir / "thirdparty" / "tl_mi300_resnet_act_ckpt"))
    assert '<section id="ranks">' not in page and '<section id="findings">' in page


def test_report_without_views_has_no_drawings(fixtures_dir):
    page = render_html(analyze(fixtures_dir / "traces" / "gpt2_clean"))
    assert "<script" not in page and '<section id="findings">' in page and 'id="timeline"' not in page


def test_write_reports_writes_report_html_per_rank(tmp_path, fixtures_dir):
    analysis = analyze(fixtures_dir / "busy" / "llama_swap" / "bare", views=True)
    written = write_reports(analysis, tmp_path, tensorboard_scalars=False, console=False, rank=1)
    assert written["html"] == tmp_path / "report.rank1.html" == tmp_path / output_names(1)["html"]
    assert written["html"].read_text().startswith("<!doctype html>")
    assert output_names(None)["html"] == "report.html"


def test_a_failing_html_report_loses_nothing_else(tmp_path, fixtures_dir, monkeypatch, caplog):
    import trainprof.report.html as html_report

    def broken(analysis):
        raise ValueError("broken renderer")

    monkeypatch.setattr(html_report, "render_html", broken)
    analysis = analyze(fixtures_dir / "busy" / "llama_swap" / "bare")
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        written = write_reports(analysis, tmp_path, tensorboard_scalars=False, console=False)
    assert set(written) == {"summary", "report"} and written["summary"].is_file()
    assert not (tmp_path / "report.html").exists() and "report.html" in caplog.text


def test_cli_report_writes_the_page(tmp_path, fixtures_dir, capsys):
    out = tmp_path / "nested" / "out.html"
    assert main(["report", str(fixtures_dir / "busy" / "llama_swap" / "bare"), "--html", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>") and str(out) in capsys.readouterr().out
    run = tmp_path / "run"
    run.mkdir()
    for source in (fixtures_dir / "busy" / "llama_swap" / "bare").iterdir():
        (run / source.name).write_bytes(source.read_bytes())
    assert main(["report", str(run)]) == 0 and (run / "report.html").is_file()  # default: in the run


def test_cli_report_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text("{not json")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1
    assert not (tmp_path / "report.html").exists()


def test_demo_shows_the_shipped_gpu_run_first(tmp_path, capsys, monkeypatch):
    """Without a GPU, `trainprof demo` prints a real H200 run's report and writes its report.html
    before its own CPU loop (stubbed here: the loop is the session's tests' business)."""
    import trainprof.demo
    from trainprof.samples import sample_path

    assert len(list(sample_path().glob("*.pt.trace.json.gz"))) == 1  # shipped as package data
    ran = []
    monkeypatch.setattr(trainprof.demo, "run_demo", lambda **kwargs: ran.append(kwargs))
    monkeypatch.setattr(trainprof.demo, "demo_device", lambda device=None: "cpu")
    monkeypatch.setattr("trainprof.cli.analyze._cuda_available", lambda: False)
    assert main(["demo", "--log-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No GPU here: first, trainprof's report on a real GPU run")
    assert "NVIDIA H200" in out and "gpu-bound" in out and ran == [
        {"steps": 8, "log_dir": str(tmp_path), "device": None, "console": True}]
    page = (tmp_path / trainprof.demo.SAMPLE_FOLDER / "report.html").read_text()
    assert "NVIDIA H200" in page and 'id="timeline-chart"' in page


def test_demo_that_cannot_run_writes_nothing(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    assert main(["demo", "--device", "cpu"]) == 2
    assert capsys.readouterr().out == "" and not (tmp_path / "log").exists()


def test_cpu_only_run_draws_no_gpu_timeline(cpu_only_trace):
    analysis = analyze(cpu_only_trace, views=True)
    assert analysis.summary.verdict == "cpu-only"
    assert len(analysis.traces[0].views.timeline.idle.start_us) == 0  # no GPU to be idle
    page = render_html(analysis)
    assert 'id="timeline-chart"' not in page and 'id="kernels"' not in page
    assert 'id="flame-chart"' in page  # the host stacks are still there
    # What a CPU run can say (issue #37, item 6): the loop's structure per step, host time by op and
    # by module, the ops without GPU columns; no advice to turn on what the trace was recorded with.
    assert analysis.traces[0].views.recorded_with == {"with_stack": True, "profile_memory": True,
                                                      "record_shapes": True}
    host = analysis.traces[0].views.host
    assert [row.number for row in host.steps] == [s.times.number for s in analysis.steps]
    for row in host.steps:
        assert row.forward_ms > 0 and row.backward_ms > 0 and row.optimizer_ms > 0
        assert row.forward_ms + row.backward_ms + row.optimizer_ms + row.other_ms == pytest.approx(
            row.duration_ms, abs=1e-3)
    assert page.count('<span class="phase-backward" style="width:') == len(analysis.steps)
    assert '<section id="host-ops"><h2>Host time by op</h2>' in page
    assert host.modules and host.modules[0].module in page and "host ms / step" in page
    assert "GPU total ms" not in page and "GPU self ms" not in page
    text = re.sub(r"<(script|style).*?</\1>", "", page, flags=re.S)
    assert "with_stack=True" not in text and "profile_memory=True" not in text


def test_session_reports_without_drawings_when_they_fail(tmp_path, monkeypatch, caplog):
    import torch

    import trainprof
    import trainprof.analysis.views as views

    def broken(*args):
        raise ValueError("broken view")

    monkeypatch.setattr(views, "trace_views", broken)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1,
                               console=False, tensorboard_scalars=False, capture_syncs=False) as sess:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
    assert sess.summary.verdict == "cpu-only" and "drawings failed" in caplog.text
    page = (tmp_path / "run" / "report.html").read_text()
    assert "<script" not in page and '<section id="findings">' in page


def test_pictures_and_tables_say_their_scale(pathologies_page):
    """The memory chart has a y-axis in binary units; long kernel names are cut, whole on hover; the
    kernel-class table is there; fixes' code spans are <code>, not Markdown (issue #37, item 3)."""
    analysis, page = pathologies_page
    axis = re.search(r'<div class="y-axis"[^>]*><span class="unit">(GiB|MiB)</span>(.*?)</div>', page)
    assert axis is not None and axis.group(1) == "GiB"
    labels = re.findall(r'<span style="top:[0-9.]+%">([0-9.]+)</span>', axis.group(2))
    assert labels[:2] == ["0", "0.5"] and len(labels) >= 3  # peak 1.82 GiB: 0, 0.5, 1, 1.5
    longest = max((row.name for row in analysis.traces[0].views.kernels), key=len)
    assert len(longest) > 200
    cut = re.search(r'<td class="name" title="([^"]*)">([^<]*)</td>', page)
    assert cut is not None and len(html.unescape(cut.group(2))) <= 90 and cut.group(2).endswith("\u2026")
    assert html.unescape(cut.group(1)).startswith(html.unescape(cut.group(2))[:-1])
    assert '<section id="classes"><h2>GPU time by kernel class</h2>' in page
    assert "`" not in re.sub(r"<(script|style).*?</\1>", "", page, flags=re.S)
    assert prose("run `profile_memory=True` for <b>") == (
        "run <code>profile_memory=True</code> for &lt;b&gt;")


def test_the_docs_screenshots_are_of_the_page_as_it_is(fixtures_dir):
    """docs/img's screenshots of report.html (taken by test_browser.py from a fixture, with
    TRAINPROF_UPDATE_SCREENSHOTS=1) exist, are small, are shown by docs/report.md, and were taken
    of a page with the sections report.html has now (a section added or gone: take them again)."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    manifest = json.loads((docs / "img" / "screenshots.json").read_text())
    page = render_html(analyze(fixtures_dir / manifest["fixture"], views=True))
    assert re.findall(r'<section id="([^"]+)">', page) == manifest["sections"], manifest["made_by"]
    guide = (docs / "report.md").read_text()
    for name in manifest["files"]:
        image = (docs / "img" / name).read_bytes()
        assert image.startswith(b"\x89PNG\r\n\x1a\n") and 20_000 < len(image) < 300_000, name
        assert f"](img/{name})" in guide, name
