"""trainprof: find out why a PyTorch training step is slow.

    with trainprof.session():
        train()

Importing trainprof imports neither torch, the session nor the analysis stack: each public name is
imported on first use, so `trainprof analyze` on a trace never pays for the session's modules, and
`session` imports torch when it starts.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module it comes from, imported on first use.
_LAZY = {
    "analyze": "trainprof.analysis",
    "Analysis": "trainprof.analysis",
    "session": "trainprof.session",
    "Session": "trainprof.session",
    "SessionConfig": "trainprof.config",
}
_SUBPACKAGES = ("ab",)  # `trainprof.ab.run(factory, ...)` after a plain `import trainprof`

__all__ = ["Analysis", "Session", "SessionConfig", "__version__", "analyze", "session"]

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis import Analysis, analyze
    from trainprof.config import SessionConfig
    from trainprof.session import Session, session


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"trainprof.{name}")  # the import binds it here as well
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'trainprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})


class _Package(types.ModuleType):
    """The `trainprof` module, whose `session` is the function whichever module imports
    `trainprof.session` first: the import system binds a submodule on its package
    (`trainprof.session = <module>`), a binding dropped here. The module itself:
    `importlib.import_module("trainprof.session")`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "session" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
