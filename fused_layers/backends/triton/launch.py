"""How a Triton kernel is launched and registered: directly when eager, as a custom op when traced.

- **eager** (plain tensors, nothing tracing): the op's ``autograd.Function`` calls its launcher,
  and the launcher calls the compiled kernel directly (:func:`launch`), skipping Triton's per-call
  binding (see ``fused_layers.backends.custom_ops`` for why not the dispatcher either).
- **traced**: the op's custom op (:func:`define`). On a GPU it is a ``torch.library.triton_op``
  whose kernels are called through ``wrap_triton``, so Inductor sees and calls the kernels itself;
  under Triton's CPU interpreter, which cannot be traced, an opaque ``custom_op``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fused_layers.backends import custom_ops
from fused_layers.backends.triton.language import AVAILABLE as TRITON_AVAILABLE
from fused_layers.backends.triton.language import triton

#: Triton's CPU interpreter is on (the kernels were defined as interpreted functions at import).
INTERPRETING = TRITON_AVAILABLE and os.environ.get("TRITON_INTERPRET") == "1"

#: Whether eager calls launch compiled kernels directly (set FUSED_LAYERS_DIRECT_LAUNCH=0 for
#: Triton's own launcher, e.g. to compare host times). Needs Triton >= 3.4, whose compiled
#: launcher takes every kernel argument, constexprs included, in signature order.
DIRECT_LAUNCH = os.environ.get("FUSED_LAYERS_DIRECT_LAUNCH", "1") != "0" and tuple(
    int(part) for part in triton.__version__.split(".")[:2]
) >= (3, 4)


def define(name: str, launcher: Callable[..., Any]) -> Any:
    """Define ``fused_layers::name`` running the Triton launcher ``launcher`` (only torch ops and
    :func:`launch`, so it is its own fake implementation; no mutated inputs; schema from its hints):
    a triton_op on a GPU, an opaque custom_op under the interpreter."""
    if INTERPRETING:
        return custom_ops.define(name, launcher, fake=launcher)
    return torch.library.triton_op(f"{custom_ops.NAMESPACE}::{name}", launcher, mutates_args=())


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
