"""What the trace is: a training or an inference loop, recorded by a trainprof session or elsewhere.
Advice that fits one does not fit the other.

A training step shows a backward pass (autograd's `evaluate_function` ops, or ops whose `Fwd thread
id` links them to a forward op) or an optimizer's step (`Optimizer.step#...` / `Optimizer.zero_grad#...`
ranges); an inference loop (a server's forward, `torch.no_grad()` evaluation) shows neither. A trace
that recorded no ops at all cannot tell, and is taken for training (the advice stays as it was).
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.attribution import BACKWARD_PREFIX, OPTIMIZER_PREFIXES
from trainprof.files import SESSION_METADATA_KEY
from trainprof.trace import Trace

TRAINING_MARKERS = (BACKWARD_PREFIX, *OPTIMIZER_PREFIXES)


def is_inference(trace: Trace) -> bool:
    """True when the trace recorded ops and none of them is backward or optimizer work (module docstring)."""
    ops = trace.events["cpu_op"]
    if not len(ops):
        return False
    if ops.fwd_thread is not None and bool(np.any(ops.fwd_thread > 0)):
        return False
    text = "\n".join(trace.names)
    return not any(marker in text for marker in TRAINING_MARKERS)


SESSION_FRAMES = ("trainprof/session/", "trainprof/session.py", "trainprof/capture/")
"""The session's own Python frames (`session.py` before it was a package): a trace that records them
was recorded by a session."""


def recorded_by_session(trace: Trace) -> bool:
    """True when a trainprof session recorded the trace: it left its sync sites or peaks file beside
    it, its mark in it (DEVELOPING.md, contracts), or its own frames (a trace with stacks). Only then
    do fixes name the session's own options (`capture_syncs=False`): a trace from torch.profiler, HTA
    or a server has none of them."""
    if trace.sync_sites_path is not None or trace.device_peaks is not None:
        return True
    if SESSION_METADATA_KEY in (trace.metadata or {}):
        return True
    text = "\n".join(trace.names)  # one scan: `in` over one string beats a loop over thousands of names
    return any(frame in text for frame in SESSION_FRAMES)
