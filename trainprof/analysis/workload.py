"""Is the traced loop training or inference? Advice that fits one does not fit the other.

A training step shows a backward pass (autograd's `evaluate_function` ops, or ops whose `Fwd thread
id` links them to a forward op) or an optimizer's step (`Optimizer.step#...` / `Optimizer.zero_grad#...`
ranges); an inference loop (a server's forward, `torch.no_grad()` evaluation) shows neither. A trace
that recorded no ops at all cannot tell, and is taken for training (the advice stays as it was).
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.attribution import BACKWARD_PREFIX, OPTIMIZER_PREFIXES
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
