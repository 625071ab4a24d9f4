"""Under ``torch.compile``, a causal LM's SDPA attention runs causal without a materialised mask
wherever Hugging Face runs it so eagerly.

Eagerly, Hugging Face's ``create_causal_mask`` returns no mask for SDPA when no padding mask was
given and the queries span the keys (training, a prefill without cache): SDPA is then called with
``is_causal=True`` and runs its causal flash/cuDNN kernel, which skips the blocks above the
diagonal. While Dynamo traces, transformers before 5.24 (and 5.24 on torch < 2.14) never skip it:
the compiled model builds a (B, 1, T, T) boolean mask and SDPA runs a masked kernel over the whole
square. On an H200 (2026-11-24, ``trainprof ab``, Llama-3.2-1B's shape, B4 x T2048, bf16) the
cuDNN attention kernels took 32.4 ms per step under compile against 11.7 eagerly: most of the 8.5
ms per step by which compile lost to the fused layers in eager mode.

``swap`` gives the model (its config, which every module of the model reads) the attention
implementation :data:`IMPLEMENTATION`: Hugging Face's own ``sdpa_attention_forward``, with a mask
function that returns no mask on exactly the conditions of Hugging Face's eager skip, traced or not
(not under ``torch.export``, where a skipped mask would fix ``is_causal`` in the exported program,
nor with a padding mask, a sliding window, packed sequences or a cache offset), else Hugging Face's
``sdpa_mask``. Eager results are unchanged; under compile the attention computes the same function
with the causal kernel. Dynamo guards on the conditions (a mask given or not, the lengths).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["IMPLEMENTATION", "MaskHandle", "MaskRoute", "attach", "mask_route"]

#: The attention implementation name registered with transformers' interfaces.
IMPLEMENTATION = "fused_layers_sdpa"
#: The implementation a model must have for the reroute: Hugging Face's SDPA.
SDPA = "sdpa"


class LeaveReason(Exception):
    """The model's attention stays as it is; the message says why."""


def _skippable(arguments: dict[str, Any]) -> bool:
    """Hugging Face's eager condition for no mask: no padding mask, a plain causal pattern (its
    caller allows the skip), no sliding window, queries spanning the keys from position 0."""
    lengths = [arguments.get(name) for name in ("q_length", "kv_length")]
    offsets = [arguments.get(name, 0) for name in ("q_offset", "kv_offset")]
    # Plain ints only: a tensor offset (a static cache's) or a symbolic length would need its value
    return (
        arguments.get("allow_is_causal_skip", True) is True
        and arguments.get("attention_mask") is None
        and arguments.get("local_size") is None
        and all(type(value) is int for value in lengths + offsets)
        and lengths[0] == lengths[1]
        and offsets == [0, 0]
        and not _exporting()
    )


def _exporting() -> bool:
    """Whether ``torch.export`` is tracing, from torch.compiler's flag rather than
    ``torch.compiler.is_exporting()``: Dynamo before torch 2.13 folds that call to True while it
    compiles as well (its constant table in ``torch/_dynamo/variables/torch.py``), which kept the
    mask in every compiled graph. So it did in the measured run: torch 2.11 on the H200,
    2026-11-25, fused+compile 139.70 ms/step against compile's 140.78 (that run is in git history)."""
    return bool(getattr(torch.compiler, "_is_exporting_flag", False))


def _mask(**arguments: Any) -> torch.Tensor | None:
    """The mask function of :data:`IMPLEMENTATION`: None where Hugging Face skips the mask
    eagerly, else Hugging Face's SDPA mask."""
    if _skippable(arguments):
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**arguments)


_registered = False


def _register() -> None:
    """Register :data:`IMPLEMENTATION` with transformers' attention and mask interfaces (once)."""
    global _registered
    if not _registered:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(IMPLEMENTATION, sdpa_attention_forward)
        AttentionMaskInterface.register(IMPLEMENTATION, _mask)
        _registered = True


@dataclass(frozen=True)
class MaskRoute:
    """What the causal-mask row's factory returns: the config whose implementation changes."""

    config: Any


def mask_route(module: nn.Module) -> MaskRoute:
    """The route for a Hugging Face base model that uses SDPA, or LeaveReason."""
    config = getattr(module, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != SDPA:
        raise LeaveReason(f"its attention implementation is {implementation!r}, not {SDPA!r}")
    if "transformers.masking_utils" not in sys.modules:
        raise LeaveReason("transformers' masking_utils is not imported: no create_causal_mask to serve")
    return MaskRoute(config)


class MaskHandle:
    """One model's rerouted attention: ``remove()`` gives its config SDPA back (idempotent)."""

    def __init__(self, config: Any) -> None:
        self._config = config

    def remove(self) -> None:
        """Undo :func:`attach`; an implementation changed since is left as it is."""
        if self._config is not None and self._config._attn_implementation == IMPLEMENTATION:
            self._config._attn_implementation = SDPA
        self._config = None


def attach(route: MaskRoute) -> MaskHandle:
    """Give ``route.config`` the implementation :data:`IMPLEMENTATION` (module docstring)."""
    _register()
    route.config._attn_implementation = IMPLEMENTATION
    return MaskHandle(route.config)
