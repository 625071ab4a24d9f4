"""Fused GELU, LayerNorm, RMSNorm, gated-MLP, RoPE and linear cross-entropy layers, and ``swap`` to
put them into a model (a causal LM's loss included).

``ops/`` holds the public ops, ``dispatch`` the one table that picks each op's implementation,
``backends/`` the implementations (Triton, CUDA C++, plain torch). Importing this package builds
nothing and needs no GPU: the CUDA C++ extension (``fused_layers.backends.cuda``) compiles on its
first call only.
"""

from fused_layers.modules import FusedGatedMLP, FusedGELU, FusedLayerNorm, FusedLMHead, FusedRMSNorm
from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.linear_cross_entropy import causal_lm_loss, linear_cross_entropy
from fused_layers.ops.rms_norm import rms_norm
from fused_layers.ops.rope import rope
from fused_layers.swap import LeftModule, SwapRecord, swap, unswap

__all__ = [
    "FusedGELU",
    "FusedGatedMLP",
    "FusedLMHead",
    "FusedLayerNorm",
    "FusedRMSNorm",
    "LeftModule",
    "SwapRecord",
    "causal_lm_loss",
    "geglu",
    "gelu",
    "layer_norm",
    "linear_cross_entropy",
    "rms_norm",
    "rope",
    "swap",
    "swiglu",
    "unswap",
]
