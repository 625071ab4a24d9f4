"""The command line, thin over the library: `trainprof analyze PATH [--json]`, `trainprof report PATH
--html OUT.html`, `trainprof demo`, `trainprof run`, `trainprof ab`, `trainprof diff`, `trainprof ncu`.

One module per command family: `analyze` (analyze, report, demo), `run`, `ab` (ab, diff), `ncu`;
`common` holds what they share (the one-line error, the error boundary, `--quiet`). No library
module imports a command module (tests/test_import_graph.py).

`analyze` never imports torch (startup time is benchmarked): it loads traces with the pure-Python
trace model. Under torchrun it splits a folder over the job's processes (`trainprof.job_analysis`),
and only then imports torch.distributed.
"""

from __future__ import annotations

import argparse

from trainprof.cli.common import one_line_warnings


def _parser() -> argparse.ArgumentParser:
    from trainprof import __version__

    parser = argparse.ArgumentParser(
        prog="trainprof", description="Find out what holds a PyTorch training step back."
    )
    parser.add_argument("--version", action="version", version=f"trainprof {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from trainprof.cli.analyze import add_analyze_parsers

    add_analyze_parsers(commands)  # `trainprof analyze`, `report`, `demo` (trainprof.cli.analyze)

    from trainprof.cli.run import add_run_parser

    add_run_parser(commands)  # `trainprof run [options] script.py [args]` (trainprof.cli.run)

    from trainprof.cli.ab import add_ab_parsers

    add_ab_parsers(commands)  # `trainprof ab`, `trainprof diff` (trainprof.cli.ab)

    from trainprof.cli.ncu import add_ncu_parser

    add_ncu_parser(commands)  # `trainprof ncu RUN -- command` (trainprof.cli.ncu)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `trainprof` console script."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a misspelled flag: the subcommand's usage, not the top level's
        _subcommand_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    with one_line_warnings():
        return _run_command(args)


def _subcommand_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of `trainprof <command>`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def _run_command(args: argparse.Namespace) -> int:
    from trainprof.cli.analyze import run_analyze, run_demo, run_report

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
        from trainprof.cli.run import run_command

        return run_command(args)  # the script's exit code; its exceptions are its own (trainprof.run)
    if args.command in ("ab", "diff"):
        from trainprof.cli.ab import run

        return run(args)
    if args.command == "ncu":
        from trainprof.cli.ncu import run_ncu

        return run_ncu(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands
