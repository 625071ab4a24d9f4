"""Backend choice for the fused ops: Triton, plain torch, or the CUDA C++ extension.

One table says which backend each op uses by default; the benchmark results decide it.
"""

from __future__ import annotations

import warnings

import torch

from fused_layers.ops import _library

#: Backend each op uses when called with ``backend=None``: (for a call that autograd will
#: differentiate, for a forward-only call), the faster of Triton and CUDA C++ as measured on an
#: H200 (``benchmarks/fused_layers.py --launch``, bf16, widths 1024 / 4096 / 8192 / 16384,
#: forward+backward; BENCHMARKS.md §6). RMSNorm, 2026-11-24 (ninth session, runs 7 and 8): CUDA
#: C++ kernels 330-340 µs against Triton's 325-424 (93-95% of copy against 74-97%), host 184-258 µs
#: against Triton's 459-708, through a C++ autograd node; so CUDA where it builds and weight and
#: input share a dtype. LayerNorm, the same runs: CUDA kernels 333-335 / 340-361 / 350-353 /
#: 355-357 µs per forward+backward at widths 1024 / 4096 / 8192 / 16384 against Triton's 328-329 /
#: 330-331 / 349-350 / 567, host 209-257 µs against Triton's 496-633 (its autograd node is C++):
#: CUDA for differentiated calls.
#: LayerNorm forward alone: Triton 132-149 µs, CUDA 134-145, level; Triton kept there. GELU:
#: Triton ahead in both passes (3.75-4.15 against 3.41-3.65). The other ops have only Triton kernels.
DEFAULT_BACKEND: dict[str, tuple[str, str]] = {
    "gelu": ("triton", "triton"),
    "layer_norm": ("cuda", "triton"),
    "rms_norm": ("cuda", "triton"),
    "geglu": ("triton", "triton"),
    "swiglu": ("triton", "triton"),
    "rope": ("triton", "triton"),
}

#: Ops that ``fused_layers.cuda`` implements.
_CUDA_OPS = frozenset({"gelu", "layer_norm", "rms_norm"})
_BACKENDS = ("triton", "torch", "cuda")

_warned_fallback = False


def resolve_backend(op: str, backend: str | None, *maybe_tensors: torch.Tensor | None) -> str:
    """Return the backend that will run ``op`` on ``tensors``: "triton", "torch" or "cuda".

    Raises ValueError for an unknown backend, or "cuda" for an op the extension lacks. A
    Triton or CUDA choice on tensors that are not on a GPU falls back to "torch" (Triton
    kernels still run when ``TRITON_INTERPRET=1``), with one warning per process, so that a
    model with swapped layers still trains on a CPU. ``None`` among the tensors is skipped.
    """
    tensors = tuple(t for t in maybe_tensors if t is not None)
    choice = _default_backend(op, tensors) if backend is None else backend
    if choice not in _BACKENDS:
        raise ValueError(f"{op}: unknown backend {choice!r}; expected one of {_BACKENDS}")
    if choice == "cuda" and op not in _CUDA_OPS:
        raise ValueError(f"{op}: no CUDA C++ version; use backend 'triton' or 'torch'")
    if choice == "triton" and not _library.TRITON_AVAILABLE:
        _warn_fallback(f"{op}: Triton is not installed here (it is a Linux-only dependency)")
        return "torch"
    if choice == "torch" or all(t.is_cuda for t in tensors):
        return choice
    if choice == "triton" and _library.INTERPRETING:
        return choice
    _warn_fallback(
        f"{op} got tensors that are not on a CUDA device (set TRITON_INTERPRET=1 to run the Triton "
        "kernels on the CPU)"
    )
    return "torch"


def _warn_fallback(why: str) -> None:
    """One warning per process that the fused ops run their plain torch versions, and why."""
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(
            f"fused_layers: {why}; using the plain torch version. Warned once per process.",
            RuntimeWarning,
            stacklevel=4,
        )


def _default_backend(op: str, tensors: tuple[torch.Tensor, ...]) -> str:
    """The measured default for this call; a CUDA default that cannot run here becomes Triton.

    Under ``torch.compile`` it is "torch": Inductor then generates the op's kernels itself and
    fuses them with their neighbours (residual adds, casts), which an opaque custom op prevents.
    Measured with ``trainprof ab`` on an H200 (2026-11-22, bf16): GPT-2 124M compile 22.74 ms/step,
    swap+compile through the Triton custom ops 24.06; Llama 1B 140.16 against 140.58. An explicit
    ``backend="triton"`` still puts the custom ops into the graph.
    """
    if torch.compiler.is_compiling():
        return "torch"
    differentiated = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    choice = DEFAULT_BACKEND[op][0 if differentiated else 1]
    if choice == "cuda" and not (all(t.is_cuda for t in tensors) and _cuda_extension_builds()):
        return "triton"
    return choice


_cuda_extension_state: bool | None = None


def _cuda_extension_builds() -> bool:
    """Whether ``fused_layers.cuda`` builds here (once per process; the build is cached on disk).

    Without nvcc, or when the build fails, the CUDA default steps aside for Triton with one warning.
    """
    global _cuda_extension_state
    if _cuda_extension_state is None:
        from fused_layers.cuda._build import load_extension  # here: fused_layers.cuda imports this package

        try:
            load_extension()
            _cuda_extension_state = True
        except Exception as error:  # no toolchain, or a compiler error: Triton serves instead
            _cuda_extension_state = False
            warnings.warn(
                f"fused_layers: the CUDA C++ extension is unavailable ({error}); the ops whose "
                "measured default is CUDA use Triton instead. Warned once per process.",
                RuntimeWarning,
                stacklevel=4,
            )
    return _cuda_extension_state


# Dynamo runs it once while tracing and uses the result as a constant (what
# torch.compiler.assume_constant_result sets, without importing Dynamo here).
_cuda_extension_builds._dynamo_marked_constant = True  # type: ignore[attr-defined]
