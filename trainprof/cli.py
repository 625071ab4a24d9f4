"""The command line, thin over the library: `trainprof analyze PATH [--json]`, `trainprof demo`.

`analyze` never imports torch (startup time is benchmarked): it loads traces with the pure-Python
trace model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO

EXIT_BAD_INPUT = 2
ERROR_DETAIL_CHARS = 300
"""Characters of an internal error's message in the one-line error (the traceback is --debug's)."""
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
    analyze.add_argument("--debug", action="store_true",
                         help="on an internal error, show the Python traceback instead of one line")

    demo = commands.add_parser("demo", help="profile a small GPT-2-shaped model and print the report")
    demo.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    demo.add_argument("--log-dir", default="log", help="where the run folder goes (default log)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")

    from trainprof.run import add_run_parser

    add_run_parser(commands)  # `trainprof run [options] script.py [args]` (trainprof.run)

    from trainprof.cli_ab import add_ab_parsers

    add_ab_parsers(commands)  # `trainprof ab`, `trainprof diff` (trainprof.cli_ab)
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


def _error(message: str) -> int:
    sys.stderr.write(f"trainprof: error: {_one_line(message)}\n")
    return EXIT_BAD_INPUT


def _one_line(text: str) -> str:
    """`text` on one line of plain characters: newlines and other control characters (a terminal
    escape inside a file or kernel name) become spaces."""
    return "".join(" " if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in text).strip()


def _load_and_analyze(path: str, progress: IO[str], thresholds: dict | None = None):  # -> Analysis
    from trainprof.analysis import analyze

    if not progress.isatty():
        return analyze(path, thresholds=thresholds)
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return analyze(path, thresholds=thresholds)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(file=progress), transient=True) as bar:
        task = bar.add_task("loading", total=1)

        def advance(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        return analyze(path, on_progress=advance, thresholds=thresholds)


def run_analyze(
    path: str,
    as_json: bool,
    debug: bool = False,
    max_trace_bytes: int | None = None,
    thresholds: list[str] | None = None,
) -> int:
    """`trainprof analyze`: one JSON object (--json) or the console report on stdout.

    `thresholds`: `NAME=VALUE` overrides of `trainprof.analysis.thresholds` (a bad one: exit 2).

    Every failure is one line on stderr and exit 2 (the error boundary); with `debug`, an internal
    error (not bad input) raises with its traceback instead.
    """
    from trainprof.analysis.thresholds import parse_threshold_args
    from trainprof.trace import TraceLoadError

    try:
        overrides = parse_threshold_args(thresholds or [])
    except ValueError as exc:
        return _error(str(exc))
    try:
        return _analyze_and_print(path, as_json, max_trace_bytes, overrides)
    except TraceLoadError as exc:
        return _error(str(exc) or f"{path}: not a profiler trace")
    except KeyboardInterrupt:
        sys.stderr.write("trainprof: interrupted\n")
        return 130
    except MemoryError:
        return _error(f"{path}: out of memory while analysing it (try a smaller trace or --max-trace-bytes)")
    except OSError as exc:
        if debug:
            raise
        return _error(f"{path}: {exc.strerror or exc}")
    except Exception as exc:  # the boundary: a bug must not greet the user with a traceback
        if debug:
            raise
        return _error(
            f"{path}: internal error ({type(exc).__name__}: {str(exc)[:ERROR_DETAIL_CHARS]}); "
            "run again with --debug for the traceback, and please report it"
        )


def _analyze_and_print(path: str, as_json: bool, max_trace_bytes: int | None, thresholds: dict) -> int:
    from trainprof.trace import newest_run, trace_size_limit

    target = Path(path)
    if not target.exists():
        return _error(f"{path}: no such file or directory")
    if target.is_dir():
        run, runs = newest_run(target)
        if run is not None:
            others = ", ".join(r.name for r in runs[:-1][-OLDER_RUNS_NAMED:])
            sys.stderr.write(_one_line(
                f"trainprof: {path} holds {len(runs)} run(s); analysing the newest, {run}"
                + (f" (older: {others}; give a run's folder to analyse it)" if others else "")
            ) + "\n")
    with trace_size_limit(max_trace_bytes):
        analysis = _load_and_analyze(path, sys.stderr, thresholds)
    if as_json:
        from trainprof.report.json import dumps

        sys.stdout.write(dumps(analysis) + "\n")
    else:
        from trainprof.report.console import print_report

        print_report(analysis, file=sys.stdout)
    return 0


def run_demo(steps: int, log_dir: str, device: str | None) -> int:
    """`trainprof demo`: train a small GPT-2-shaped model under a session; the session prints the report."""
    if steps < 6:
        return _error(f"--steps {steps}: the demo needs at least 6 (wait 1, warmup 1, active 3, then one)")
    from trainprof.demo import DemoUnavailable
    from trainprof.demo import run_demo as demo

    try:
        demo(steps=steps, log_dir=log_dir, device=device)  # the session says where its files went
    except DemoUnavailable as exc:
        return _error(str(exc))
    return 0


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
        )
    if args.command == "demo":
        return run_demo(args.steps, args.log_dir, args.device)
    if args.command == "run":
        from trainprof.run import run_command

        return run_command(args)  # the script's exit code; its exceptions are its own (trainprof.run)
    if args.command in ("ab", "diff"):
        from trainprof.cli_ab import run

        return run(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
