"""Reroute a module-level function to another implementation for chosen nn.Modules only.

Hugging Face's attention forwards call module-level functions of their modeling file
(``apply_rotary_pos_emb``), so a fused version of such a function cannot be put into one model by
replacing a module, and rebinding the function (as Liger-Kernel does) changes every model of that
family in the process. Here the function's global is replaced once by a dispatcher, which runs the
implementation routed to the innermost routed module whose forward is running on this thread,
and the original everywhere else:

- a forward pre-hook on each routed module pushes (module, implementation) on a thread-local
  stack; a forward hook registered with ``always_call=True`` pops it, also when the forward
  raises. Other threads, and modules that are not routed, see the original;
- under ``torch.compile`` the hooks do nothing and the dispatcher calls the original, so Dynamo
  traces Hugging Face's own function (what the fused ops' default backend is under compile anyway);
- the dispatcher is installed with the first route of a (module, function) and the original put
  back, the very same object, when the last route is removed. A route whose module is
  garbage-collected is only marked: a collection can run in the middle of a ``torch.compile``
  trace, and rebinding the global there left Dynamo building a guard on a function that was no
  longer the one it traced (an H200 test of a swapped Llama under ``mode="reduce-overhead"``,
  2026-11-24: ``InternalTorchDynamoError`` on ``apply_rotary_pos_emb.__closure__[0]``). The next
  route or removal, or :func:`settle`, puts the original back; until then the dispatcher, with no
  routed forward running, calls the original.

``copy.deepcopy`` of a model copies each route with its module: the copy is routed too, and keeps
the function rerouted until its own route is removed or it is collected.

Limits: a module that is not routed but runs inside a routed one's forward (no Hugging Face model
nests attention modules) sees the outer module's implementation; a routed model cannot be pickled
whole (its hooks are closures; ``state_dict`` is unaffected).
"""

from __future__ import annotations

import copy
import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

__all__ = ["FunctionRoute", "is_routed", "original_function", "route_function", "settle"]


