"""report.html and the TensorBoard tab in a real browser: headless Chromium, driven through its
DevTools pipe (tests/cdp.py), with no network beyond localhost.

Each test opens a page, takes a screenshot (into pytest's tmp folder; also into
`$TRAINPROF_SCREENSHOTS` when set), and asserts that the charts drew (pixels on every canvas, points
on the memory curve), that nothing was logged as an error, that every request stayed on this
machine, and that a kernel named `<img src=x onerror=alert(1)>` shows as that text.

Chromium comes from Debian's `chromium` package (`.ci/run` installs it). Under CI (`CI` set) a
missing browser fails the tests; elsewhere they are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cdp import Browser, chromium_path

from trainprof.analysis import analyze
from trainprof.report.html import write_html

if chromium_path() is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI: the browser tests need chromium (apt-get install -y chromium)")
    pytest.skip("no chromium on PATH (apt-get install -y chromium)", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("browser")  # one worker: one browser, one TensorBoard for the module

WIDTH, HEIGHT = 1280, 900
TENSORBOARD_START_S = 90.0
"""Longest wait for TensorBoard to serve (its first start imports a lot; a loaded CI machine is slow)."""

# Pixels drawn on a canvas: those not fully transparent.
_INKED = """(canvas) => {
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
  return inked;
}"""
FRAME_WAIT_S = 90.0
"""Longest wait for a report in the tab's frame: a sandboxed frame gets a renderer process of its own,
which a loaded CI machine (or the full suite beside it on two cores) starts in tens of seconds."""
REPORT_FRAME = "/data/plugin/trainprof/report?"
"""What the URL of the tab's report frame holds: a sandboxed frame, in an opaque origin of its own,
which the test reaches through the browser (`evaluate(..., frame=...)`), not through the page."""


@pytest.fixture(scope="module")
def browser():
    with Browser.start() as started:
        yield started


@pytest.fixture(scope="module")
def hostile_report(hostile_trace) -> Path:
    """report.html of the hostile trace, in its run folder."""
    return write_html(analyze(hostile_trace.folder, views=True), hostile_trace.folder / "report.html")


def _screenshot(page, tmp_path: Path, name: str) -> Path:
    shot = page.screenshot(tmp_path / name)
    keep = os.environ.get("TRAINPROF_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / name)
    return shot


def _frame_evaluates(page, expression: str, frame: str | None) -> bool:
    """Whether `expression` is true in the frame (False while the frame is not there yet)."""
    try:
        return bool(page.evaluate(expression, frame=frame))
    except AssertionError:
        return False


def _check_report(page, hostile_trace, frame: str | None = None) -> None:
    """What must hold of a drawn report.html: the page's, or the frame's whose URL holds `frame`."""
    doc = "document"
    page.wait_for(lambda: _frame_evaluates(page, "!!document.querySelector('#flame-chart canvas')", frame),
                  "the report's drawings", FRAME_WAIT_S)
    inked = page.evaluate(f"""(() => {{
        const doc = {doc}, inked = {_INKED};
        return ['#timeline-chart', '#flame-chart'].map((id) => inked(doc.querySelector(id + ' canvas')));
    }})()""", frame=frame)
    assert all(count > 5000 for count in inked), inked
    assert page.evaluate(f"({doc}).querySelector('svg.memory polyline').points.length", frame=frame) > 10
    widths = page.evaluate(f"[...({doc}).querySelectorAll('.bar span')]"
                           ".map((s) => s.getBoundingClientRect().width)", frame=frame)
    assert widths and sum(widths) > 100
    # The hostile names: text in the page, never an element.
    text = page.evaluate(f"({doc}).body.innerText", frame=frame)
    assert hostile_trace.kernel in text and hostile_trace.op in text
    assert page.evaluate(f"({doc}).querySelectorAll('img, iframe, [onerror]').length", frame=frame) == 0
    # Hovering a block of the hostile kernel names it, as text. Mouse events take whole pixels: the
    # block hovered is one that some pixel's time falls inside, at the full view.
    tooltip = page.evaluate(f"""(() => {{
        const doc = {doc};
        const data = JSON.parse(doc.getElementById('trainprof-data').textContent).traces[0].timeline;
        const lane = data.lanes[0], want = data.strings.indexOf({json.dumps(hostile_trace.kernel)});
        const holder = doc.getElementById('timeline-chart');
        const box = holder.querySelector('canvas').getBoundingClientRect();
        const left = 190, width = box.width - left - 8;  // the lanes' labels, and a margin
        let at = 0, index = -1, x = 0;
        for (let i = 0; i < lane.start.length && index < 0; i++) {{
            at += lane.start[i];
            if (lane.name[i] !== want || lane.count[i] !== 1) continue;
            const pixel = Math.ceil(left + at / data.end * width);
            if ((pixel - left) / width * data.end < at + lane.dur[i]) {{ index = i; x = pixel; }}
        }}
        const y = Math.round(box.top + 26 + 22 / 2);  // the first lane, below the time axis
        const hover = {{clientX: box.left + x, clientY: y, bubbles: true}};
        holder.dispatchEvent(new MouseEvent('mousemove', hover));
        const tip = doc.querySelector('.tip');
        return [index, tip.style.display, tip.textContent];
    }})()""", frame=frame)
    index, display, tip_text = tooltip
    assert index >= 0 and display == "block" and tip_text.startswith(hostile_trace.kernel), tooltip
    assert "category: other" in tip_text and "duration:" in tip_text  # a name that says no category
    # A step button zooms the timeline: the drawing changes.
    changed = page.evaluate(f"""(() => {{
        const doc = {doc}, canvas = doc.querySelector('#timeline-chart canvas');
        const before = canvas.toDataURL();
        doc.querySelectorAll('#timeline-steps button')[1].click();
        return canvas.toDataURL() !== before;
    }})()""", frame=frame)
    assert changed


def test_report_html_in_chromium(browser, hostile_report, hostile_trace, tmp_path):
    page = browser.new_page(WIDTH, HEIGHT)
    url = hostile_report.as_uri()
    page.open(url)
    _check_report(page, hostile_trace)
    shot = _screenshot(page, tmp_path, "report.png")
    assert shot.stat().st_size > 50_000
    assert page.requests == [url]  # the file itself, nothing else
    assert page.errors == [] and page.dialogs == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def tensorboard(hostile_report, tmp_path_factory, fixtures_dir):
    """TensorBoard on a free localhost port over a logdir holding the hostile run (with its
    report.html) and a run with traces only."""
    pytest.importorskip("tensorboard")
    logdir = hostile_report.parent.parent
    planted = logdir / "run-planted"  # what anyone who can write to the logdir may drop there
    planted.mkdir(exist_ok=True)
    (planted / "report.html").write_text(
        "<!doctype html><title>planted</title><p>planted page</p><script>document.title = 'ran';"
        "fetch('/data/runs?planted=1').then((r) => r.text()).then((t) => { document.title = 'read ' + t;"
        " alert(t); });</script>")
    traces_only = logdir / "run-traces-only"
    traces_only.mkdir(exist_ok=True)
    for source in (fixtures_dir / "traces" / "gpt2_clean").glob("*.gz"):
        (traces_only / source.name).write_bytes(source.read_bytes())
    ranks = logdir / "run-torchrun-ranks"  # a torchrun run: a report per rank
    ranks.mkdir(exist_ok=True)
    for rank in (0, 1):
        (ranks / f"report.rank{rank}.html").write_bytes(hostile_report.read_bytes())
    # Newest first in the tab: the traces-only run, the planted one, the hostile one, the ranks.
    for age, folder in enumerate((traces_only, planted, hostile_report.parent, ranks)):
        for path in folder.iterdir():
            os.utime(path, (1.8e9 - 3600 * age, 1.8e9 - 3600 * age))
    port = _free_port()
    log = tmp_path_factory.mktemp("tensorboard") / "tensorboard.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=output, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + TENSORBOARD_START_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=5) as response:
                if b"trainprof" in response.read():
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"TensorBoard did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


# The tab's run picker, inside TensorBoard's plugin iframe (same origin: the page reaches it).
_RUNS = ("document.querySelector('iframe') && document.querySelector('iframe').contentDocument"
         ".querySelector('select')")


def _open_tab(browser, tensorboard: str):
    """A page on TensorBoard's trainprof tab, once its run picker lists the runs; (page, labels)."""
    page = browser.new_page(WIDTH, HEIGHT)
    page.open(f"{tensorboard}/#trainprof")
    page.wait_for(lambda: page.evaluate(f"!!({_RUNS}) && ({_RUNS}).options.length === 5"), "the run picker")
    return page, page.evaluate(f"[...({_RUNS}).options].map((o) => o.textContent)")


