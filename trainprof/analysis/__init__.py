"""Why is the step slow: one module per question over a loaded trace (no torch import).

from trainprof.analysis import analyze
result = analyze("traces/")          # a file, a folder (one trace per rank) or [Trace, ...]
result.summary["verdict"], result.findings, result.to_dict()
"""

from trainprof.analysis.core import analyze
from trainprof.analysis.result import Analysis, Finding, Via, Where

__all__ = ["Analysis", "Finding", "Via", "Where", "analyze"]
