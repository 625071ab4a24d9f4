"""`trainprof run [options] script.py [args]`: its arguments, and the script run under a session
(`trainprof.run.run_script`)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from trainprof.run import run_script
from trainprof.run_name import RUN_NAME_VARIABLE


def add_run_parser(commands: Any) -> None:
    """Add the `run` subcommand to the CLI's subparsers (`trainprof.cli`)."""
    import argparse

    run = commands.add_parser(
        "run",
        help="run an unchanged script under a session: trainprof run [options] script.py [args]",
        description="Run a training script under trainprof.session(), as `python script.py args` would "
        "run it. Under torchrun: torchrun --nproc_per_node=N -m trainprof run script.py args",
    )
    run.add_argument("--log-dir", default="log", help="where the run folder goes (default log)")
    run.add_argument("--run-name", default=None,
                     help=f"the run folder's name (default: ${RUN_NAME_VARIABLE}, torchrun's run id, "
                     "or run-YYYYmmdd-HHMMSS)")
    for name, default in (("wait", 1), ("warmup", 1), ("active", 3), ("repeat", 1), ("skip-first", 0)):
        run.add_argument(f"--{name}", type=int, default=default, metavar="N",
                         help=f"torch.profiler.schedule's {name.replace('-', '_')} (default {default})")
    for flag, option in (("--no-stack", "with_stack"), ("--no-shapes", "record_shapes"),
                         ("--no-memory", "profile_memory"), ("--no-sync-capture", "capture_syncs")):
        run.add_argument(flag, dest=option, action="store_false", help=f"session option {option}=False")
    run.add_argument("--quiet", action="store_true",
                     help="nothing of trainprof's on the terminal: no report, notes or warnings "
                     "(files are written)")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")


def run_command(args: Any) -> int:
    """`trainprof run`: the script's exit code; a missing script or a bad option is a one-line error."""
    from trainprof.session import process_rank

    options = {
        "log_dir": args.log_dir, "run_name": args.run_name, "wait": args.wait, "warmup": args.warmup,
        "active": args.active, "repeat": args.repeat, "skip_first": args.skip_first,
        "with_stack": args.with_stack, "record_shapes": args.record_shapes,
        "profile_memory": args.profile_memory, "capture_syncs": args.capture_syncs,
        # One console report per launch: the other ranks write their files silently.
        "console": not args.quiet and process_rank() in (None, 0),
    }
    from trainprof.cli.common import silenced

    try:
        with silenced() if args.quiet else contextlib.nullcontext():
            code, _ = run_script(args.script, args.script_args, **options)
    except (FileNotFoundError, ValueError) as error:
        sys.stderr.write(f"trainprof: error: {error}\n")
        return 2
    # The session itself says where its files went, or why nothing was recorded.
    return code