def _pick(page, index: int) -> None:
    """Show the run at `index` of the picker."""
    page.evaluate(f"(() => {{ const s = {_RUNS}; s.value = '{index}'; "
                  "s.dispatchEvent(new Event('change')); })()")


def test_tensorboard_tab_in_chromium(browser, tensorboard, hostile_trace, tmp_path):
    page, labels = _open_tab(browser, tensorboard)
    assert labels == ["run-traces-only (analysed now)", "run-planted", "run-hostile", "rank 0", "rank 1"]
    groups = page.evaluate(f"[...({_RUNS}).querySelectorAll('optgroup')]"
                           ".map((g) => [g.label, g.children.length])")
    assert groups == [["run-torchrun-ranks", 2]]  # one run's ranks together, under its name
    assert "run=run-traces-only" in page.evaluate("document.querySelector('iframe').contentDocument"
                                                  ".querySelector('iframe').src")  # opens on the newest
    _pick(page, 2)  # pick the hostile one
    page.wait_for(lambda: _frame_evaluates(page, "document.title.includes('hostile')", REPORT_FRAME),
                  "the hostile run's report", FRAME_WAIT_S)
    assert page.evaluate("origin", frame=REPORT_FRAME) == "null"  # sandboxed: an opaque origin
    _check_report(page, hostile_trace, REPORT_FRAME)
    _screenshot(page, tmp_path, "tensorboard.png")
    assert all(request.startswith(tensorboard) for request in page.requests), page.requests
    assert page.errors == [] and page.dialogs == []


