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
# The document of report.html: the page itself, or the report's iframe inside TensorBoard's plugin iframe.
_REPORT_DOCUMENT = {
    "file": "document",
    "tensorboard": "document.querySelector('iframe').contentDocument.querySelector('iframe').contentDocument",
}


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


def _check_report(page, doc: str, hostile_trace) -> None:
    """What must hold of a drawn report.html, in `doc` (a JavaScript expression for its document)."""
    page.wait_for(lambda: page.evaluate(f"!!({doc}) && !!({doc}).querySelector('#flame-chart canvas')"),
                  "the report's drawings")
    inked = page.evaluate(f"""(() => {{
        const doc = {doc}, inked = {_INKED};
        return ['#timeline-chart', '#flame-chart'].map((id) => inked(doc.querySelector(id + ' canvas')));
    }})()""")
    assert all(count > 5000 for count in inked), inked
    assert page.evaluate(f"({doc}).querySelector('svg.memory polyline').points.length") > 10
    widths = page.evaluate(f"[...({doc}).querySelectorAll('.bar span')]"
                           ".map((s) => s.getBoundingClientRect().width)")
    assert widths and sum(widths) > 100
    # The hostile names: text in the page, never an element.
    text = page.evaluate(f"({doc}).body.innerText")
    assert hostile_trace.kernel in text and hostile_trace.op in text
    assert page.evaluate(f"({doc}).querySelectorAll('img, iframe, [onerror]').length") == 0
    # Hovering a block of the hostile kernel names it, as text. Mouse events take whole pixels: the
    # block hovered is one that some pixel's time falls inside, at the full view.
    tooltip = page.evaluate(f"""(() => {{
        const doc = {doc};
        const data = JSON.parse(doc.getElementById('trainprof-data').textContent).traces[0].timeline;
        const lane = data.lanes[0], want = data.strings.indexOf({json.dumps(hostile_trace.kernel)});
        const holder = doc.getElementById('timeline-chart');
        const box = holder.querySelector('canvas').getBoundingClientRect();
        const left = 150, width = box.width - left - 8;  // the lanes' labels, and a margin
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
    }})()""")
    index, display, tip_text = tooltip
    assert index >= 0 and display == "block" and tip_text.startswith(hostile_trace.kernel), tooltip
    assert "category: other" in tip_text and "duration:" in tip_text  # a name that says no category
    # A step button zooms the timeline: the drawing changes.
    changed = page.evaluate(f"""(() => {{
        const doc = {doc}, canvas = doc.querySelector('#timeline-chart canvas');
        const before = canvas.toDataURL();
        doc.querySelectorAll('#timeline-steps button')[1].click();
        return canvas.toDataURL() !== before;
    }})()""")
    assert changed


def test_report_html_in_chromium(browser, hostile_report, hostile_trace, tmp_path):
    page = browser.new_page(WIDTH, HEIGHT)
    url = hostile_report.as_uri()
    page.open(url)
    _check_report(page, _REPORT_DOCUMENT["file"], hostile_trace)
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
    traces_only = logdir / "run-traces-only"
    traces_only.mkdir(exist_ok=True)
    for source in (fixtures_dir / "traces" / "gpt2_clean").glob("*.gz"):
        (traces_only / source.name).write_bytes(source.read_bytes())
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


def test_tensorboard_tab_in_chromium(browser, tensorboard, hostile_trace, tmp_path):
    page = browser.new_page(WIDTH, HEIGHT)
    page.open(f"{tensorboard}/#trainprof")
    runs = ("document.querySelector('iframe') && document.querySelector('iframe').contentDocument"
            ".querySelector('select')")
    page.wait_for(lambda: page.evaluate(f"!!({runs}) && ({runs}).options.length === 2"), "the run picker")
    labels = page.evaluate(f"[...({runs}).options].map((o) => o.textContent)")
    assert labels == ["run-hostile", "run-traces-only (analysed now)"]
    # The newest run is shown first; pick the hostile one.
    page.evaluate(f"(() => {{ const s = {runs}; s.value = '0'; s.dispatchEvent(new Event('change')); }})()")
    doc = _REPORT_DOCUMENT["tensorboard"]
    page.wait_for(lambda: page.evaluate(f"(() => {{ try {{ return ({doc}).title.includes('hostile'); }}"
                                        " catch (e) { return false; } })()"), "the hostile run's report")
    _check_report(page, doc, hostile_trace)
    _screenshot(page, tmp_path, "tensorboard.png")
    assert all(request.startswith(tensorboard) for request in page.requests), page.requests
    assert page.errors == [] and page.dialogs == []
