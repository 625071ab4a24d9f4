"""Backend choice for the fused ops: Triton, plain torch, or the CUDA C++ extension.

One table says which backend each op uses by default; the benchmark results decide it.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

import torch

#: Backend each op uses when called with ``backend=None``. Set from the benchmark results
#: (``benchmarks/fused_layers.py``); "triton" until those say otherwise.
DEFAULT_BACKEND: dict[str, str] = {
    "gelu": "triton",
    "layer_norm": "triton",
    "rms_norm": "triton",
    "geglu": "triton",
    "swiglu": "triton",
}

#: Ops that ``fused_layers.cuda`` implements.
_CUDA_OPS = frozenset({"gelu", "layer_norm"})
_BACKENDS = ("triton", "torch", "cuda")

_warned_fallback = False


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(op: str, backend: str | None, *tensors: torch.Tensor) -> str:
    """Return the backend that will run ``op`` on ``tensors``: "triton", "torch" or "cuda".

    Raises ValueError for an unknown backend, or "cuda" for an op the extension lacks. A
    Triton or CUDA choice on tensors that are not on a GPU falls back to "torch" (Triton
    kernels still run when ``TRITON_INTERPRET=1``), with one warning per process, so that a
    model with swapped layers still trains on a CPU.
    """
    choice = DEFAULT_BACKEND[op] if backend is None else backend
    if choice not in _BACKENDS:
        raise ValueError(f"{op}: unknown backend {choice!r}; expected one of {_BACKENDS}")
    if choice == "cuda" and op not in _CUDA_OPS:
        raise ValueError(f"{op}: no CUDA C++ version; use backend 'triton' or 'torch'")
    if choice == "torch" or all(t.is_cuda for t in tensors):
        return choice
    if choice == "triton" and _interpreting():
        return choice
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(
            f"fused_layers: {op} got tensors that are not on a CUDA device; using the plain torch "
            "version (set TRITON_INTERPRET=1 to run the Triton kernels on the CPU). "
            "Warned once per process.",
            RuntimeWarning,
            stacklevel=3,
        )
    return "torch"


def cuda_extension() -> ModuleType:
    """Import ``fused_layers.cuda`` on first use: it compiles C++ at import, which most calls never need."""
    return importlib.import_module("fused_layers.cuda")
