"""RMSNorm over the last dim with Llama's casting.

Matches Hugging Face ``LlamaRMSNorm``: the variance and inverse RMS are fp32, the normalised row is
rounded to the input dtype, and only then multiplied by the weight, in the dtype torch promotes
(weight, input) to.
"""

from __future__ import annotations

from torch import Tensor

from fused_layers import dispatch


def rms_norm(
    x: Tensor, weight: Tensor | None = None, eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """RMSNorm of ``x`` over its last dim, like Hugging Face ``LlamaRMSNorm``.

    ``x_normed = (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)``, then
    ``weight * x_normed``: the result dtype is torch's promotion of weight and input.
    ``weight`` is optional, of shape (N,). ``backend`` is None (``DEFAULT_BACKEND["rms_norm"]``),
    "triton", "torch" or "cuda" (the CUDA C++ kernel where weight and x share a dtype; Llama's
    mixed-dtype casting, e.g. fp32 weight and bf16 x, runs on Triton).
    """
    direct = dispatch.eager_norm("rms_norm", backend, x, weight, None, eps)
    if direct is not None:  # the common eager CUDA call, with the least host time
        return direct
    width = x.shape[-1]
    if weight is not None and weight.shape != (width,):
        raise ValueError(f"rms_norm: weight must have shape ({width},), got {tuple(weight.shape)}")
    return dispatch.call("rms_norm", backend, x, weight, eps)