def test_a_report_planted_in_the_logdir_runs_no_script(browser, tensorboard):
    """A report.html dropped into a run folder ran its script in TensorBoard's origin and read
    TensorBoard's /data/runs (issue #33). Its script is refused by the page's policy; were it
    trainprof's own, the sandbox would still keep it out of TensorBoard's origin."""
    page, labels = _open_tab(browser, tensorboard)
    _pick(page, labels.index("run-planted"))
    page.wait_for(lambda: _frame_evaluates(page, "document.body.innerText.includes('planted page')",
                                           REPORT_FRAME), "the planted page", FRAME_WAIT_S)
    assert page.evaluate("document.title", frame=REPORT_FRAME) == "planted"  # its script never ran
    assert not any("planted=" in request for request in page.requests), page.requests
    assert any("Content Security Policy" in error for error in page.errors), page.errors
    assert page.dialogs == []


def _fixture_runs(fixtures_dir: Path) -> list[Path]:
    """Every run of tests/fixtures whose traces report.html draws (one folder each)."""
    return [folder for group in ("traces", "thirdparty", "stacks", "busy", "ranks")
            for folder in sorted((fixtures_dir / group).iterdir()) if folder.is_dir()]


# The GPU timeline's idle lane at the full view: of the pixel columns inside the steps, the share
# drawn (not the lane's background). Lanes: the streams, then the idle lane (`report.js`).
_IDLE_DRAWN = """(() => {
  const canvas = document.querySelector('#timeline-chart canvas');
  const data = JSON.parse(document.getElementById('trainprof-data').textContent);
  const view = data.traces[Number((document.getElementById('trace-select') || {value: 0}).value)].timeline;
  const ratio = canvas.width / canvas.getBoundingClientRect().width;
  const left = 190, width = canvas.getBoundingClientRect().width - left - 8, scale = width / view.end;
  const y = Math.round((26 + view.lanes.length * (22 + 4) + 11) * ratio);
  const row = canvas.getContext('2d').getImageData(0, y, canvas.width, 1).data;
  let columns = 0, drawn = 0;
  for (const [, start, end] of view.steps) {
    const last = Math.floor((left + end * scale) * ratio);
    for (let x = Math.ceil((left + start * scale) * ratio); x < last; x++) {
      columns++;
      const [r, g, b] = [row[4 * x], row[4 * x + 1], row[4 * x + 2]];
      if (r !== 0xf6 || g !== 0xf8 || b !== 0xfb) drawn++;
    }
  }
  return 100 * drawn / columns;
})()"""
IDLE_DRAWN_TOLERANCE_PCT = 5.0
"""Points by which the idle drawn may differ from the idle reported (issue #37: it was 17x)."""


