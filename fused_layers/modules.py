"""nn.Module wrappers over the fused ops, state-dict compatible with the modules they replace."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.rms_norm import rms_norm

__all__ = ["FusedGELU", "FusedGatedMLP", "FusedLayerNorm", "FusedRMSNorm"]


class FusedLayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dim, computed by :func:`fused_layers.ops.layer_norm.layer_norm`.

    A subclass, so ``isinstance(m, nn.LayerNorm)`` checks (weight init, optimizer param groups)
    still hold and the state-dict keys (``weight``, ``bias``) are the same.
    """

    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        backend: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device=device, dtype=dtype)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"FusedLayerNorm normalises the last dim only, got {self.normalized_shape}")
        self.backend = backend

    @classmethod
    def from_layer_norm(cls, source: nn.LayerNorm, backend: str | None = None) -> FusedLayerNorm:
        """Wrap ``source``'s own Parameter objects (no copy): same values, device, dtype, optimizer state."""
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.normalized_shape = tuple(source.normalized_shape)
        if len(fused.normalized_shape) != 1:
            raise ValueError(f"FusedLayerNorm normalises the last dim only, got {fused.normalized_shape}")
        fused.eps = source.eps
        fused.elementwise_affine = source.elementwise_affine
        fused.register_parameter("weight", source.weight)
        fused.register_parameter("bias", source.bias)
        fused.backend = backend
        return fused

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps, backend=self.backend)


class FusedGELU(nn.GELU):
    """``torch.nn.GELU`` (``approximate="none"`` erf or ``"tanh"``) computed by the fused gelu op."""

    def __init__(self, approximate: str = "none", backend: str | None = None) -> None:
        super().__init__(approximate)
        self.backend = backend

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate, backend=self.backend)


class FusedRMSNorm(nn.Module):
    """RMSNorm with Llama's casting (normalise in fp32, cast to the input dtype, then scale by ``weight``).

    State-dict key ``weight`` as in ``LlamaRMSNorm``; ``variance_epsilon`` is an alias of ``eps``
    for code that reads Hugging Face's attribute name.
    """

    def __init__(self, weight: nn.Parameter, eps: float = 1e-6, backend: str | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps
        self.backend = backend

    @property
    def variance_epsilon(self) -> float:
        """Hugging Face's name for ``eps``."""
        return self.eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


#: Gate activations FusedGatedMLP knows: "silu" -> swiglu, "tanh"/"none" -> geglu with that GELU.
GATE_ACTIVATIONS = ("silu", "tanh", "none")


class FusedGatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the activation and product in one fused op.

    Keeps the three Linear submodules it is given (so parameter names and values are unchanged);
    ``activation`` is "silu" (swiglu) or a GELU form "tanh"/"none" (geglu).
    """

    def __init__(
        self,
        gate_proj: nn.Module,
        up_proj: nn.Module,
        down_proj: nn.Module,
        activation: str,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if activation not in GATE_ACTIVATIONS:
            raise ValueError(
                f"FusedGatedMLP: activation must be one of {GATE_ACTIVATIONS}, got {activation!r}"
            )
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.activation = activation
        self.backend = backend

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.activation == "silu":
            hidden = swiglu(gate, up, backend=self.backend)
        else:
            hidden = geglu(gate, up, approximate=self.activation, backend=self.backend)
        return self.down_proj(hidden)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
