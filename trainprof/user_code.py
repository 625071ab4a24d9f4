"""Which source files are the user's code: one rule for the live capture and for trace analysis.

The session records the innermost user frame of each sync while the loop runs; the analysis finds
the innermost user `python_function` of the same sync in the trace and joins the two by it. Both
must draw the line between user and library code in the same place, so both call `is_user_file`.
"""

from __future__ import annotations

import functools
import sys
import sysconfig

# Frames from these packages are library code, never "the user's line".
LIBRARY_PACKAGES = frozenset(
    {
        "torch",
        "transformers",
        "accelerate",
        "trainprof",
        "triton",
        "numpy",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "torchvision",
        "torchaudio",
        "peft",
        "datasets",
        "apex",
        "torchao",
        "functorch",
    }
)
_STDLIB_MODULES = frozenset(getattr(sys, "stdlib_module_names", ()))
# This interpreter's stdlib folders (e.g. /usr/lib64/python3.11/), for absolute paths of live frames.
_STDLIB_ROOTS = tuple(
    sorted({path.replace("\\", "/").rstrip("/") + "/" for key in ("stdlib", "platstdlib")
            if (path := sysconfig.get_paths().get(key))})
)
# Files inside a library package that hold a training loop of the user's kind.
_USER_FILES_IN_LIBRARIES = ("trainprof/demo.py",)


@functools.lru_cache(maxsize=4096)  # the capture asks about the same few files at every sync
def is_user_file(file: str) -> bool:
    """True for the user's code: not site-packages, the stdlib, `<frozen ...>`, or a known library.

    Takes a live frame's `co_filename` or a trace's `python_function` file, which the profiler writes
    relative to its sys.path entry (`torch/nn/modules/module.py`) or absolute.
    """
    path = file.replace("\\", "/")
    if path.startswith("<") or "site-packages/" in path or "dist-packages/" in path:
        return False
    if "/lib/python3" in path or path.startswith(_STDLIB_ROOTS):  # the interpreter's stdlib
        return False
    if path.endswith(_USER_FILES_IN_LIBRARIES):  # trainprof's demo loop is the user's code there
        return True
    # A source checkout (`/src/trainprof/trainprof/session.py`) is library code too: any folder of
    # the path named like a library package marks it.
    parts = path.lstrip("./").split("/")
    top = parts[0][:-3] if parts[0].endswith(".py") else parts[0]
    if top in _STDLIB_MODULES:
        return False
    return not any(part in LIBRARY_PACKAGES for part in [top, *parts[1:-1]])
