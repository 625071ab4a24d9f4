"""Triton, or a stand-in where it is not installed.

Triton is a Linux-only dependency (``triton>=3.0; platform_system == 'Linux'``), so on macOS and
Windows ``import triton`` fails. This backend's modules define their kernels at import with
``@triton.jit``; without Triton that decorator leaves the function as it is, ``tl.constexpr``
holds its value, :data:`AVAILABLE` is False, and ``fused_layers.dispatch`` runs every op's plain
torch version instead (one warning per process), so a model with swapped layers still imports,
trains and unswaps there.
"""

from __future__ import annotations

import types

try:
    import triton
    import triton.language as tl
except ImportError:
    AVAILABLE = False

    def _jit(fn=None, **_options):
        """``triton.jit`` without Triton: the kernel stays a plain function that nothing launches."""
        return fn if fn is not None else (lambda kernel: kernel)

    class _Constexpr:
        """``tl.constexpr`` without Triton: a named mode (``SILU = tl.constexpr(2)``) keeps its value."""

        def __init__(self, value: object = None) -> None:
            self.value = value

    triton = types.SimpleNamespace(jit=_jit, __version__="0.0")
    tl = types.SimpleNamespace(constexpr=_Constexpr)
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "tl", "triton"]
