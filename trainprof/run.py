"""`trainprof run [options] script.py [args]`: an unchanged script under a session.

    trainprof run train.py --lr 3e-4                                  # one process
    torchrun --nproc_per_node=8 -m trainprof run train.py --lr 3e-4   # every rank, one run folder

The script runs as `python script.py args` would run it (the way `nsys profile python train.py`
wraps a program): `sys.argv` is `[script, *args]`, the script's folder is `sys.path[0]`, its code
runs as `__main__`, its exit code is kept, and an exception it raises is printed with the script's
own traceback (trainprof's frames left out) and exits with 1 (Ctrl-C: `EXIT_INTERRUPTED`, 130).
Steps are the script's `optimizer.step()` calls, as in any session.

Under a launcher, every rank's session writes into one run folder without any communication: the
folder's name comes from `TRAINPROF_RUN_NAME`, else from torchrun's run id (`TORCHELASTIC_RUN_ID`,
the same on every node of a job), else from the launcher process that the ranks of one node share.
The command's arguments: `trainprof.cli.run`.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.run_name import shared_run_name

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.session import Session

EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT, as shells report a program that SIGINT ended)."""
def run_script(
    script: str | os.PathLike[str], args: list[str] | None = None, **options: Any
) -> tuple[int, Session]:
    """Run `script` with `args` as `__main__` inside `trainprof.session(**options)`.

    Returns the script's exit code (0 when it ends normally, else its `SystemExit` code; 1 after an
    exception, `EXIT_INTERRUPTED` after Ctrl-C, whose traceback is printed to stderr as Python prints
    an uncaught one, from the script's frames) and the finished session. Unless given, `run_name`
    comes from `shared_run_name()`. Raises FileNotFoundError when `script` is not a file.
    """
    from trainprof.session import session

    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"{script}: no such file")
    if options.get("run_name") is None:
        options["run_name"] = shared_run_name()
    sess = session(**options)
    sess.started_by = "run"  # its advice names trainprof run's options, not a loop's code
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *(args or [])]
    # As `python script.py` does: the script's folder first on the import path.
    sys.path[0:1] = [str(path.resolve().parent)]
    try:
        with sess:
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as stop:
                # A script that exits (with any code) ended its work; its steps are reported.
                return _exit_code(stop.code), sess
        return 0, sess
    except (Exception, KeyboardInterrupt) as error:  # the script's own: the session stopped, no report
        # Python prints an exception with its own __traceback__: shorten it to the script's frames.
        frames = _script_frames(error.__traceback__, path)
        if frames is None and not isinstance(error, (KeyboardInterrupt, SyntaxError)):
            frames = error.__traceback__  # raised before the script ran, not by its code: all of it
        # A syntax error in the script itself has no frame: Python shows it as its file and line.
        error = error.with_traceback(frames)  # (Ctrl-C after the script, in the session: no frame)
        sys.excepthook(type(error), error, error.__traceback__)
        return (EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else 1), sess
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _exit_code(code: Any) -> int:
    """The process exit status that `sys.exit(code)` gives (a message goes to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _script_frames(tb: types.TracebackType | None, script: Path) -> types.TracebackType | None:
    """The traceback from the script's first frame on (trainprof's and runpy's frames dropped);
    None when no frame is the script's."""
    target = os.path.realpath(script)
    entry = tb
    while entry is not None:
        if os.path.realpath(entry.tb_frame.f_code.co_filename) == target:
            return entry
        entry = entry.tb_next
    return None
