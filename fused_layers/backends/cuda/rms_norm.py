"""RMSNorm with the CUDA C++ kernels (norm.cu), like Hugging Face ``LlamaRMSNorm`` where weight and
input share a dtype."""

from __future__ import annotations

from torch import Tensor

from fused_layers.backends.cuda.norm import check_input, checked_affine, norm


def covers(x: Tensor, weight: Tensor | None, eps: float) -> bool:
    """Whether the kernel computes this call: no weight, or a weight of x's dtype. Llama's casting
    of a weight of another dtype gives a result in torch's promotion of the two, which this kernel
    does not produce."""
    return weight is None or weight.dtype == x.dtype


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim of ``x`` with CUDA C++ kernels, like Hugging Face ``LlamaRMSNorm``.

    ``x_normed = (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)``, then
    ``weight * x_normed``. ``weight`` (optional, shape ``(x.shape[-1],)``) must have x's dtype
    (:func:`covers`; ``fused_layers.ops.rms_norm`` routes other calls to Triton), else TypeError.
    """
    check_input(x, "rms_norm")
    if not covers(x, weight, eps):
        raise TypeError(
            f"fused_layers.cuda.rms_norm: weight is {weight.dtype} and x {x.dtype}; the CUDA kernel needs "
            "one dtype (use backend='triton' for Llama's mixed-dtype casting)"
        )
    weight = checked_affine(x, weight, "weight", "rms_norm")
    return norm(x, weight, None, float(eps), True)
