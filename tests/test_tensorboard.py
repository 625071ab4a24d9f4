"""trainprof in TensorBoard: the trainprof tab's plugin (runs, reports, what it refuses to serve), its
registration, and what a session writes for the scalar and text plugins. The tab in a browser:
test_browser.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("tensorboard")

from werkzeug.test import Client  # noqa: E402 (tensorboard brings werkzeug)
from werkzeug.wrappers import Response  # noqa: E402

from trainprof.analysis import analyze  # noqa: E402
from trainprof.analysis.causes import Cause  # noqa: E402
from trainprof.report.html import asset, write_html  # noqa: E402
from trainprof.report.tensorboard import (  # noqa: E402
    FINDINGS_TAG,
    IDLE_TAG,
    REPORT_TAG,
    UNPROFILED_TAG,
    write_scalars,
)
from trainprof.report.tensorboard_plugin import TrainprofPlugin, find_runs  # noqa: E402


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, fixtures_dir):
    """A log folder as sessions leave it: a run with report.html, a DDP run with one report per rank,
    a run with traces only, and a folder that is no run."""
    root = tmp_path_factory.mktemp("logdir")
    llama = fixtures_dir / "busy" / "llama_swap" / "bare"
    analysis = analyze(llama, views=True)
    (root / "run-a").mkdir()
    write_html(analysis, root / "run-a" / "report.html")
    (root / "run-b").mkdir()
    for rank in (0, 1):
        write_html(analysis, root / "run-b" / f"report.rank{rank}.html")
    (root / "run-c").mkdir()
    for source in llama.iterdir():
        (root / "run-c" / source.name).write_bytes(source.read_bytes())
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a run")
    hidden = root / "ab" / "_prediction"  # trainprof ab's own traces: not a run of the user's
    hidden.mkdir(parents=True)
    for source in llama.iterdir():
        (hidden / source.name).write_bytes(source.read_bytes())
    # The newest run is run-b (a torchrun run, whose name sorts first), then run-c, then run-a.
    for age, run in enumerate(("run-b", "run-c", "run-a")):
        for path in (root / run).iterdir():
            os.utime(path, (1.8e9 - 3600 * age, 1.8e9 - 3600 * age))
    return root


def _app(logdir) -> Client:
    plugin = TrainprofPlugin(SimpleNamespace(logdir=str(logdir)))
    routes = plugin.get_plugin_apps()

    def app(environ, start_response):
        path = environ["PATH_INFO"].removeprefix("/data/plugin/trainprof")
        handler = routes.get(path)
        if handler is None:
            return Response("not found", status=404)(environ, start_response)
        return handler(environ, start_response)

    return Client(app)


def test_registered_as_a_tensorboard_plugin():
    found = [ep for ep in entry_points(group="tensorboard_plugins") if ep.name == "trainprof"]
    assert len(found) == 1 and found[0].load() is TrainprofPlugin
    plugin = TrainprofPlugin(SimpleNamespace(logdir=""))
    metadata = plugin.frontend_metadata()
    assert metadata.es_module_path == "/index.js" and metadata.tab_name == "trainprof"
    assert not plugin.is_active()  # nothing under an empty logdir


def test_lists_each_report_and_each_run_with_traces(logdir):
    runs = [run.to_dict() for run in find_runs(logdir)]
    assert runs == [  # the newest first, a run's ranks together; ab/_prediction is no run
        {"run": "run-b", "file": "report.rank0.html", "label": "run-b (rank 0)", "rank": 0},
        {"run": "run-b", "file": "report.rank1.html", "label": "run-b (rank 1)", "rank": 1},
        {"run": "run-c", "file": None, "label": "run-c", "rank": None},
        {"run": "run-a", "file": "report.html", "label": "run-a", "rank": None},
    ]
    response = _app(logdir).get("/data/plugin/trainprof/runs")
    assert response.status_code == 200 and json.loads(response.data) == runs
    assert TrainprofPlugin(SimpleNamespace(logdir=str(logdir))).is_active()


def _script_hash(script: bytes) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"


def _script_sources(policy: str) -> list[str]:
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    return directives["script-src"].split()


def test_serves_a_report_with_only_trainprofs_own_script_allowed(logdir):
    response = _app(logdir).get("/data/plugin/trainprof/report?run=run-a&file=report.html")
    assert response.status_code == 200 and response.data == (logdir / "run-a" / "report.html").read_bytes()
    policy = response.headers["Content-Security-Policy"]
    script = re.search(rb"<script>(.*?)</script>", response.data, re.S).group(1)
    assert _script_sources(policy) == [_script_hash(asset("report.js").encode())] == [_script_hash(script)]
    assert "default-src 'none'" in policy and "sandbox allow-scripts" in policy
    assert "allow-same-origin" not in policy


def test_a_planted_report_runs_no_script_of_its_own(tmp_path):
    """The tab hashed every inline script of the served file into the policy, so a report.html
    dropped into a run folder ran in TensorBoard's origin and read its /data/runs (issue #33)."""
    planted = b"<script>fetch('/data/runs').then((r) => r.text()).then(alert)</script>"
    (tmp_path / "run-planted").mkdir()
    (tmp_path / "run-planted" / "report.html").write_bytes(b"<!doctype html><title>x</title>" + planted)
    response = _app(tmp_path).get("/data/plugin/trainprof/report?run=run-planted&file=report.html")
    assert response.status_code == 200  # served, as text the browser shows without its script
    policy = response.headers["Content-Security-Policy"]
    assert _script_hash(planted[8:-9]) not in policy
    assert _script_sources(policy) == [_script_hash(asset("report.js").encode())]
    assert "'self'" not in _script_sources(policy) and "sandbox allow-scripts" in policy
    module = _app(tmp_path).get("/data/plugin/trainprof/index.js").data
    assert b'frame.setAttribute("sandbox", "allow-scripts")' in module


