"""A run's files: their names (the contract between the session that writes them and the loader that
reads them back, `trainprof.trace.load`), and the one way trainprof writes and reads a file in a
folder others may write to.

A log folder is often shared (a cluster's group-writable logdir, a team's TensorBoard), so what is
in it is untrusted: a name may be a link planted to make trainprof overwrite, or serve, a file
elsewhere. Every file trainprof writes goes through `write_atomically`, and what the TensorBoard
tab reads goes through `open_to_read` inside `reads_confined_to(logdir)`. Imports nothing beyond
the standard library's core: `import trainprof` stays cheap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

TRACE_SUFFIX = ".pt.trace.json.gz"
"""What the session's trace files end with (torch's `tensorboard_trace_handler` with gzip)."""
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
"""What a folder's trace files end with, gzipped or not."""
SYNCSITES_SUFFIX = ".syncsites.json"
"""`<worker>.syncsites.json`: the captured sync sites beside a worker's traces (DEVELOPING.md)."""
PEAKS_SUFFIX = ".peaks.json"
"""`<worker>.peaks.json`: the device's matmul and copy rates the session measured, beside its traces
(`trainprof.capture.peaks`)."""
MEMORY_SUFFIX = ".memory.json"
"""`<worker>.memory.json`: the caching allocator's state the session captured (at each window's end, at an
out-of-memory error), beside its traces (`trainprof.trace.memory_file`)."""
MEMORY_HISTORY_SUFFIX = ".memory_history.pickle"
"""`<worker>.memory_history.pickle`: the allocator's recorded history (`session(memory_history=True)`),
as `torch.cuda.memory._dump_snapshot` writes it: PyTorch's memory viewer opens it."""
SESSION_METADATA_KEY = "trainprof"
"""A top-level key of a trace the session flushed at its stop: `{"steps_ended": N}`, the steps that
ended in the process by then. `ProfilerStep#k` with k >= N was cut short by the loop's end; the
session's analysis and `trainprof analyze` both leave it out."""
TEMPORARY_PREFIX = "."
TEMPORARY_SUFFIX = ".tmp"
"""A file being written is `.<name>.<16 random hex digits>.tmp` beside its final name."""

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NON_BLOCKING = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO would otherwise wait for its other end


def write_text_atomically(path: str | Path, text: str, *, named_by_user: bool = False) -> Path:
    """Write `text` (UTF-8) to `path` (`write_atomically`)."""
    return write_atomically(path, [text.encode("utf-8")], named_by_user=named_by_user)


def write_atomically(path: str | Path, chunks: Iterable[bytes], *, named_by_user: bool = False) -> Path:
    """Write `chunks` to `path` so that nothing but `path` itself can change, and never half-way.

    The bytes go to a new temporary file beside `path`, created with O_CREAT | O_EXCL | O_NOFOLLOW
    under a random name (a link planted at a guessed name is never followed, a file there never
    reused), which is then renamed over `path`. A rename replaces a directory entry, so it is done
    only onto a regular file or nothing; a failure (a full disk) removes the temporary file and
    raises: `path` is the old file or the whole new one.

    Where `path` is something else (a symbolic link, a device such as /dev/stdout, a FIFO):
    - `named_by_user` (the user typed it, `trainprof report --html /dev/stdout`): written through,
      as a shell's `>` would, without a rename (which would replace the device node by a file);
    - else (a name inside a run or log folder): `FileExistsError`, one line; nothing is written and
      the entry stays as it is (it may be the user's own link, or someone else's trap).
    """
    path = Path(path)
    kind = _kind(path)
    if kind is not None:
        if not named_by_user:
            raise FileExistsError(errno.EEXIST, f"exists and is {kind}, not a regular file: trainprof "
                                  "writes there only over a regular file or nothing", str(path))
        with open(path, "wb") as through:
            for chunk in chunks:
                through.write(chunk)
        return path
    # Permissions as a plain open() gives them (0o666 less the umask): tempfile.mkstemp's 0o600
    # would hide a report from the group that shares the folder.
    tmp = path.with_name(f"{TEMPORARY_PREFIX}{path.name}.{os.urandom(8).hex()}{TEMPORARY_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        kind = _kind(path)  # looked at again: the rename must not replace what appeared meanwhile
        if kind is not None:
            raise FileExistsError(errno.EEXIST, f"became {kind} while it was written", str(path))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def _kind(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file (`a symbolic link`, ...); else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return file_kind(mode)


_FILE_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def file_kind(mode: int) -> str:
    """`a FIFO`, `a character device`, ...: what a file that is not a regular file is, for a message."""
    return next((kind for test, kind in _FILE_KINDS if test(mode)), "a special file")


_READ_ROOT: ContextVar[str | None] = ContextVar("trainprof_read_root", default=None)


@contextlib.contextmanager
def reads_confined_to(root: str | os.PathLike[str]) -> Iterator[None]:
    """Inside the block (this thread or task), `open_to_read` opens only files whose real path lies
    under `root`'s: what the TensorBoard tab reads of a logdir others can write to."""
    token = _READ_ROOT.set(os.path.realpath(root))
    try:
        yield
    finally:
        _READ_ROOT.reset(token)


def open_to_read(path: str | Path) -> int:
    """A file descriptor reading `path`, non-blocking (a FIFO never waits for a writer).

    Inside `reads_confined_to(root)`: only a path whose real path lies under `root`, opened by that
    real path without following a link at its last part (a link swapped in after the check);
    `PermissionError` otherwise, so a link planted in a logdir never leads outside it.
    """
    root = _READ_ROOT.get()
    if root is None:
        return os.open(path, os.O_RDONLY | _NON_BLOCKING)
    real = os.path.realpath(path)
    if not is_within(real, root):
        raise PermissionError(errno.EACCES, "leads outside the folder being served", str(path))
    return os.open(real, os.O_RDONLY | _NON_BLOCKING | _NO_FOLLOW)


def is_within(real_path: str, real_root: str) -> bool:
    """Whether `real_path` is `real_root` or lies under it (both already resolved, `os.path.realpath`)."""
    return real_path == real_root or real_path.startswith(real_root.rstrip(os.sep) + os.sep)
