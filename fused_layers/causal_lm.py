"""A causal LM's loss by fused linear cross-entropy: the (tokens, vocab) logits never made when
the model is called with labels.

Hugging Face's causal LMs end their forward the same way::

    hidden = self.model(...)                        # or self.transformer (GPT-2)
    logits = self.lm_head(hidden)                   # the [B, T, V] logits: 2 GiB in bf16 at
    logits = cap * tanh(logits / cap)               #   B4 x T2048 x 128,256, and their fp32 copy
    loss = self.loss_function(logits, labels, ...)  #   in the loss (Gemma-2/3 only: the cap)

``swap`` leaves that forward as it is and changes who computes what, for one model instance:

- ``lm_head`` becomes a :class:`~fused_layers.modules.FusedLMHead` holding the same Parameters;
- a forward pre-hook on the model takes ``labels`` out of the call (so Hugging Face computes no
  loss) and hands them, with ``num_items_in_batch``, ``ignore_index`` and ``shift_labels``, to the
  head, which computes the shifted loss from the hidden states it is given and returns an empty
  (B, T, 0) placeholder for the logits (the cap's three ops run on nothing);
- a forward hook puts the loss into the model's output and sets ``logits`` to None.

So with labels the model returns ``loss`` and ``logits=None`` (as Liger-Kernel's fused forward
does in training), in training and in eval mode alike; without labels nothing changes
(generation, inference). Both hooks read the head through the module they are called with, so a
deep copy of the model is routed to its own head. Under ``torch.compile`` Dynamo traces the hooks
and the head's state with the forward: the loss and its gradients are one graph's.

Only the families of ``swap.TABLE``'s rows: a forward that does anything else to the logits
between ``lm_head`` and the loss (Cohere's ``logit_scale``, Granite's ``logits_scaling``) would
get a wrong loss, so it is not matched by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from fused_layers.modules import FusedLMHead

__all__ = ["HEAD", "LOSS_OPTIONS", "HeadRoute", "LeaveReason", "attach", "head_route"]

#: The attribute of the causal LM that holds its output projection.
HEAD = "lm_head"
#: Keyword arguments of the model's call that Hugging Face's ``ForCausalLMLoss`` reads besides labels.
LOSS_OPTIONS = ("num_items_in_batch", "ignore_index", "shift_labels")


class LeaveReason(Exception):
    """The model looked like a match but its loss stays Hugging Face's; the message says why."""


@dataclass(frozen=True)
class HeadRoute:
    """What the loss row's factory returns: the fused head, and where ``labels`` sits in the
    model's positional arguments (None: keyword only)."""

    head: FusedLMHead
    labels_position: int | None


def head_route(module: nn.Module, backend: str | None) -> HeadRoute:
    """The fused head for ``module`` (a causal LM of a known family), or LeaveReason."""
    head = getattr(module, HEAD, None)
    if type(head) is not nn.Linear:
        raise LeaveReason(f"its {HEAD} is {type(head).__name__}, not a plain nn.Linear")
    try:
        parameters = list(inspect.signature(type(module).forward).parameters.values())[1:]  # no self
    except (TypeError, ValueError):
        parameters = []
    names = [p.name for p in parameters]
    if "labels" not in names:
        raise LeaveReason("its forward takes no labels")
    position = names.index("labels")
    positional = parameters[position].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    softcap = getattr(getattr(module, "config", None), "final_logit_softcapping", None)
    return HeadRoute(FusedLMHead.from_linear(head, softcap, backend), position if positional else None)


def _hand_labels_to_head(labels_position: int | None) -> Callable:
    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        head = getattr(module, HEAD, None)
        if not isinstance(head, FusedLMHead):
            return None  # lm_head changed after the swap: Hugging Face's loss
        by_position = labels_position is not None and len(args) > labels_position
        labels = args[labels_position] if by_position else kwargs.get("labels")
        if labels is None:
            return None
        options = {name: kwargs[name] for name in LOSS_OPTIONS if kwargs.get(name) is not None}
        head.pending, head.loss = (labels, options), None
        if by_position:
            args = (*args[:labels_position], None, *args[labels_position + 1 :])
        else:
            kwargs = {name: value for name, value in kwargs.items() if name != "labels"}
        return args, kwargs

    return before


def _put_loss_in_output(module: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> Any:
    head = getattr(module, HEAD, None)
    if not isinstance(head, FusedLMHead) or head.pending is None:
        return None
    loss = head.loss
    head.pending = head.loss = None
    if output is None or loss is None:  # the forward raised, or never called its head
        return None
    if isinstance(output, tuple):  # return_dict=False: (logits, ...) -> (loss, ...) as with labels
        return (loss, *output[1:])
    fields = {name: value for name, value in output.items() if name not in ("loss", "logits")}
    return type(output)(loss=loss, logits=None, **fields)


class HeadHandle:
    """One model's fused loss: ``remove()`` puts its ``lm_head`` back and removes the hooks (idempotent)."""

    def __init__(self, module: nn.Module, original: nn.Module, head: FusedLMHead, hooks: list) -> None:
        self._module, self._original, self._head, self._hooks = module, original, head, hooks

    def remove(self) -> None:
        """Undo :func:`attach`; an ``lm_head`` changed since is left as it is."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if getattr(self._module, HEAD, None) is self._head:
            setattr(self._module, HEAD, self._original)


def attach(module: nn.Module, route: HeadRoute) -> HeadHandle:
    """Put ``route.head`` in place of ``module.lm_head`` and hook ``module``'s forward (module docstring)."""
    original = getattr(module, HEAD)
    setattr(module, HEAD, route.head)
    hooks = [
        module.register_forward_pre_hook(_hand_labels_to_head(route.labels_position), with_kwargs=True),
        module.register_forward_hook(_put_loss_in_output, with_kwargs=True, always_call=True),
    ]
    return HeadHandle(module, original, route.head, hooks)
