"""trainprof's tab in TensorBoard: the runs under `--logdir`, each shown as its report.html, offline.

TensorBoard finds the plugin through the `tensorboard_plugins` entry point (pyproject.toml) and
loads `assets/tensorboard.js` into an iframe of its own (the dynamic-plugin API); that module lists
the runs (`/runs`) and shows the chosen one's report in an inner iframe (`/report`). A run is a
folder that holds a `report*.html` (a session writes one per rank) or trace files: a run with traces
but no report (older runs, `analyze=False`) is analysed when first asked for, and kept in memory.

The logdir is untrusted input (a team's, a cluster's group-writable folder): anyone who can write
there can plant a link or a page. So:
- only what `/runs` lists can be served: `/report` takes a run and a file name from that list,
  never a path, and reads it only if its real path lies under the logdir's real path and it is a
  regular file (`trainprof.files.reads_confined_to`; a link leading out answers 404). A run
  analysed on demand is read under the same rule, trace, sync sites and peaks files alike;
- a page is served with a policy of its own (`report_policy`): the one script it may run is
  trainprof's `report.js`, by the hash of trainprof's own copy, never a hash taken from the served
  file; nothing is fetched; and the page is sandboxed (`sandbox allow-scripts`, without
  `allow-same-origin`: an opaque origin), as is the iframe the tab shows it in. A `report.html`
  planted in a run folder runs no script of its own, and what a report's script does cannot reach
  TensorBoard's pages or its data routes. A report written by another version of trainprof shows
  without its drawings (its script is not this one's); open the file itself, or write it again.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import re
import stat
import threading
from pathlib import Path

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from trainprof.files import open_to_read, reads_confined_to
from trainprof.report.html import asset

logger = logging.getLogger("trainprof")

PLUGIN_NAME = "trainprof"
_REPORT = re.compile(r"^report(\.rank\d+)?\.html$")
_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")
ANALYSED_KEPT = 8
"""Reports made on demand (runs without report.html) kept in memory, the most recent."""


class Run:
    """One report to show: a run folder and its report file (None: to be made from its traces)."""

    def __init__(self, logdir: Path, folder: Path, report: str | None) -> None:
        self.folder = folder
        self.report = report
        relative = folder.relative_to(logdir).as_posix()
        self.name = "." if relative == "." else relative
        rank = _RANK.search(report or "")
        self.rank = int(rank.group(1)) if rank else None
        """The rank whose report this is (`report.rank<N>.html`); None for a run's one report."""
        self.label = self.name + (f" (rank {self.rank})" if rank else "")

    def to_dict(self) -> dict[str, str | int | None]:
        """What `/runs` says of it."""
        return {"run": self.name, "file": self.report, "label": self.label, "rank": self.rank}


_RANK = re.compile(r"rank(\d+)")


def find_runs(logdir: str | os.PathLike[str]) -> list[Run]:
    """The runs under `logdir`, the newest first (by its newest report or trace file), a run's ranks
    together and in rank order; a folder's sub-folders are not searched once it is a run, nor is a
    folder whose name starts with `_` or `.` (trainprof's own, e.g. `ab/_prediction`, or hidden).
    No logdir (TensorBoard started with `--logdir_spec`, or none): no runs."""
    found: list[tuple[float, list[Run]]] = []
    if not logdir or not Path(logdir).is_dir():
        return []
    root = Path(logdir)
    for folder, subfolders, files in os.walk(root):
        reports = [name for name in files if _REPORT.match(name)]
        traces = [name for name in files if _TRACE.search(name)]
        if reports or traces:
            runs = [Run(root, Path(folder), name) for name in reports] or [Run(root, Path(folder), None)]
            found.append((_newest(Path(folder), reports or traces), sorted(runs, key=_rank_order)))
            subfolders.clear()
        else:
            subfolders[:] = sorted(name for name in subfolders if not name.startswith((".", "_")))
    found.sort(key=lambda entry: (-entry[0], entry[1][0].name))
    return [run for _, runs in found for run in runs]


def _rank_order(run: Run) -> tuple[int, str]:
    return (-1 if run.rank is None else run.rank, run.report or "")


def _newest(folder: Path, names: list[str]) -> float:
    """The latest modification time among a run's files (0 where none can be read)."""
    times = []
    for name in names:
        try:
            times.append(os.lstat(folder / name).st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


@functools.cache
def report_policy() -> str:
    """The Content-Security-Policy of a served report: trainprof's own `report.js` (by its hash) is the
    only script, inline styles and `data:` images only, nothing fetched, and the page sandboxed in an
    opaque origin (module docstring)."""
    script = base64.b64encode(hashlib.sha256(asset("report.js").encode()).digest()).decode()
    return "; ".join((
        "default-src 'none'",
        f"script-src 'sha256-{script}'",
        "style-src 'unsafe-inline'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'self'",
        "sandbox allow-scripts",
    ))


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
            with reads_confined_to(self._logdir):
                if run.report is None:
                    page = self._analyse(run.folder)
                else:
                    page = _read_regular_file(run.folder / run.report)
        except (PermissionError, NotARegularFile):  # a link leading out of the logdir, a FIFO, ...
            return http_util.Respond(request, "no such trainprof run", "text/plain", code=404)
        except Exception as exc:  # a bad run shows its error in the tab; TensorBoard goes on
            logger.warning("trainprof: cannot show %s", run.folder, exc_info=True)
            message = f"trainprof cannot show {run.label}: {type(exc).__name__}: {exc}"
            return http_util.Respond(request, message, "text/plain", code=500)
        return wrappers.Response(page, content_type="text/html; charset=utf-8", headers={
            "Content-Security-Policy": report_policy(),
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache, must-revalidate",
        })

    def _analyse(self, folder: Path) -> bytes:
        """report.html of a run that has traces but none, made now and kept for the folder's traces.
        In this process (`workers=1`): the reads stay under `reads_confined_to`, which is per thread."""
        from trainprof.analysis import analyze
        from trainprof.report.html import render_html

        traces = sorted(path for path in folder.iterdir() if _TRACE.search(path.name))
        key = (str(folder), *((path.name, path.stat().st_mtime_ns) for path in traces))
        with self._lock:
            if key not in self._analysed:
                self._analysed[key] = render_html(analyze(folder, views=True, workers=1)).encode()
                while len(self._analysed) > ANALYSED_KEPT:
                    self._analysed.pop(next(iter(self._analysed)))
            return self._analysed[key]


class NotARegularFile(OSError):
    """A report name that is a FIFO, a device or a folder: never read (a FIFO would block)."""


def _read_regular_file(path: Path) -> bytes:
    """The bytes of `path`, opened by `open_to_read` (inside `reads_confined_to`: only under the logdir)."""
    with os.fdopen(open_to_read(path), "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise NotARegularFile(f"{path}: not a regular file")
        return file.read()
