"""Fused ops: Triton kernels with torch autograd, one file per op."""

from fused_layers.ops._dispatch import DEFAULT_BACKEND
from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.rms_norm import rms_norm
from fused_layers.ops.rope import rope

__all__ = ["DEFAULT_BACKEND", "geglu", "gelu", "layer_norm", "rms_norm", "rope", "swiglu"]
