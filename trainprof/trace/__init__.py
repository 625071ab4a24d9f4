"""Loading torch.profiler Chrome traces into one compact in-memory model (no torch import)."""

from trainprof.trace.load import TraceLoadError, load_trace, load_traces, sync_sites_path, worker_name
from trainprof.trace.model import EventTable, Frame, Trace

__all__ = [
    "EventTable",
    "Frame",
    "Trace",
    "TraceLoadError",
    "load_trace",
    "load_traces",
    "sync_sites_path",
    "worker_name",
]
