"""Why is the step slow: one module per question over a loaded trace (no torch import).

from trainprof.analysis import analyze
result = analyze("traces/")          # a file, a folder (one trace per rank) or [Trace, ...]
result.summary.verdict, result.findings, result.steps, result.to_dict()

The result's records (`Analysis`, `Step`, `Finding`, ...) and its JSON form: `trainprof.analysis.result`.
Importing this package runs no analysis module: `analyze` is imported on first use, so the records
(e.g. a session's `Summary`) cost no numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainprof.analysis.result import Analysis, Finding, Step, Summary, TraceInfo, Via, Where

__all__ = ["Analysis", "Finding", "Step", "Summary", "TraceInfo", "Via", "Where", "analyze"]

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.core import analyze


def __getattr__(name: str) -> Any:
    if name != "analyze":
        raise AttributeError(f"module 'trainprof.analysis' has no attribute {name!r}")
    value = importlib.import_module("trainprof.analysis.core").analyze
    globals()[name] = value
    return value
