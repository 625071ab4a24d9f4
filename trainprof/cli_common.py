"""What every `trainprof` command shares, apart from the command line itself: the one-line error
and its exit status, the error boundary of a command that reads traces, the message for a missing
extra, and silencing trainprof's own output. The command modules (`cli`, `cli_ab`, `run`, `ncu`)
import it; it imports none of them.
"""

from __future__ import annotations

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

# The extra that installs each package a command may need, for the one-line error without it.
EXTRA_OF_PACKAGE = {"torch": "train", "triton": "train", "transformers": "hf", "accelerate": "hf"}


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
            warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list; typeshed says Sequence


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


def missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    """The one-line message for a package that is not installed (`pip install 'trainprof[train]'`),
    or None when `exc` is not about a package of an extra."""
    package = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_PACKAGE.get(package)
    if extra is None:
        return None
    return (f"{command} needs {package}, which is not installed (this install analyses traces only): "
            f"pip install 'trainprof[{extra}]'")