def test_every_fixture_drawn_to_scale_with_kernel_classes_and_no_backtick(browser, fixtures_dir, tmp_path):
    page = browser.new_page(WIDTH, HEIGHT)
    checked = []
    for folder in _fixture_runs(fixtures_dir):
        analysis = analyze(folder, views=True)
        report = write_html(analysis, tmp_path / f"{folder.parent.name}-{folder.name}.html")
        page.open(report.as_uri())
        page.wait_for(lambda: page.evaluate("!!document.querySelector('#timeline-chart canvas')"),
                      f"{folder.name}'s timeline")
        # The console's "GPU time by kernel class" table is on the page; no Markdown backtick is.
        assert page.evaluate("document.querySelectorAll('#classes table tbody tr').length") > 0, folder
        text = page.evaluate("document.body.innerText")
        assert "`" not in text, (folder, text[max(text.find("`") - 80, 0):text.find("`") + 80])
        for index, trace in enumerate(analysis.traces):
            if index:
                page.evaluate(f"(() => {{ const s = document.getElementById('trace-select'); "
                              f"s.value = '{index}'; s.dispatchEvent(new Event('change')); }})()")
            drawn, reported = page.evaluate(_IDLE_DRAWN), 100 - trace.verdict.gpu_busy_pct
            checked.append((folder.name, index, round(drawn, 1), round(reported, 1)))
    wrong = [row for row in checked if abs(row[2] - row[3]) > IDLE_DRAWN_TOLERANCE_PCT]
    assert len(checked) >= 29 and not wrong, wrong
    assert page.errors == []


DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "img"
SCREENSHOT_FIXTURE = "traces/gpt2_pathologies"
"""The fixture whose report.html the docs show (tests/fixtures/traces: launch-bound, with syncs)."""
SCREENSHOTS = {"report-top.png": ("body", 1150), "report-timeline.png": ("#timeline", 430)}
"""Each screenshot of docs/img: the element its top edge is at, and its height in pixels (1280 wide)."""
SCREENSHOT_MAX_BYTES = 300_000
UPDATE_SCREENSHOTS = "TRAINPROF_UPDATE_SCREENSHOTS"
"""Set to 1 to write the screenshots (and docs/img/screenshots.json) into docs/img."""


def test_screenshots_of_the_docs(browser, fixtures_dir, tmp_path):
    """The pictures of report.html in docs/report.md, made from a fixture: each run takes them (and
    checks their size); with TRAINPROF_UPDATE_SCREENSHOTS=1 they replace docs/img's, with the sections
    the page had (test_html_report.py checks those are still the page's)."""
    import base64
    import re

    report = write_html(analyze(fixtures_dir / SCREENSHOT_FIXTURE, views=True), tmp_path / "report.html")
    page = browser.new_page(WIDTH, HEIGHT)
    page.open(report.as_uri())
    page.wait_for(lambda: page.evaluate("!!document.querySelector('#flame-chart canvas')"), "the drawings")
    update = os.environ.get(UPDATE_SCREENSHOTS) == "1"
    for name, (selector, height) in SCREENSHOTS.items():
        top = page.evaluate(f"document.querySelector('{selector}').getBoundingClientRect().top + scrollY")
        shot = page.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": top, "width": WIDTH, "height": height, "scale": 1},
        })["data"]
        path = tmp_path / name
        path.write_bytes(base64.b64decode(shot))
        assert 20_000 < path.stat().st_size < SCREENSHOT_MAX_BYTES, (name, path.stat().st_size)
        if update:
            DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, DOCS_IMAGES / name)
    if update:
        sections = re.findall(r'<section id="([^"]+)">', report.read_text())
        manifest = {"fixture": SCREENSHOT_FIXTURE, "sections": sections, "files": sorted(SCREENSHOTS),
                    "made_by": f"{UPDATE_SCREENSHOTS}=1 pytest tests/test_browser.py -k screenshots"}
        (DOCS_IMAGES / "screenshots.json").write_text(json.dumps(manifest, indent=1) + "\n")
    assert page.errors == []
