"""Rotary position embedding with Hugging Face's ``rotate_half`` (Llama, Mistral, Qwen2, Qwen3)."""

from __future__ import annotations

from torch import Tensor

from fused_layers import dispatch


def rope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of ``q`` and ``k``, like Hugging Face's ``apply_rotary_pos_emb``.

    ``q_embed = q * cos + rotate_half(q) * sin`` with cos and sin unsqueezed at ``unsqueeze_dim``;
    the same for k. q (B, Hq, T, D), k (B, Hk, T, D) (Hq != Hk for grouped queries), cos and sin
    (B or 1, T, D); unsqueeze_dim 2 for (B, T, H, D) inputs. Returns (q_embed, k_embed) in torch's
    promotion of the inputs' and cos/sin dtypes, computed in fp32 and rounded once. ``backend`` is
    None (``DEFAULT_BACKEND["rope"]``), "triton" or "torch"; "cuda" raises ValueError. The torch
    version runs where the kernel does not apply: an odd head dim, cos or sin requiring grad,
    other shapes or dtypes (float64).
    """
    return dispatch.call("rope", backend, q, k, cos, sin, unsqueeze_dim)