class _Dispatch:
    """The dispatcher standing in for ``namespace.name``, and the modules routed through it."""

    def __init__(self, namespace: ModuleType, name: str, original: Callable) -> None:
        self.namespace = namespace
        self.name = name
        self.original = original
        self.modules: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.routes = 0  # live routes; the modules' finalizers count them down
        self._local = threading.local()
        self.function = self._dispatcher()

    @property
    def key(self) -> tuple[str, str]:
        """(module name, function name): its key in the registry of installed dispatchers."""
        return self.namespace.__name__, self.name

    def registered(self) -> bool:
        """Whether this is the dispatcher registered for its function (the caller holds ``_lock``)."""
        return _dispatches.get(self.key) is self

    def stack(self) -> list[tuple[nn.Module, Callable]]:
        """This thread's stack of (routed module whose forward is running, its implementation)."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _dispatcher(self) -> Callable:
        original, local = self.original, self._local

        @functools.wraps(original)
        def dispatcher(*args: Any, **kwargs: Any) -> Any:
            stack = getattr(local, "stack", None)
            if stack and not torch.compiler.is_compiling():
                return stack[-1][1](*args, **kwargs)
            return original(*args, **kwargs)

        return dispatcher


# (module name, function name) -> the installed dispatcher
_dispatches: dict[tuple[str, str], _Dispatch] = {}
_lock = threading.RLock()  # reentrant: a finalizer may run _release while this thread holds it


def _installed(namespace: ModuleType, name: str) -> _Dispatch | None:
    """The dispatcher of ``namespace.name`` if it is the one in place there now."""
    dispatch = _dispatches.get((namespace.__name__, name))
    if dispatch is not None and getattr(namespace, name, None) is dispatch.function:
        return dispatch
    return None


def original_function(namespace: ModuleType, name: str) -> Callable:
    """``namespace.name`` as it was before any route: the original behind an installed dispatcher."""
    dispatch = _installed(namespace, name)
    return dispatch.original if dispatch is not None else getattr(namespace, name)


def is_routed(module: nn.Module, namespace: ModuleType, name: str) -> bool:
    """Whether ``module`` already has a live route of ``namespace.name``."""
    dispatch = _installed(namespace, name)
    return dispatch is not None and module in dispatch.modules


_collected: set[_Dispatch] = set()  # dispatchers whose last route's module was collected


def _release(dispatch: _Dispatch, collected: bool = False) -> None:
    """One route fewer; with the last, put the original back (unless something else rebound it).

    ``collected``: the module was garbage-collected (a finalizer, which may run inside a trace):
    only mark the dispatcher, for :func:`settle` to restore at a safe point.
    """
    with _lock:
        dispatch.routes -= 1
        if dispatch.routes > 0:
            return
        if collected:
            _collected.add(dispatch)
            return
    _restore(dispatch)


def _restore(dispatch: _Dispatch) -> None:
    with _lock:
        _collected.discard(dispatch)
        if dispatch.routes > 0:  # routed again since it was marked
            return
        if dispatch.registered():
            del _dispatches[dispatch.key]
        if getattr(dispatch.namespace, dispatch.name, None) is dispatch.function:
            setattr(dispatch.namespace, dispatch.name, dispatch.original)
            return
    function = f"{dispatch.namespace.__name__}.{dispatch.name}"
    # stacklevel: this, _release or settle, their caller (remove/route_function), unswap, unswap's caller
    warnings.warn(
        f"fused_layers: {function} was rebound after the swap; left as it is", RuntimeWarning, stacklevel=5
    )


def settle() -> None:
    """Put back the original of every function whose last routed module was garbage-collected.

    ``fused_layers.swap`` and ``unswap`` call it; call it yourself to see the module's function
    restored right after dropping a swapped model (and collecting it).
    """
    with _lock:
        pending = list(_collected)
    for dispatch in pending:
        _restore(dispatch)


class FunctionRoute:
    """One module's route of one function; ``remove()`` undoes it (idempotent)."""

    def __init__(self, module: nn.Module, dispatch: _Dispatch, handles: list) -> None:
        self._module = weakref.ref(module)
        self._dispatch = dispatch
        self._handles = handles
        # A module dropped without remove() releases its route when it is collected.
        self._finalizer: weakref.finalize | None = weakref.finalize(module, _release, dispatch, True)

    def __deepcopy__(self, memo: dict) -> FunctionRoute:
        """The route of the module's copy, whose hooks ``copy.deepcopy`` copied with it (the
        handles are copied to point at them). A route whose module is not part of the same copy,
        or that was removed, copies as a removed route."""
        module = self._module()
        copied = memo.get(id(module)) if module is not None else None
        route = FunctionRoute.__new__(FunctionRoute)
        route._dispatch = self._dispatch
        route._handles = copy.deepcopy(self._handles, memo)
        with _lock:
            live = copied is not None and self._finalizer is not None and self._finalizer.alive
            live = live and self._dispatch.registered()
            if live:
                self._dispatch.modules.add(copied)
                self._dispatch.routes += 1
        route._module = weakref.ref(copied) if live else lambda: None
        route._finalizer = weakref.finalize(copied, _release, self._dispatch, True) if live else None
        return route

    @property
    def function(self) -> str:
        """``"module.function"``: the global this route stands in for."""
        return f"{self._dispatch.namespace.__name__}.{self._dispatch.name}"

    def remove(self) -> None:
        """Remove the hooks; with the last route of the function, put the original back.

        If something else rebound the function after the dispatcher was installed, that binding
        is left as it is, with a warning.
        """
        if self._finalizer is None or not self._finalizer.alive:
            return
        for handle in self._handles:
            handle.remove()
        module = self._module()
        if module is not None:
            self._dispatch.modules.discard(module)
        self._finalizer.detach()  # no release at collection: this one counts instead
        _release(self._dispatch)
        settle()


def route_function(
    module: nn.Module, namespace: ModuleType, name: str, implementation: Callable
) -> FunctionRoute:
    """While ``module``'s forward runs on a thread, ``namespace.name`` runs ``implementation`` there.

    ``implementation`` takes the function's arguments. Raises ValueError if ``module`` already
    has a route of this function.
    """
    settle()
    with _lock:
        dispatch = _installed(namespace, name)
        if dispatch is None:
            dispatch = _Dispatch(namespace, name, getattr(namespace, name))
            _dispatches[dispatch.key] = dispatch
            setattr(namespace, name, dispatch.function)
        if module in dispatch.modules:
            raise ValueError(f"{type(module).__name__} already has a route of {namespace.__name__}.{name}")
        dispatch.modules.add(module)
        dispatch.routes += 1

    def enter(routed: nn.Module, _args: tuple) -> None:
        if not torch.compiler.is_compiling():
            dispatch.stack().append((routed, implementation))

    def leave(routed: nn.Module, _args: tuple, _output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        stack = dispatch.stack()
        # The innermost entry of this module: a forward that raised before a nested one's hook ran
        # cannot leave an entry of another module on top.
        for index in range(len(stack) - 1, -1, -1):
            if stack[index][0] is routed:
                del stack[index]
                return

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    return FunctionRoute(module, dispatch, handles)
