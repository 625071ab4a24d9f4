"""`trainprof ncu [options] RUN -- command`: its arguments, and Nsight Compute run on the run's top
kernels (`trainprof.ncu`)."""

from __future__ import annotations

from pathlib import Path

from trainprof.ncu import NcuError, join, ncu_command, parse_details_csv, profile, to_dict, top_kernels


def add_ncu_parser(commands) -> None:
    """Add the `ncu` subcommand to the CLI's subparsers (`trainprof.cli`): options, then RUN, then
    ``--`` and the program (everything after RUN is the program's, as for `trainprof run`)."""
    import argparse


    parser = commands.add_parser(
        "ncu",
        help="Nsight Compute on a profiled run's top kernels: trainprof ncu [options] RUN -- command",
        description="Run COMMAND under Nsight Compute, collecting only the top kernels of the profiled "
        "run RUN (a trace folder or file), and print their throughput, occupancy and rule hints "
        "beside the run's kernel table.",
    )
    parser.add_argument("run", help="the profiled run: a trace file or a run folder (as for analyze)")
    parser.add_argument("--top", type=int, default=5, help="kernels to profile, by GPU time (default 5)")
    parser.add_argument("--regex", default=None,
                        help="ncu --kernel-name value instead of the top kernels' names (e.g. regex:gemm)")
    parser.add_argument("--launch-skip", type=int, default=20,
                        help="matching launches to skip first: warm-up, compilation (default 20)")
    parser.add_argument("--launch-count", type=int, default=None,
                        help="matching launches to profile (default: 3 per kernel)")
    parser.add_argument("--ncu", default="ncu", help="the ncu executable (default: ncu on PATH)")
    parser.add_argument("--out", default=None, help="folder for ncu's report, log and CSV (default: RUN/ncu)")
    parser.add_argument("--csv", default=None, metavar="FILE",
                        help="parse this saved details page (ncu --csv --page details) instead of running")
    parser.add_argument("--dry-run", action="store_true", help="print the ncu command line and exit")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON array")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then the program to profile")


def run_ncu(args) -> int:
    """`trainprof ncu`: 0, or 2 with a one-line error for a run without kernels or a failed ncu."""
    import json
    import sys

    from trainprof.report.ncu import render

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if args.top < 1:
        sys.stderr.write("trainprof: error: --top must be at least 1\n")
        return 2
    if not command and args.csv is None:
        sys.stderr.write("trainprof: error: give the program to profile after --, or --csv FILE\n")
        return 2
    try:
        kernels = top_kernels(args.run, args.top)
        names = [kernel.name for kernel in kernels]
        out_dir = Path(args.out) if args.out else Path(args.run) / "ncu"
        count = args.launch_count if args.launch_count is not None else 3 * len(names)
        if args.dry_run:
            report = out_dir / "ncu"
            line = ncu_command(command, names, report, args.launch_skip, count, args.ncu, regex=args.regex)
            sys.stdout.write(" ".join(line) + "\n")
            return 0
        if args.csv is not None:
            text = Path(args.csv).read_text(encoding="utf-8", errors="replace")
        else:
            text = profile(command, names, out_dir, args.launch_skip, count, args.ncu, args.regex)
        rows = join(kernels, parse_details_csv(text))
    except (NcuError, OSError) as error:
        sys.stderr.write(f"trainprof: error: {' '.join(str(error).split())}\n")
        return 2
    except Exception as error:  # a trace the analysis cannot read: the same one line as analyze's
        sys.stderr.write(f"trainprof: error: {type(error).__name__}: {' '.join(str(error).split())[:300]}\n")
        return 2
    sys.stdout.write(json.dumps(to_dict(rows), indent=1) + "\n" if args.json else render(rows))
    return 0
