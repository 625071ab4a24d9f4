"""The fused ops, one file per op: the public function, its argument checks, and the call through
``fused_layers.dispatch`` to the implementation of the chosen backend (``fused_layers.backends``)."""

from fused_layers.dispatch import DEFAULT_BACKEND
from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.linear_cross_entropy import causal_lm_loss, linear_cross_entropy
from fused_layers.ops.rms_norm import rms_norm
from fused_layers.ops.rope import rope

__all__ = [
    "DEFAULT_BACKEND",
    "causal_lm_loss",
    "geglu",
    "gelu",
    "layer_norm",
    "linear_cross_entropy",
    "rms_norm",
    "rope",
    "swiglu",
]