@pytest.fixture
def shared_logdir(tmp_path, fixtures_dir):
    """A logdir beside a folder it must not leak: `secret/` holds a page and a trace."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0:secret\n")
    trace = next((fixtures_dir / "traces" / "gpt2_clean").glob("*.pt.trace.json.gz"))
    (secret / trace.name).write_bytes(trace.read_bytes())
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    return logdir, secret, trace.name


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_a_report_link_leading_out_of_the_logdir_is_not_served(shared_logdir, target):
    """A report.html that is a link was followed: /etc/passwd came back as text/html (issue #33)."""
    logdir, secret, _ = shared_logdir
    (logdir / "run-link").mkdir()
    link = secret / "passwd" if target == "absolute" else Path("../../secret/passwd")
    (logdir / "run-link" / "report.html").symlink_to(link)
    response = _app(logdir).get("/data/plugin/trainprof/report?run=run-link&file=report.html")
    assert response.status_code == 404 and b"secret" not in response.data


def test_a_link_inside_the_logdir_and_a_fifo(shared_logdir):
    logdir, _, _ = shared_logdir
    (logdir / "run-a").mkdir()
    (logdir / "run-a" / "report.html").write_text("<!doctype html><p>a</p>")
    (logdir / "run-b").mkdir()
    (logdir / "run-b" / "report.html").symlink_to("../run-a/report.html")
    (logdir / "run-c").mkdir()
    os.mkfifo(logdir / "run-c" / "report.html")  # opened for reading, it would wait for a writer
    client = _app(logdir)
    served = client.get("/data/plugin/trainprof/report?run=run-b&file=report.html")
    assert served.status_code == 200 and served.data == b"<!doctype html><p>a</p>"
    assert client.get("/data/plugin/trainprof/report?run=run-c&file=report.html").status_code == 404


@pytest.mark.parametrize("planted", ["trace", "syncsites"])
def test_a_run_analysed_now_reads_nothing_outside_the_logdir(shared_logdir, planted):
    logdir, secret, trace_name = shared_logdir
    run = logdir / "run-x"
    run.mkdir()
    if planted == "trace":
        (run / trace_name).symlink_to(secret / trace_name)
    else:
        (run / trace_name).write_bytes((secret / trace_name).read_bytes())
        worker = trace_name.split(".")[0]
        (run / f"{worker}.syncsites.json").symlink_to(secret / "passwd")
    response = _app(logdir).get("/data/plugin/trainprof/report?run=run-x")
    assert response.status_code == 500 and b"leads outside the folder being served" in response.data
    assert b"<html" not in response.data and b"secret" not in response.data


def test_analyses_a_run_that_has_only_traces(logdir):
    client = _app(logdir)
    response = client.get("/data/plugin/trainprof/report?run=run-c")
    assert response.status_code == 200 and response.data.startswith(b"<!doctype html>")
    assert b"gpu-bound" in response.data
    assert client.get("/data/plugin/trainprof/report?run=run-c").data == response.data  # kept


@pytest.mark.parametrize("query", [
    "run=../run-a&file=report.html",
    "run=run-a&file=../run-b/report.rank0.html",
    "run=run-a&file=summary.json",
    "run=notes",
    "run=/etc&file=passwd",
    "",
])
def test_serves_only_what_it_lists(logdir, query):
    response = _app(logdir).get(f"/data/plugin/trainprof/report?{query}")
    assert response.status_code == 404 and b"<html" not in response.data


def test_index_module_renders_the_tab(logdir):
    response = _app(logdir).get("/data/plugin/trainprof/index.js")
    assert response.status_code == 200 and b"export async function render()" in response.data
    assert b"http" not in response.data  # relative URLs only: ./runs, ./report


def test_ranks_sort_by_number_and_a_run_folder_by_its_newest_file(tmp_path):
    run = tmp_path / "run-torchrun-1"
    run.mkdir()
    for rank in (10, 2, 0):
        (run / f"report.rank{rank}.html").write_text("<p>")
    older = tmp_path / "run-20991231-000000"  # sorts after by name; older by its files
    older.mkdir()
    (older / "report.html").write_text("<p>")
    os.utime(older / "report.html", (1e9, 1e9))
    assert [(r.name, r.rank) for r in find_runs(tmp_path)] == [
        ("run-torchrun-1", 0), ("run-torchrun-1", 2), ("run-torchrun-1", 10), ("run-20991231-000000", None)]


def test_a_cpu_run_writes_no_scalar_it_did_not_measure(tmp_path, cpu_only_trace):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainprof.report.tensorboard import GPU_TAGS

    analysis = analyze(cpu_only_trace)
    assert analysis.summary.verdict == "cpu-only"
    assert write_scalars(analysis, tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert "trainprof/step_time_ms" in tags and not tags & GPU_TAGS
    assert not any(tag.startswith(IDLE_TAG) for tag in tags)
    for tag in tags:  # what is charted was measured: no flat line of zeros
        assert any(event.value != 0 for event in events.Scalars(tag)), tag


def test_session_scalars_and_text(tmp_path, fixtures_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    analysis = analyze(fixtures_dir / "traces" / "gpt2_pathologies")
    assert write_scalars(analysis, tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {IDLE_TAG + cause.key for cause in Cause} | {IDLE_TAG + "one_off"} <= tags
    assert "trainprof/step_time_ms" in tags
    launch = events.Scalars(IDLE_TAG + "launch")
    assert [e.step for e in launch] == [s.times.number for s in analysis.steps]
    assert [e.value for e in launch] == pytest.approx([s.idle.costs[Cause.LAUNCH] for s in analysis.steps],
                                                      rel=1e-5)
    mfu = events.Scalars("trainprof/mfu_pct")  # the busy analysis' per-step MFU, at each step
    busy_steps = analysis.traces[0].busy.steps
    steps = [s.times.number for s in analysis.steps]
    assert [e.step for e in mfu] == [row.number for row in busy_steps] == steps
    assert [e.value for e in mfu] == pytest.approx([row.mfu_pct for row in busy_steps], rel=1e-5)
    assert all(e.value > 0 for e in mfu)
    texts = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()
             for tag in (FINDINGS_TAG + "/text_summary", REPORT_TAG + "/text_summary")}
    findings = texts[FINDINGS_TAG + "/text_summary"]
    assert findings.startswith("**launch\\-bound**") or findings.startswith("**launch-bound**")
    assert "fix:" in findings
    assert texts[REPORT_TAG + "/text_summary"].startswith("# trainprof report")
    assert UNPROFILED_TAG not in tags  # a trace without the session's un-profiled steps


def test_the_unprofiled_step_is_a_scalar_at_the_last_step(tmp_path, fixtures_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    analysis = analyze(fixtures_dir / "busy" / "gpt2_attention" / "sdpa_vocab64")
    assert write_scalars(analysis, tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    (event,) = events.Scalars(UNPROFILED_TAG)
    assert event.step == analysis.steps[-1].times.number
    assert event.value == pytest.approx(analysis.summary.unprofiled_step_ms, rel=1e-6)


def test_a_host_that_ran_ahead_has_its_gpu_steps_charted(tmp_path, fixtures_dir):
    """tests/fixtures/busy/vocab_head/bare: its host's step windows (21.5 ms) are under half the steps
    the GPU ran (49.7 ms; 49.5 un-profiled): the GPU step scalar charts those."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    analysis = analyze(fixtures_dir / "busy" / "vocab_head" / "bare")
    assert write_scalars(analysis, tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    window = [e.value for e in events.Scalars("trainprof/step_time_ms")]
    gpu = events.Scalars("trainprof/gpu_step_ms")
    assert [e.step for e in gpu] == [s.times.number for s in analysis.steps]
    assert [e.value for e in gpu] == pytest.approx([row.step_ms for row in analysis.traces[0].busy.steps])
    assert all(g > 2 * w for g, w in zip([e.value for e in gpu], window, strict=True))


def test_reading_library_versions_raises_no_warning():
    """TensorBoard brings MarkupSafe, whose `__version__` warns: reading the run's library versions
    must not pass that on (under `python -W error` it raised inside the analysis)."""
    import warnings

    import markupsafe  # noqa: F401 (loaded, as TensorBoard loads it)

    from trainprof.user_code import _layout_for

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layout = _layout_for(("markupsafe", "numpy"), None)
    assert "markupsafe" in layout.library_packages
