"""The command line, thin over the library: `trainprof analyze PATH [--json]`, `trainprof report PATH
--html OUT.html`, `trainprof demo`.

`analyze` never imports torch (startup time is benchmarked): it loads traces with the pure-Python
trace model. Under torchrun it splits a folder over the job's processes (`trainprof.job_analysis`),
and only then imports torch.distributed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from trainprof.cli_common import (  # the commands' shared error boundary (trainprof.cli_common)
    ERROR_CHARS,
    error,
    guarded,
    missing_extra,
    silenced,
)
from trainprof.report.text import safe_text

PROGRESS_CHARS = 60
"""Characters of the progress bar's description (`loading <file name>`)."""
OLDER_RUNS_NAMED = 5
"""Older runs of a log folder named beside the one analysed: the most recent ones."""


def _parser() -> argparse.ArgumentParser:
    from trainprof import __version__

    parser = argparse.ArgumentParser(
        prog="trainprof", description="Find out what holds a PyTorch training step back."
    )
    parser.add_argument("--version", action="version", version=f"trainprof {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    analyze = commands.add_parser("analyze", help="analyse a profiler trace file or folder")
    analyze.add_argument("path", help="a .pt.trace.json[.gz] file, or a folder of them (one run)")
    analyze.add_argument("--json", action="store_true", help="print the analysis as one JSON object")
    analyze.add_argument("--max-trace-bytes", type=_size, default=None, metavar="SIZE",
                         help="read traces up to this size after gunzip, e.g. 8G (default 2G, "
                              "or env TRAINPROF_MAX_TRACE_BYTES)")
    analyze.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                         help="override a verdict threshold (repeatable); names and reasons: "
                              "trainprof/analysis/thresholds.py")
    analyze.add_argument("--workers", type=int, default=None, metavar="N",
                         help="processes that analyse a folder's traces, one trace each at a time "
                              "(default: one per core from 2 files on; from 4 off Linux; under "
                              "torchrun, per process, each taking its share of the node's cores)")
    analyze.add_argument("--windows", type=_count, default=None, metavar="N",
                         help="of a run folder, only the last N windows of each process (what a session "
                              "with repeat=0 analysed; it prints the command)")
    analyze.add_argument("--debug", action="store_true",
                         help="on an internal error, show the Python traceback instead of one line")
    analyze.add_argument("--quiet", action="store_true",
                         help="nothing on stderr but errors (no progress bar, no notes)")

    report = commands.add_parser("report", help="write report.html for a profiler trace file or folder")
    report.add_argument("path", help="a .pt.trace.json[.gz] file, or a folder of them (one run)")
    report.add_argument("--html", metavar="OUT.html", default=None,
                        help="where to write it (default: report.html in the run folder, or beside the file)")
    report.add_argument("--max-trace-bytes", type=_size, default=None, metavar="SIZE",
                        help="read traces up to this size after gunzip (as for analyze)")
    report.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                        help="override a verdict threshold (repeatable), as for analyze")
    report.add_argument("--windows", type=_count, default=None, metavar="N",
                        help="of a run folder, only the last N windows of each process")
    report.add_argument("--debug", action="store_true",
                        help="on an internal error, show the Python traceback instead of one line")
    report.add_argument("--quiet", action="store_true", help="nothing on stderr but errors")

    demo = commands.add_parser("demo", help="profile a small GPT-2-shaped model and print the report")
    demo.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    demo.add_argument("--log-dir", default="log", help="where the run folder goes (default log)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    demo.add_argument("--quiet", action="store_true",
                      help="nothing of trainprof's on the terminal but errors (the files are written)")

    from trainprof.run import add_run_parser

    add_run_parser(commands)  # `trainprof run [options] script.py [args]` (trainprof.run)

    from trainprof.cli_ab import add_ab_parsers

    add_ab_parsers(commands)  # `trainprof ab`, `trainprof diff` (trainprof.cli_ab)

    from trainprof.ncu import add_ncu_parser

    add_ncu_parser(commands)  # `trainprof ncu RUN -- command` (trainprof.ncu)
    return parser


def _size(text: str) -> int:
    from trainprof.trace.load import parse_size

    try:
        size = parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if size is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or e.g. 512M, 8G)")
    return size


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a count (1, 2, ...)")
    return int(text)





def note(message: str) -> None:
    """One line for the user on stderr (file names in it made safe, `text.safe_text`)."""
    sys.stderr.write(f"trainprof: {safe_text(message, ERROR_CHARS).strip()}\n")


