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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainprof", description="Find out what holds a PyTorch training step back."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    analyze = commands.add_parser("analyze", help="analyse a profiler trace file or folder")
    analyze.add_argument("path", help="a .pt.trace.json[.gz] file, or a folder of them (one run)")
    analyze.add_argument("--json", action="store_true", help="print the analysis as one JSON object")

    demo = commands.add_parser("demo", help="profile a small GPT-2-shaped model and print the report")
    demo.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    demo.add_argument("--log-dir", default="log", help="where the run folder goes (default log)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    return parser


def _error(message: str) -> int:
    sys.stderr.write(f"trainprof: error: {message}\n")
    return EXIT_BAD_INPUT


def _load_and_analyze(path: str, progress: IO[str]):  # -> Analysis
    from trainprof.analysis import analyze

    if not progress.isatty():
        return analyze(path)
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return analyze(path)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(file=progress), transient=True) as bar:
        task = bar.add_task("loading", total=1)

        def advance(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        return analyze(path, on_progress=advance)


def run_analyze(path: str, as_json: bool) -> int:
    """`trainprof analyze`: one JSON object (--json) or the console report on stdout."""
    if not Path(path).exists():
        return _error(f"{path}: no such file or directory")
    from trainprof.trace import TraceLoadError

    try:
        analysis = _load_and_analyze(path, sys.stderr)
    except TraceLoadError as exc:
        return _error(" ".join(str(exc).splitlines()) or f"{path}: not a profiler trace")
    except OSError as exc:
        return _error(f"{path}: {exc.strerror or exc}")
    result = analysis.to_dict()
    if as_json:
        from trainprof.report.json import dumps

        sys.stdout.write(dumps(result) + "\n")
    else:
        from trainprof.report.console import print_report

        print_report(result, file=sys.stdout)
    return 0


def run_demo(steps: int, log_dir: str, device: str | None) -> int:
    """`trainprof demo`: train a small GPT-2-shaped model under a session; the session prints the report."""
    if steps < 6:
        return _error(f"--steps {steps}: the demo needs at least 6 (wait 1, warmup 1, active 3, then one)")
    from trainprof.demo import run_demo as demo

    sess = demo(steps=steps, log_dir=log_dir, device=device)
    sys.stdout.write(
        f"\nWrote {sess.run_dir}/: traces (*.pt.trace.json.gz), sync sites, summary.json, report.md\n"
        f"Browse: tensorboard --logdir {log_dir}   |   Re-analyse: trainprof analyze {sess.run_dir}\n"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `trainprof` console script."""
    args = _parser().parse_args(argv)
    if args.command == "analyze":
        return run_analyze(args.path, args.json)
    if args.command == "demo":
        return run_demo(args.steps, args.log_dir, args.device)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
