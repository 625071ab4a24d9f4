"""LayerNorm over the last dim."""

from __future__ import annotations

from torch import Tensor

from fused_layers import dispatch


def layer_norm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    backend: str | None = None,
) -> Tensor:
    """LayerNorm of ``x`` over its last dim, like ``F.layer_norm(x, (N,), weight, bias, eps)``.

    ``weight`` and ``bias`` are optional, of shape (N,). ``backend`` is None
    (``DEFAULT_BACKEND["layer_norm"]``), "triton", "torch" or "cuda". Statistics are fp32;
    the output has x's dtype and shape.
    """
    direct = dispatch.eager_norm("layer_norm", backend, x, weight, bias, eps)
    if direct is not None:  # the common eager CUDA call, with the least host time
        return direct
    width = x.shape[-1]
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and param.shape != (width,):
            raise ValueError(f"layer_norm: {name} must have shape ({width},), got {tuple(param.shape)}")
    return dispatch.call("layer_norm", backend, x, weight, bias, eps)
