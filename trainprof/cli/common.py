"""What every command shares: the one-line error on stderr, the error boundary of the commands that
read traces, `--quiet`, trainprof's warnings as one line, and the message for a missing extra."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator

from trainprof.report.text import safe_text

EXIT_BAD_INPUT = 2
ERROR_DETAIL_CHARS = 300
"""Characters of an internal error's message in the one-line error (the traceback is --debug's)."""
ERROR_CHARS = 2000
"""Characters of any one-line message on stderr, at most (a path or name in it may be hostile)."""


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


def error(message: str) -> int:
    """Say what went wrong in one line on stderr (`trainprof: error: ...`); the exit status for it."""
    sys.stderr.write(f"trainprof: error: {safe_text(message, ERROR_CHARS).strip()}\n")
    return EXIT_BAD_INPUT


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Inside the block nothing of trainprof's reaches the terminal: its warnings are ignored and its
    logger is off (`--quiet` of `run` and `demo`; the files are written as always)."""
    logger = logging.getLogger("trainprof")
    level = logger.level
    warnings.filterwarnings("ignore", message="trainprof", category=RuntimeWarning)
    entry = warnings.filters[0]
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)
        if entry in warnings.filters:
            warnings.filters.remove(entry)  # type: ignore[attr-defined]  # typeshed: a Sequence


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside the block a trainprof warning that no frame of the user's code called (the session's
    exit under `trainprof run`: `user_code.WARNING_SOURCE`) shows as its message alone, without a
    file, a line number or a category."""
    from trainprof.user_code import WARNING_SOURCE

    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if filename != WARNING_SOURCE:
            return previous(message, category, filename, lineno, file, line)
        with contextlib.suppress(OSError, ValueError):  # a closed stderr: as warnings itself does
            (file or sys.stderr).write(f"{message}\n")
        return None

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = previous


def note(message: str) -> None:
    """One line for the user on stderr (file names in it made safe, `text.safe_text`)."""
    sys.stderr.write(f"trainprof: {safe_text(message, ERROR_CHARS).strip()}\n")


def guarded(path: str, debug: bool, action: Callable[[], int]) -> int:
    """Run `action` inside the error boundary of every command that reads traces: bad input, a
    missing file, running out of memory or an internal error is one line on stderr and exit 2
    (`--debug` raises an internal error with its traceback instead); Ctrl-C exits 130."""
    from trainprof.trace import TraceLoadError

    try:
        return action()
    except TraceLoadError as exc:
        return error(str(exc) or f"{path}: not a profiler trace")
    except KeyboardInterrupt:
        sys.stderr.write("trainprof: interrupted\n")
        return 130
    except MemoryError:
        return error(f"{path}: out of memory while analysing it (try a smaller trace or --max-trace-bytes)")
    except OSError as exc:
        if debug:
            raise
        return error(f"{path}: {exc.strerror or exc}")
    except Exception as exc:  # the boundary: a bug must not greet the user with a traceback
        if debug:
            raise
        return error(
            f"{path}: internal error ({type(exc).__name__}: {str(exc)[:ERROR_DETAIL_CHARS]}); "
            "run again with --debug for the traceback, and please report it"
        )


# The extra that installs each package a command may need, for the one-line error without it.
EXTRA_OF_PACKAGE = {"torch": "train", "triton": "train", "transformers": "hf", "accelerate": "hf"}


def missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    """The one-line message for a package that is not installed (`pip install 'trainprof[train]'`),
    or None when `exc` is not about a package of an extra."""
    package = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_PACKAGE.get(package)
    if extra is None:
        return None
    return (f"{command} needs {package}, which is not installed (this install analyses traces only): "
            f"pip install 'trainprof[{extra}]'")
