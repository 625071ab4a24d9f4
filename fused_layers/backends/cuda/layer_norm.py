"""LayerNorm with the CUDA C++ kernels (norm.cu); mean and rstd kept in fp32."""

from __future__ import annotations

from torch import Tensor

from fused_layers.backends.cuda.norm import check_input, checked_affine, norm


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """LayerNorm over the last dim of ``x`` with CUDA C++ kernels (mean and rstd kept in fp32).

    ``weight`` and ``bias`` have shape ``(x.shape[-1],)`` and are cast to ``x``'s dtype when they
    differ (the cast is part of the autograd graph, so their gradients keep their own dtype).
    Raises ValueError for a CPU tensor or a misshapen or misplaced parameter, TypeError for an
    unsupported dtype, and ``CudaExtensionUnavailable`` when the extension cannot be built here.
    """
    check_input(x, "layer_norm")
    weight = checked_affine(x, weight, "weight", "layer_norm")
    bias = checked_affine(x, bias, "bias", "layer_norm")
    return norm(x, weight, bias, float(eps), False)
