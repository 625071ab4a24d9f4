"""`trainprof ab` and `trainprof diff`: their arguments and what they run (thin over trainprof.ab
and trainprof.analysis.diff). Importing this module imports neither torch nor the analysis."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from trainprof.cli_common import error, guarded, missing_extra


def add_ab_parsers(commands: argparse._SubParsersAction) -> None:
    """Add the `ab` and `diff` subcommands to the CLI's subparsers."""
    ab = commands.add_parser(
        "ab", help="time a training step in variants (bare, fused, liger, compile, ...) side by side"
    )
    ab.add_argument(
        "--model",
        default="gpt2-tiny",
        help="preset gpt2-tiny | gpt2-124m | llama-1b | llama-1b-32k, or a Hugging Face config path "
        "(or a config name already in the local cache); default gpt2-tiny",
    )
    ab.add_argument(
        "--variants",
        default="bare,fused,compile,fused+compile",
        help="comma-separated: bare, or fused|liger|liger-matched|compile joined by + (liger: Liger's "
        "defaults, as users run it; liger-matched: Liger on the ops swap replaces) (default %(default)s)",
    )
    ab.add_argument("--steps", type=int, default=20, help="steps per variant, warm-up included (default 20)")
    ab.add_argument("--warmup", type=int, default=3, help="untimed first steps per variant (default 3)")
    ab.add_argument("--block", type=int, default=2, help="steps per timed block (default 2)")
    ab.add_argument("--batch", type=int, default=None, help="batch size (default: the preset's)")
    ab.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    ab.add_argument(
        "--dtype", choices=("fp32", "bf16"), default="fp32", help="parameter dtype (default fp32)"
    )
    ab.add_argument("--autocast", action="store_true", help="forward under torch.autocast(bfloat16)")
    ab.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    ab.add_argument("--no-profile", action="store_true", help="skip the profiled step and the diffs")
    ab.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ab.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ab.add_argument("--markdown", default=None, metavar="FILE", help="also write the Markdown section here")
    ab.add_argument(
        "--log-dir",
        default=None,
        help="keep each variant's profiled step as a trace in DIR/<variant>/ (for trainprof diff)",
    )

    diff = commands.add_parser(
        "diff", help="ops, kernels and findings that changed between two traces or runs"
    )
    diff.add_argument("a", help="the before trace file or run folder")
    diff.add_argument("b", help="the after trace file or run folder")
    diff.add_argument("--json", action="store_true", help="print the diff as one JSON object")
    diff.add_argument("--markdown", default=None, metavar="FILE", help="also write the diff as Markdown here")
    diff.add_argument("--debug", action="store_true",
                      help="on an internal error, show the Python traceback instead of one line")


def run(args: argparse.Namespace) -> int:
    """Run `trainprof ab` or `trainprof diff` from parsed arguments; exit code."""
    return run_ab(args) if args.command == "ab" else run_diff(args)


def run_ab(args: argparse.Namespace) -> int:
    """`trainprof ab`: console tables, or JSON with --json; Markdown with --markdown."""
    variants = [name for name in args.variants.split(",") if name.strip()]
    progress = logging.getLogger("trainprof.ab")
    handler = logging.StreamHandler(sys.stderr)  # a run takes minutes: its phases, seconds so far
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = progress.level
    if not args.quiet:
        progress.addHandler(handler)
        progress.setLevel(logging.INFO)
    try:
        return _run_ab(args, variants)
    except ModuleNotFoundError as exc:  # the analysis-only install: no torch, no transformers
        message = missing_extra(exc, "trainprof ab")
        if message is None:
            raise
        return error(message)
    finally:
        progress.removeHandler(handler)
        progress.setLevel(level)


def _run_ab(args: argparse.Namespace, variants: list[str]) -> int:
    from trainprof.ab import run_model
    from trainprof.report import ab as render

    try:
        result = run_model(
            args.model,
            variants,
            steps=args.steps,
            warmup=args.warmup,
            block=args.block,
            batch=args.batch,
            seq=args.seq,
            dtype=args.dtype,
            autocast=args.autocast,
            device=args.device,
            log_dir=args.log_dir,
            profile=not args.no_profile,
        )
    except ValueError as exc:  # an unknown model (ModelNotFound), bad variants, steps, ...
        return error(str(exc))
    return _write_outputs(args, result.to_dict(), render.render_ab_markdown, render.print_ab)


def run_diff(args: argparse.Namespace) -> int:
    """`trainprof diff A B`: console tables, or JSON with --json; Markdown with --markdown. Inside
    the same error boundary as `trainprof analyze` (`trainprof.cli.guarded`)."""
    for path in (args.a, args.b):
        if not Path(path).exists():
            return error(f"{path}: no such file or directory")
    return guarded(f"{args.a} {args.b}", args.debug, lambda: _diff_and_print(args))


def _diff_and_print(args: argparse.Namespace) -> int:
    from trainprof.analysis.diff import diff_traces
    from trainprof.report import ab as render

    diff = diff_traces(args.a, args.b)
    return _write_outputs(args, diff, render.render_diff_markdown, render.print_diff)


def _write_outputs(
    args: argparse.Namespace,
    result: Any,
    markdown: Callable[[Any], str],
    console: Callable[[Any, TextIO], None],
) -> int:
    """`markdown(result)` to the --markdown file when given; `result` as JSON on stdout with --json,
    else `console`'s tables."""
    if args.markdown:
        from trainprof.files import write_text_atomically

        write_text_atomically(args.markdown, markdown(result), named_by_user=True)
    if args.json:
        from trainprof.report.json import write_json_to

        write_json_to(result, sys.stdout)
    else:
        console(result, sys.stdout)
    return 0
