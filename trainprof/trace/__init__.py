"""Loading torch.profiler Chrome traces into one compact in-memory model (no torch import)."""

from trainprof.trace.load import (
    TraceLoadError,
    load_trace,
    load_traces,
    max_trace_bytes,
    newest_run,
    sync_sites_path,
    trace_size_limit,
    worker_of,
)
from trainprof.trace.model import EventTable, Trace

__all__ = [
    "EventTable",
    "Trace",
    "TraceLoadError",
    "load_trace",
    "load_traces",
    "max_trace_bytes",
    "newest_run",
    "sync_sites_path",
    "trace_size_limit",
    "worker_of",
]