def _load_and_analyze(
    path: str, progress: IO[str] | None, thresholds: dict | None = None, views: bool = False,
    workers: int | None = None, job=None, windows: int | None = None,
):  # -> Analysis
    """`analyze(path)` (on rank 0 of a torchrun job, `job`: `job_analysis.analyze_in_job`), with a
    progress bar on `progress` when it is a terminal."""

    def run(on_progress: Callable[[str, int, int], None] | None = None):  # -> Analysis
        if job is not None:
            from trainprof.job_analysis import analyze_in_job

            return analyze_in_job(job, path, thresholds, workers, on_progress, windows)
        from trainprof.analysis import analyze

        return analyze(path, on_progress=on_progress, thresholds=thresholds, views=views, workers=workers,
                       windows=windows)

    if progress is None or not progress.isatty():
        return run()
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return run()
    # File names are the trace's: never markup, never raw (an escape sequence in a name would reach
    # the terminal), never longer than a line.
    columns = (TextColumn("{task.description}", markup=False), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    console = Console(file=progress, markup=False, highlight=False, emoji=False)
    # Redrawn at each step, not by rich's refresh thread: a process that runs no other thread may
    # fork the workers of a folder (`analysis.folder`).
    with Progress(*columns, console=console, transient=True, auto_refresh=False) as bar:
        task = bar.add_task("loading", total=1)

        def advance(what: str, done: int, total: int) -> None:
            bar.update(task, description=safe_text(what, PROGRESS_CHARS), completed=done, total=total)
            bar.refresh()

        return run(advance)


def run_analyze(
    path: str,
    as_json: bool,
    debug: bool = False,
    max_trace_bytes: int | None = None,
    thresholds: list[str] | None = None,
    quiet: bool = False,
    workers: int | None = None,
    windows: int | None = None,
) -> int:
    """`trainprof analyze`: one JSON object (--json) or the console report on stdout.

    `thresholds`: `NAME=VALUE` overrides of `trainprof.analysis.thresholds` (a bad one: exit 2).
    `quiet`: nothing on stderr but errors.
    `workers`: processes for a folder's traces (`trainprof.analysis.folder`; below 1: exit 2).
    `windows`: of a folder, the last N windows of each process only (`analyze(..., windows=N)`).

    Under torchrun (`job_analysis.job_place`) every process analyses its share of the folder and rank 0
    prints the report one process would print; the other ranks print nothing and exit 0 once their
    share is handed over (`trainprof.job_analysis`).

    Every failure is one line on stderr and exit 2 (the error boundary, `guarded`); with `debug`, an
    internal error (not bad input) raises with its traceback instead.
    """
    from trainprof.analysis.thresholds import parse_threshold_args

    try:
        overrides = parse_threshold_args(thresholds or [])
    except ValueError as exc:
        return error(str(exc))
    if workers is not None and workers < 1:
        return error(f"--workers {workers}: needs at least 1")
    return guarded(path, debug, lambda: _analyze_and_print(path, as_json, max_trace_bytes, overrides, quiet,
                                                           workers, windows))


def _analyze_and_print(path: str, as_json: bool, max_trace_bytes: int | None, thresholds: dict,
                       quiet: bool, workers: int | None = None, windows: int | None = None) -> int:
    from trainprof.job_analysis import JobError, job_place, send_share
    from trainprof.trace import trace_size_limit

    job = job_place()
    try:
        if job is not None and job.rank != 0:  # its share to rank 0, which reports for every rank
            with trace_size_limit(max_trace_bytes):
                send_share(job, path, thresholds, workers, windows)
            return 0
        if not Path(path).exists():
            return error(f"{path}: no such file or directory")
        _which_run(path, quiet)
        with trace_size_limit(max_trace_bytes), silenced() if quiet else contextlib.nullcontext():
            progress = None if quiet else sys.stderr
            analysis = _load_and_analyze(path, progress, thresholds, workers=workers, job=job,
                                         windows=windows)
    except JobError as exc:
        return error(str(exc))
    if as_json:
        from trainprof.report.json import write_json_to

        write_json_to(analysis, sys.stdout)
    else:
        from trainprof.report.console import print_report

        print_report(analysis, file=sys.stdout)
    return 0


def run_report(
    path: str,
    html_path: str | None,
    debug: bool = False,
    max_trace_bytes: int | None = None,
    thresholds: list[str] | None = None,
    quiet: bool = False,
    windows: int | None = None,
) -> int:
    """`trainprof report PATH --html OUT.html`: analyse PATH with its views and write report.html
    (default: `report.html` in the run folder, or beside the trace file; a device, FIFO or link
    named there is written through, `trainprof.files.write_atomically`). Failures and `windows` as
    for analyze."""
    from trainprof.analysis.thresholds import parse_threshold_args

    try:
        overrides = parse_threshold_args(thresholds or [])
    except ValueError as exc:
        return error(str(exc))
    return guarded(
        path, debug, lambda: _write_html_report(path, html_path, max_trace_bytes, overrides, quiet, windows)
    )


def _write_html_report(
    path: str, html_path: str | None, max_trace_bytes: int | None, thresholds: dict, quiet: bool,
    windows: int | None = None,
) -> int:
    from trainprof.report.html import write_html
    from trainprof.trace import trace_size_limit

    if not Path(path).exists():
        return error(f"{path}: no such file or directory")
    run = _which_run(path, quiet)
    named_by_user = html_path is not None
    if html_path is None:
        html_path = str(run / "report.html" if run.is_dir() else run.with_name("report.html"))
    with trace_size_limit(max_trace_bytes), silenced() if quiet else contextlib.nullcontext():
        analysis = _load_and_analyze(path, None if quiet else sys.stderr, thresholds, views=True,
                                     windows=windows)
    try:
        Path(html_path).parent.mkdir(parents=True, exist_ok=True)
        written = write_html(analysis, html_path, named_by_user=named_by_user)
    except OSError as exc:
        return error(f"{html_path}: cannot write it ({exc.strerror or exc})")
    if not quiet and written.is_file() and not written.is_symlink():  # where the page went (not when
        # it went to a device or through a link: /dev/stdout would get the line after the page)
        size_kib = written.stat().st_size / 1024
        sys.stdout.write(safe_text(f"trainprof: wrote {written} ({size_kib:,.0f} KiB)", ERROR_CHARS) + "\n")
    return 0


def _which_run(path: str, quiet: bool) -> Path:
    """For a log folder holding runs, the newest (said on stderr unless `quiet`); else `path`."""
    from trainprof.trace import newest_run

    target = Path(path)
    if target.is_dir():
        run, runs = newest_run(target)
        if run is not None:
            if not quiet:
                others = ", ".join(r.name for r in runs[:-1][-OLDER_RUNS_NAMED:])
                note(f"{path} holds {len(runs)} run(s); analysing the newest, {run}"
                     + (f" (older: {others}; give a run's folder to analyse it)" if others else ""))
            return Path(run)
    return target


def run_demo(steps: int, log_dir: str, device: str | None, quiet: bool = False) -> int:
    """`trainprof demo`: train a small GPT-2-shaped model under a session; the session prints the
    report (`quiet`: writes it only).

    Without a GPU, first the report of a real GPU run shipped with trainprof (`trainprof.samples`),
    with its report.html, then the CPU run.
    """
    if steps < 6:
        return error(f"--steps {steps}: the demo needs at least 6 (wait 1, warmup 1, active 3, then one)")
    from trainprof.demo import DemoUnavailable
    from trainprof.demo import run_demo as demo

    try:
        with silenced() if quiet else contextlib.nullcontext():
            from trainprof.demo import demo_device

            if demo_device(device) == "cpu" and not _cuda_available():
                _show_gpu_sample(log_dir, console=not quiet)
            demo(steps=steps, log_dir=log_dir, device=device, console=not quiet)  # says where files went
    except DemoUnavailable as exc:
        return error(str(exc))
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, "trainprof demo")
        if missing is None:
            raise
        return error(missing)
    return 0


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _show_gpu_sample(log_dir: str, console: bool) -> None:
    """Write the shipped GPU run's report.html and, with `console`, print its report and where it went."""
    from trainprof.demo import gpu_sample_report
    from trainprof.report.console import print_report
    from trainprof.samples import H200_LLAMA_TITLE

    analysis, written = gpu_sample_report(log_dir)
    if not console:
        return
    sys.stdout.write(f"No GPU here: first, trainprof's report on a real GPU run, {H200_LLAMA_TITLE}.\n\n")
    print_report(analysis, file=sys.stdout)
    sys.stdout.write(
        f"\nopen {written} in a browser for its timeline, op and kernel tables, memory and flame graph\n"
        f"  (or tensorboard --logdir {log_dir}, tab trainprof)\n\n"
        "Now the demo's own loop, on this CPU (a CPU has no GPU time to report: its verdict is cpu-only):\n\n"
    )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `trainprof` console script."""
    args = _parser().parse_args(argv)
    if args.command == "analyze":
        return run_analyze(
            args.path,
            args.json,
            debug=args.debug,
            max_trace_bytes=args.max_trace_bytes,
            thresholds=args.threshold,
            quiet=args.quiet,
            workers=args.workers,
            windows=args.windows,
        )
    if args.command == "report":
        return run_report(
            args.path,
            args.html,
            debug=args.debug,
            max_trace_bytes=args.max_trace_bytes,
            thresholds=args.threshold,
            quiet=args.quiet,
            windows=args.windows,
        )
    if args.command == "demo":
        return run_demo(args.steps, args.log_dir, args.device, quiet=args.quiet)
    if args.command == "run":
        from trainprof.run import run_command

        return run_command(args)  # the script's exit code; its exceptions are its own (trainprof.run)
    if args.command in ("ab", "diff"):
        from trainprof.cli_ab import run

        return run(args)
    if args.command == "ncu":
        from trainprof.ncu import run_ncu

        return run_ncu(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
