"""The names of a run's files: the contract between the session that writes them and the loader
that reads them back (`trainprof.trace.load`). Imports nothing: `import trainprof` stays cheap."""

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
