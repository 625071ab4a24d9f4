"""trainprof's tab in TensorBoard: the runs under `--logdir`, each shown as its report.html, offline.

TensorBoard finds the plugin through the `tensorboard_plugins` entry point (pyproject.toml) and
loads `assets/tensorboard.js` into an iframe of its own (the dynamic-plugin API); that module lists
the runs (`/runs`) and shows the chosen one's report in an inner iframe (`/report`). A run is a
folder that holds a `report*.html` (a session writes one per rank) or trace files: a run with traces
but no report (older runs, `analyze=False`) is analysed when first asked for, and kept in memory.

Only what `/runs` lists can be served: `/report` takes a run and a file name from that list, never
a path. TensorBoard's responses carry a Content-Security-Policy that runs no inline script unless
its hash is given: the report's own script is hashed here.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import threading
from pathlib import Path

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from trainprof.report.html import asset

logger = logging.getLogger("trainprof")

PLUGIN_NAME = "trainprof"
_REPORT = re.compile(r"^report(\.rank\d+)?\.html$")
_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
ANALYSED_KEPT = 8
"""Reports made on demand (runs without report.html) kept in memory, the most recent."""


class Run:
    """One report to show: a run folder and its report file (None: to be made from its traces)."""

    def __init__(self, logdir: Path, folder: Path, report: str | None) -> None:
        self.folder = folder
        self.report = report
        relative = folder.relative_to(logdir).as_posix()
        self.name = "." if relative == "." else relative
        rank = re.search(r"rank(\d+)", report or "")
        self.label = self.name + (f" (rank {rank.group(1)})" if rank else "")

    def to_dict(self) -> dict[str, str | None]:
        """What `/runs` says of it."""
        return {"run": self.name, "file": self.report, "label": self.label}


def find_runs(logdir: str | os.PathLike[str]) -> list[Run]:
    """The runs under `logdir`, by folder name; a folder's sub-folders are not searched once it is a
    run. No logdir (TensorBoard started with `--logdir_spec`, or none): no runs."""
    runs: list[Run] = []
    if not logdir or not Path(logdir).is_dir():
        return runs
    root = Path(logdir)
    for folder, subfolders, files in os.walk(root):
        reports = sorted(name for name in files if _REPORT.match(name))
        has_traces = any(_TRACE.search(name) for name in files)
        if reports or has_traces:
            runs += [Run(root, Path(folder), name) for name in reports] or [Run(root, Path(folder), None)]
            subfolders.clear()
        else:
            subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
    return sorted(runs, key=lambda run: (run.name, run.label))


def script_hashes(page: bytes) -> list[str]:
    """The base64 SHA-256 of each inline script of a page, as a Content-Security-Policy names them."""
    return [base64.b64encode(hashlib.sha256(body).digest()).decode() for body in _INLINE_SCRIPT.findall(page)]


class TrainprofPlugin(base_plugin.TBPlugin):
    """The "trainprof" tab (module docstring)."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._logdir = context.logdir or ""
        self._analysed: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    def get_plugin_apps(self) -> dict:
        """The routes under `/data/plugin/trainprof/`."""
        return {"/index.js": self._index, "/runs": self._runs, "/report": self._report}

    def is_active(self) -> bool:
        """Shown when `--logdir` holds a trainprof run."""
        return bool(find_runs(self._logdir))

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        """An iframed ES module, named trainprof in TensorBoard's tabs."""
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js", tab_name=PLUGIN_NAME, disable_reload=True
        )

    @wrappers.Request.application
    def _index(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, asset("tensorboard.js"), "text/javascript")

    @wrappers.Request.application
    def _runs(self, request: wrappers.Request) -> wrappers.Response:
        runs = [run.to_dict() for run in find_runs(self._logdir)]
        return http_util.Respond(request, runs, "application/json")

    @wrappers.Request.application
    def _report(self, request: wrappers.Request) -> wrappers.Response:
        name, file = request.args.get("run"), request.args.get("file") or None
        run = next((r for r in find_runs(self._logdir) if r.name == name and r.report == file), None)
        if run is None:
            return http_util.Respond(request, "no such trainprof run", "text/plain", code=404)
        try:
            page = (run.folder / run.report).read_bytes() if run.report else self._analyse(run.folder)
        except Exception as exc:  # a bad run shows its error in the tab; TensorBoard goes on
            logger.warning("trainprof: cannot show %s", run.folder, exc_info=True)
            message = f"trainprof cannot show {run.label}: {type(exc).__name__}: {exc}"
            return http_util.Respond(request, message, "text/plain", code=500)
        return http_util.Respond(request, page, "text/html", csp_scripts_sha256s=script_hashes(page))

    def _analyse(self, folder: Path) -> bytes:
        """report.html of a run that has traces but none, made now and kept for the folder's traces."""
        from trainprof.analysis import analyze
        from trainprof.report.html import render_html

        traces = sorted(path for path in folder.iterdir() if _TRACE.search(path.name))
        key = (str(folder), *((path.name, path.stat().st_mtime_ns) for path in traces))
        with self._lock:
            if key not in self._analysed:
                self._analysed[key] = render_html(analyze(folder, views=True)).encode()
                while len(self._analysed) > ANALYSED_KEPT:
                    self._analysed.pop(next(iter(self._analysed)))
            return self._analysed[key]
