"""nn.Module wrappers over the fused ops, state-dict compatible with the modules they replace."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as module_hooks

from fused_layers.backends.gradients import private_output_gradient
from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.linear_cross_entropy import causal_lm_loss
from fused_layers.ops.rms_norm import rms_norm

__all__ = ["FusedGELU", "FusedGatedMLP", "FusedLMHead", "FusedLayerNorm", "FusedRMSNorm"]


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
        if torch.compiler.is_compiling() or _has_hooks(self.down_proj):
            hidden = self._gated(gate, up)
        else:  # `hidden` goes to down_proj alone: nothing else reads its gradient (`backends.gradients`)
            with private_output_gradient():
                hidden = self._gated(gate, up)
        return self.down_proj(hidden)

    def _gated(self, gate: Tensor, up: Tensor) -> Tensor:
        if self.activation == "silu":
            return swiglu(gate, up, backend=self.backend)
        return geglu(gate, up, approximate=self.activation, backend=self.backend)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def _has_hooks(module: nn.Module) -> bool:
    """Whether a hook, of `module` or global, could reach the module's input or its gradient."""
    names = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
    return any(getattr(module, name, None) for name in names) or any(
        getattr(module_hooks, f"_global{name}", None) for name in names
    )


class FusedLMHead(nn.Linear):
    """A causal LM's ``lm_head`` (its own Parameters, so tied embeddings stay tied) that computes the
    loss by fused linear cross-entropy instead of the logits while its model's forward has labels.

    ``fused_layers.swap`` puts it in place and hooks the model's forward
    (``fused_layers.causal_lm``): with labels, the hooks hand them here, :meth:`forward` computes
    Hugging Face's shifted causal-LM loss and returns a (..., 0) placeholder for the logits, and
    the model returns the loss with ``logits=None``. Without labels it is the plain Linear.
    ``softcap`` is the model's ``final_logit_softcapping`` (Gemma-2), applied inside the loss.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        softcap: float | None = None,
        backend: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.softcap = softcap
        self.backend = backend
        self.pending: tuple[Tensor, dict] | None = None
        self.loss: Tensor | None = None

    @classmethod
    def from_linear(
        cls, source: nn.Linear, softcap: float | None = None, backend: str | None = None
    ) -> FusedLMHead:
        """Wrap ``source``'s own Parameter objects (no copy): same values, ties, optimizer state."""
        head = cls.__new__(cls)
        nn.Module.__init__(head)
        head.in_features, head.out_features = source.in_features, source.out_features
        head.register_parameter("weight", source.weight)
        head.register_parameter("bias", source.bias)
        head.softcap = softcap
        head.backend = backend
        head.pending = None
        head.loss = None
        return head

    def forward(self, x: Tensor) -> Tensor:
        if self.pending is None:
            return F.linear(x, self.weight, self.bias)
        labels, options = self.pending
        self.loss = causal_lm_loss(
            x, self.weight, labels, self.bias, softcap=self.softcap, backend=self.backend, **options
        )
        return x.new_empty(*x.shape[:-1], 0)  # what the model's forward gets as logits: none

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, softcap={self.softcap}"
