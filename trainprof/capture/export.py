"""A recorded window's trace, written into the run folder: `<worker>.<time_ns>.pt.trace.json.gz`,
the name torch's `tensorboard_trace_handler(dir, worker_name=W, use_gzip=True)` gives it.

torch's handler writes the JSON to a temporary file in `$TMPDIR` (a killed process leaves it there:
132 MB for a large window) and gzips it straight into the final name (a killed process leaves a cut
trace there, and a link planted at that name is followed). Here Kineto writes the JSON into a
private folder (mode 0700) inside the run folder, removed once the window is gzipped, and the gzip
goes through `trainprof.files.write_atomically`: the trace appears whole under its final name, or
not at all. A SIGKILL during the export leaves at most that hidden folder (`.trainprof-export-*`)
and a hidden `.*.tmp` file in the run folder, which no reader takes for a trace.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainprof.files import TRACE_SUFFIX, write_atomically

EXPORT_FOLDER_PREFIX = ".trainprof-export-"
"""The private folder a window's JSON is written to, inside the run folder, while it is exported."""
PIECE_BYTES = 1 << 20
"""Bytes of JSON read and compressed at a time (memory: one piece, not the window)."""
GZIP_LEVEL = 9
"""What torch's handler used (`gzip.open`'s default), so the files are the same size as before."""
_GZIP_WBITS = 31  # zlib's gzip container (header and CRC), as `gzip` writes it


def export_window(profiler: Any, run_dir: Path, worker: str) -> Path:
    """Export `profiler`'s last window (a `torch.profiler.profile`) as a gzipped trace into `run_dir`;
    returns its path. Raises (nothing left behind) when the export fails or Kineto wrote no trace."""
    private = tempfile.mkdtemp(prefix=EXPORT_FOLDER_PREFIX, dir=run_dir)
    try:
        json_path = os.path.join(private, "window.json")
        profiler.export_chrome_trace(json_path)  # not `.gz`: torch would go through $TMPDIR again
        _check_whole(json_path)
        path = run_dir / f"{worker}.{time.time_ns()}{TRACE_SUFFIX}"
        return write_atomically(path, _gzipped(json_path))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _check_whole(json_path: str) -> None:
    """Raise unless the file is a JSON object from `{` to `}` (a full disk cuts Kineto's write short)."""
    with open(json_path, "rb") as f:
        head = f.read(64).lstrip()
        end = f.seek(0, os.SEEK_END)
        f.seek(max(end - 64, 0))
        tail = f.read().rstrip()
    if not (head.startswith(b"{") and tail.endswith(b"}")):
        raise RuntimeError(f"the profiler wrote no whole trace ({end} bytes, empty or cut short)")


def _gzipped(json_path: str) -> Iterator[bytes]:
    """The file gzipped, a piece at a time."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    with open(json_path, "rb") as f:
        while piece := f.read(PIECE_BYTES):
            yield compressor.compress(piece)
    yield compressor.flush()
