"""How the backends' kernels meet torch: custom ops for traced calls, a plain call for eager ones.

Each backend op has two ways in, sharing one launcher and one ``setup_context``/``backward`` pair:

- **eager** (plain tensors, nothing tracing): an ``autograd.Function`` (or, for the CUDA norms, an
  autograd node written in C++) calls the launcher directly. Going through the ``torch.library``
  dispatcher instead costs about 45 µs more per forward+backward (2-core CPU machine, 2026-11-22:
  78 µs against 33 µs for a do-nothing op), as much as the kernels themselves take at training
  shapes.
- **traced** (``torch.compile``, ``make_fx``, fake tensors, ``torch.export``, any dispatch mode):
  ``torch.ops.fused_layers.<op>``, custom ops with fake implementations and the same autograd.

Registering the ops imports torch's compiler stack (seconds), so it happens on first need only:
:func:`register_custom_ops`, which Dynamo runs once at trace time as a constant. A backend module
marks the function that defines its ops with :func:`registers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["NAMESPACE", "define", "eager_function", "register_custom_ops", "registers", "run_op", "traced"]

NAMESPACE = "fused_layers"

_registrations: list[Callable[[], None]] = []
_registered = False


def registers(define_ops: Callable[[], None]) -> Callable[[], None]:
    """Decorator for a backend module's function that defines its custom ops (run by register_custom_ops)."""
    _registrations.append(define_ops)
    return define_ops


def register_custom_ops() -> bool:
    """Define every fused op as ``torch.ops.fused_layers.*``, once per process; returns True.

    The fused functions call this themselves before their first traced call; call it yourself
    only to use ``torch.ops.fused_layers`` directly.
    """
    global _registered
    if not _registered:
        for define_ops in _registrations:
            define_ops()
        _registered = True
    return True


# What torch.compiler.assume_constant_result sets, without importing Dynamo at our import: Dynamo
# runs the function once while tracing, outside the graph, and uses its result as a constant.
register_custom_ops._dynamo_marked_constant = True  # type: ignore[attr-defined]


def traced(x: Tensor) -> bool:
    """Whether this call is being traced or intercepted, and must go through the custom op."""
    return torch.compiler.is_compiling() or type(x) is not Tensor or torch._C._len_torch_dispatch_stack() > 0


def define(name: str, implementation: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """Define ``fused_layers::name`` as an opaque custom op running ``implementation``, with ``fake``
    as its fake implementation (no mutated inputs; the schema comes from the type hints)."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", implementation, mutates_args=())
    op.register_fake(fake)
    return op


def run_op(name: str, eager: Callable[..., Any], *args: Any) -> Any:
    """``eager(*args)``, or the custom op ``fused_layers::name`` on the same arguments when the call
    is traced (:func:`traced` of the first argument)."""
    if traced(args[0]) and register_custom_ops():
        return getattr(torch.ops.fused_layers, name)(*args)
    return eager(*args)


def eager_function(
    name: str,
    launcher: Callable[..., Any],
    setup_context: Callable[[Any, tuple, Any], None],
    backward: Callable[..., Any],
) -> type[torch.autograd.Function]:
    """An op's eager path: an ``autograd.Function`` named ``name`` whose forward calls ``launcher``
    directly, with no dispatcher in between, and which shares ``setup_context`` and ``backward``
    with the op's custom op.

    The forward takes ``ctx`` and calls ``setup_context`` itself: a Function with a
    ``setup_context`` staticmethod has its arguments bound with ``inspect.signature`` by
    ``Function.apply`` on every call.
    """

    def forward(ctx: Any, *args: Any) -> Any:
        output = launcher(*args)
        setup_context(ctx, args, output)
        return output

    namespace = {
        "__doc__": f"The eager path of ``{launcher.__name__}``: the launcher called directly.",
        "__module__": launcher.__module__,
        "__qualname__": name,
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
    }
    return type(name, (torch.autograd.Function,), namespace)
