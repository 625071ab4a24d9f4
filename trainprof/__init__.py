"""trainprof: find out why a PyTorch training step is slow.

    with trainprof.session():
        train()

Importing trainprof imports neither torch nor the analysis stack: `trainprof analyze` on a trace
never pays for torch, and `session` imports it when it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainprof.config import SessionConfig
from trainprof.session import Session, session  # rebinds `trainprof.session` to the function

__version__ = "0.1.0"

_LAZY = {"analyze": "trainprof.analysis", "Analysis": "trainprof.analysis"}
_SUBPACKAGES = ("ab",)  # `trainprof.ab.run(factory, ...)` after a plain `import trainprof`

__all__ = ["Analysis", "Session", "SessionConfig", "__version__", "analyze", "session"]

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis import Analysis, analyze


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"trainprof.{name}")  # the import binds it here as well
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'trainprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
