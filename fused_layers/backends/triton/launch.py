"""How the fused ops meet torch: custom ops for torch.compile, and a cheap launch for eager calls.

Each op has two ways in, sharing one launcher and one ``setup_context``/``backward`` pair:

- **eager** (plain tensors, nothing tracing): the op's ``autograd.Function`` calls the launcher,
  and the launcher calls the compiled Triton kernel directly (:func:`launch`). Going through the
  ``torch.library`` dispatcher instead costs about 45 µs more per forward+backward (2-core CPU
  machine, 2026-11-22: 78 µs against 33 µs for a do-nothing op), as much as the kernels
  themselves take at training shapes.
- **traced** (``torch.compile``, ``make_fx``, fake tensors, ``torch.export``, any dispatch
  mode): ``torch.ops.fused_layers.<op>``, custom ops with fake implementations and the same
  autograd. On a GPU they are ``torch.library.triton_op`` s whose kernels are called through
  ``wrap_triton``, so Inductor sees and calls the kernels itself; under Triton's CPU
  interpreter, which cannot be traced, they are opaque ``custom_op`` s.

Registering the ops imports torch's compiler stack (seconds), so it happens on first need only:
:func:`register_custom_ops`, which Dynamo runs once at trace time as a constant.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fused_layers.ops._triton import AVAILABLE as TRITON_AVAILABLE
from fused_layers.ops._triton import triton

NAMESPACE = "fused_layers"

#: Triton's CPU interpreter is on (the kernels were defined as interpreted functions at import).
INTERPRETING = TRITON_AVAILABLE and os.environ.get("TRITON_INTERPRET") == "1"

#: Whether eager calls launch compiled kernels directly (set FUSED_LAYERS_DIRECT_LAUNCH=0 for
#: Triton's own launcher, e.g. to compare host times). Needs Triton >= 3.4, whose compiled
#: launcher takes every kernel argument, constexprs included, in signature order.
DIRECT_LAUNCH = os.environ.get("FUSED_LAYERS_DIRECT_LAUNCH", "1") != "0" and tuple(
    int(part) for part in triton.__version__.split(".")[:2]
) >= (3, 4)

_registrations: list[Callable[[], None]] = []
_registered = False


def registers(define: Callable[[], None]) -> Callable[[], None]:
    """Decorator for an op module's function that defines its custom ops (run by register_custom_ops)."""
    _registrations.append(define)
    return define


def register_custom_ops() -> bool:
    """Define every fused op as ``torch.ops.fused_layers.*``, once per process; returns True.

    The fused functions call this themselves before their first traced call; call it yourself
    only to use ``torch.ops.fused_layers`` directly.
    """
    global _registered
    if not _registered:
        for define in _registrations:
            define()
        _registered = True
    return True


# What torch.compiler.assume_constant_result sets, without importing Dynamo at our import: Dynamo
# runs the function once while tracing, outside the graph, and uses its result as a constant.
register_custom_ops._dynamo_marked_constant = True  # type: ignore[attr-defined]


def traced(x: Tensor) -> bool:
    """Whether this call is being traced or intercepted, and must go through the custom op."""
    return torch.compiler.is_compiling() or type(x) is not Tensor or torch._C._len_torch_dispatch_stack() > 0


def define(name: str, launcher: Callable[..., Any], fake: Callable[..., Any] | None = None) -> Any:
    """Define ``fused_layers::name`` running ``launcher`` (no mutated inputs; schema from its hints).

    Without ``fake``, ``launcher`` is a Triton launcher (only torch ops and :func:`launch`), which
    is its own fake implementation: a triton_op on a GPU, a custom_op under the interpreter.
    With ``fake`` (the CUDA C++ ops) it is an opaque custom_op with that fake implementation.
    """
    qualname = f"{NAMESPACE}::{name}"
    if fake is None and not INTERPRETING:
        return torch.library.triton_op(qualname, launcher, mutates_args=())
    op = torch.library.custom_op(qualname, launcher, mutates_args=())
    op.register_fake(fake or launcher)
    return op


# kernel -> {specialisation key: (compiled launcher, function handle, packed metadata, constexprs)}
_compiled: dict[Any, dict[tuple, tuple]] = {}


def launch(kernel: Any, grid: tuple[int, ...], args: tuple, **meta: Any) -> None:
    """Launch ``kernel[grid](*args, **meta)``: directly when eager, through wrap_triton when traced.

    ``args`` are the kernel's runtime arguments in order, ``meta`` its constexprs and launch
    options (num_warps). Eager calls skip Triton's per-call binding, specialisation and cache-key
    string (``JITFunction.run``): the compiled kernel for this call's specialisation (dtypes,
    16-byte alignment of pointers and ints, ints equal to 1) is looked up in a dict and its
    launcher called with the current stream.
    """
    if type(args[0]) is not Tensor:  # fake or functional tensors: tracing
        if INTERPRETING:
            return  # the interpreter cannot trace; the allocated outputs are all a fake needs
        torch.library.wrap_triton(kernel)[grid](*args, **meta)
        return
    if not DIRECT_LAUNCH or INTERPRETING:
        kernel[grid](*args, **meta)
        return
    device = torch.cuda.current_device()
    key = (device, *meta.values(), *map(_specialisation, args))
    by_key = _compiled.setdefault(kernel, {})
    entry = by_key.get(key)
    if entry is None or _hooked(triton.knobs.runtime.launch_enter_hook) or _hooked(
        triton.knobs.runtime.launch_exit_hook
    ):
        # First call with this specialisation (Triton compiles or finds it in its cache), or a
        # profiling hook that needs Triton's launch metadata: Triton's own launcher.
        compiled = kernel[grid](*args, **meta)
        if entry is None and compiled is not None:
            by_key[key] = _entry(kernel, compiled, args, meta)
        return
    run, function, packed_metadata, constexprs = entry
    stream = torch._C._cuda_getCurrentRawStream(device)
    run(grid[0], 1, 1, stream, function, packed_metadata, None, None, None, *args, *constexprs)


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is set. Triton >= 3.6 holds an empty ``HookChain`` where older
    versions held None; compared with None, the empty chain sent every call through Triton's own
    launcher (seen on an H200, triton 3.6, 2026-11-23: ``JITFunction.run`` once per launch)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _specialisation(arg: Any) -> Any:
    """The part of an argument Triton specialises a kernel on."""
    if isinstance(arg, Tensor):
        return arg.dtype, arg.data_ptr() & 15 == 0
    if isinstance(arg, int):
        return arg == 1, arg & 15 == 0, -(2**31) <= arg < 2**31
    return None  # floats: never specialised


def _entry(kernel: Any, compiled: Any, args: tuple, meta: dict[str, Any]) -> tuple:
    params = kernel.params
    if len(args) + sum(p.is_constexpr for p in params) != len(params) or any(
        p.is_constexpr for p in params[: len(args)]
    ):
        raise AssertionError(f"{kernel.fn.__name__}: constexprs must follow the runtime arguments")
    constexprs = tuple(meta[p.name] for p in params[len(args) :])
    return compiled.run, compiled.function, compiled.packed_metadata, constexprs
