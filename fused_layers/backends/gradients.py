"""Whether a backward may write its result into the gradient it was handed.

The gradient of an op's output belongs to autograd: a hook on the output, ``retain_grad()`` or a
module backward hook may hold it after the op's backward has run. Only the code that made the output
and hands it to one consumer of its own knows that nothing else reads that gradient:
``fused_layers.modules.FusedGatedMLP``, whose gated activation feeds its own ``down_proj`` (when that
module has no hooks). Inside ``private_output_gradient()`` the Triton gated backward called eagerly
writes ``da`` over the gradient it was handed instead of a new tensor: one (tokens, intermediate)
tensor less at the step's peak when the MLP's backward sets it (128 MiB at Llama-3.2-1B's shape, B4
x T2048, bf16; H200, 2026-11-25), as Liger's SwiGLU saves by writing into its saved inputs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_PRIVATE = contextvars.ContextVar("fused_layers_private_output_gradient", default=False)


@contextlib.contextmanager
def private_output_gradient(private: bool = True) -> Iterator[None]:
    """Ops called eagerly inside may overwrite their output's gradient in their backward (`private`)."""
    token = _PRIVATE.set(private)
    try:
        yield
    finally:
        _PRIVATE.reset(token)


def output_gradient_is_private() -> bool:
    """Whether the op being called now may overwrite its output's gradient in its backward."""
    return _PRIVATE.get()
