"""A child forked from a process that ran the profiler exits, instead of hanging in Kineto.

torch 2.13's Kineto keeps a static `ConfigLoader` whose destructor, run by the C library's `exit()`
once the interpreter has finalised, waits for a thread that exists only in the parent: a child made
by `os.fork()` that ends through the interpreter's shutdown (the end of its code, `sys.exit`, an
uncaught exception) hangs there forever, inside a window or long after the session (plain
`torch.profiler` alike). Children that end with `os._exit` (multiprocessing's, DataLoader workers)
never get there.

So in every child forked after a session started (`os.register_at_fork`, once per process) one
more exit handler goes on the C library's list: glibc's `on_exit`, with `_exit` itself as the
handler, which glibc calls with the exit status. `exit()` runs its handlers newest first, so this
one runs after Python's own finalisation (atexit handlers run, `sys.stdout`/`sys.stderr` flushed,
the status decided) and before the static destructors registered before the fork, Kineto's among
them: the child exits at once with its own status. What it skips is what was registered before the
fork: C++ static destructors and C `atexit` handlers (a coverage build's counters), and C stdio
buffers (`printf` from C code not yet flushed). Calling `_exit` through a slot for `void (*)(int,
void *)` passes one argument too many, which the C calling conventions of the platforms glibc
runs on ignore. Without glibc's `on_exit` (musl, macOS) nothing is installed, and such a child
still hangs: end it with `os._exit`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger("trainprof")

_installed = False


def exit_forked_children() -> bool:
    """Make every child this process forks from now on end with `_exit` once Python has finalised
    (module docstring); once per process, idempotent. False where the C library has no `on_exit`."""
    global _installed
    if _installed:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        on_exit = libc.on_exit
        exit_now = ctypes.cast(libc._exit, ctypes.c_void_p).value
    except (AttributeError, OSError):  # musl and other C libraries without on_exit
        logger.debug("trainprof: no on_exit in this C library; forked children keep Kineto's exit")
        return False
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit.restype = ctypes.c_int

    def in_child() -> None:
        on_exit(exit_now, None)

    os.register_at_fork(after_in_child=in_child)
    _installed = True
    return True
