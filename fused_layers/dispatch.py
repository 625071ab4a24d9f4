"""Which implementation runs a fused op: one table from (op, backend) to implementation, one rule.

The backends are folders of ``fused_layers.backends`` with the same file names: "triton" (the
kernels), "cuda" (CUDA C++ LayerNorm and RMSNorm), "numba" (a numba CUDA GELU), "torch" (plain
torch). A call leaves an op of ``fused_layers.ops`` by :func:`call`, which picks the backend and
runs the implementation, or, for an eager LayerNorm/RMSNorm call that can skip the checks, by
:func:`eager_norm`. The rule:

1. ``backend=None`` takes :data:`DEFAULT_BACKEND`; under ``torch.compile``, the backend measured
   faster there for the op, dtype and shape class (``fused_layers.compile_choice``), else "torch"
   (Inductor's code). A CUDA default where the tensors are not on a GPU or the extension does not
   build becomes "triton".
2. "triton" without Triton installed, "numba" without numba, or a kernel backend on tensors not on
   a GPU (Triton's CPU interpreter and numba's CUDA simulator aside), becomes "torch", with one
   warning per process: a swapped model still trains.
3. An implementation that does not cover the call (``Implementation.covers``) hands it to its
   ``otherwise`` backend: RoPE shapes the kernel does not take go to torch, an RMSNorm weight of
   another dtype than x goes from CUDA to Triton, a bf16 GELU from numba to Triton.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from fused_layers import compile_choice
from fused_layers.backends.cuda import build as cuda_build
from fused_layers.backends.cuda import layer_norm as cuda_layer_norm
from fused_layers.backends.cuda import rms_norm as cuda_rms_norm
from fused_layers.backends.numba import gelu as numba_gelu
from fused_layers.backends.torch import gated as torch_gated
from fused_layers.backends.torch import gelu as torch_gelu
from fused_layers.backends.torch import layer_norm as torch_layer_norm
from fused_layers.backends.torch import linear_cross_entropy as torch_linear_cross_entropy
from fused_layers.backends.torch import rms_norm as torch_rms_norm
from fused_layers.backends.torch import rope as torch_rope
from fused_layers.backends.triton import gated as triton_gated
from fused_layers.backends.triton import gelu as triton_gelu
from fused_layers.backends.triton import language as triton_language
from fused_layers.backends.triton import launch as triton_launch
from fused_layers.backends.triton import layer_norm as triton_layer_norm
from fused_layers.backends.triton import linear_cross_entropy as triton_linear_cross_entropy
from fused_layers.backends.triton import rms_norm as triton_rms_norm
from fused_layers.backends.triton import rope as triton_rope

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "IMPLEMENTATIONS",
    "Implementation",
    "call",
    "choose_backend",
    "eager_norm",
    "has_implementation",
]

#: Every backend name; an op has the ones :data:`IMPLEMENTATIONS` lists for it.
BACKENDS = ("triton", "torch", "cuda", "numba")


class Implementation(NamedTuple):
    """One op on one backend: ``run`` takes the op's checked arguments (the public op's, less
    ``backend``) and returns its result."""

    run: Callable[..., Any]
    #: Whether ``run`` computes a call, from the same arguments; None: every call.
    covers: Callable[..., bool] | None = None
    #: The backend for a call ``run`` does not cover: one that covers every call.
    otherwise: str | None = None


#: The one table: (op, backend) -> implementation.
IMPLEMENTATIONS: dict[tuple[str, str], Implementation] = {
    ("gelu", "triton"): Implementation(triton_gelu.gelu),
    ("gelu", "torch"): Implementation(torch_gelu.gelu),
    ("gelu", "numba"): Implementation(numba_gelu.gelu, covers=numba_gelu.covers, otherwise="triton"),
    ("geglu", "triton"): Implementation(triton_gated.geglu),
    ("geglu", "torch"): Implementation(torch_gated.geglu),
    ("swiglu", "triton"): Implementation(triton_gated.swiglu),
    ("swiglu", "torch"): Implementation(torch_gated.swiglu),
    ("layer_norm", "triton"): Implementation(triton_layer_norm.layer_norm),
    ("layer_norm", "cuda"): Implementation(cuda_layer_norm.layer_norm),
    ("layer_norm", "torch"): Implementation(torch_layer_norm.layer_norm),
    ("rms_norm", "triton"): Implementation(triton_rms_norm.rms_norm),
    ("rms_norm", "cuda"): Implementation(
        cuda_rms_norm.rms_norm, covers=cuda_rms_norm.covers, otherwise="triton"
    ),
    ("rms_norm", "torch"): Implementation(torch_rms_norm.rms_norm),
    ("rope", "triton"): Implementation(triton_rope.rope, covers=triton_rope.covers, otherwise="torch"),
    ("rope", "torch"): Implementation(torch_rope.rope),
    ("linear_cross_entropy", "triton"): Implementation(triton_linear_cross_entropy.linear_cross_entropy),
    ("linear_cross_entropy", "torch"): Implementation(torch_linear_cross_entropy.linear_cross_entropy),
}

#: Backend each op uses when called with ``backend=None``: (for a call that autograd will
#: differentiate, for a forward-only call), the faster of Triton and CUDA C++ as measured on an
#: H200 (``python -m benchmarks.kernels --launch``, bf16, widths 1024 / 4096 / 8192 / 16384,
#: forward+backward; BENCHMARKS.md). RMSNorm, 2026-11-24 (two runs, the later one
#: ``benchmarks/results/norm_launch.h200.md``): CUDA C++ kernels
#: 330-340 µs against Triton's 325-424 (93-95% of copy against 74-97%), host 184-258 µs against
#: Triton's 459-708, through a C++ autograd node; so CUDA where it builds and weight and input share
#: a dtype. LayerNorm, the same runs: CUDA kernels 333-335 / 340-361 / 350-353 / 355-357 µs per
#: forward+backward at widths 1024 / 4096 / 8192 / 16384 against Triton's 328-329 / 330-331 /
#: 349-350 / 567, host 209-257 µs against Triton's 496-633 (its autograd node is C++): CUDA for
#: differentiated calls. LayerNorm forward alone: Triton 132-149 µs, CUDA 134-145, level; Triton
#: kept there. GELU: Triton ahead in both passes (3.75-4.15 TB/s against CUDA's 3.41-3.65,
#: 2026-11-22), with the same Python autograd around either, so the CUDA GELU was dropped
#: (``fused_layers.backends.cuda``); a numba CUDA GELU is there to be chosen, 3-7x slower (2026-11-25).
#: linear_cross_entropy: Triton kernels over cuBLAS chunks, the only version that does not make
#: the whole logits. The other ops have only Triton kernels.
DEFAULT_BACKEND: dict[str, tuple[str, str]] = {
    "gelu": ("triton", "triton"),
    "layer_norm": ("cuda", "triton"),
    "rms_norm": ("cuda", "triton"),
    "geglu": ("triton", "triton"),
    "swiglu": ("triton", "triton"),
    "rope": ("triton", "triton"),
    "linear_cross_entropy": ("triton", "triton"),
}


def has_implementation(op: str, backend: str) -> bool:
    """Whether ``backend`` implements ``op`` (False for a name that is no op of the table)."""
    return (op, backend) in IMPLEMENTATIONS


def call(op: str, backend: str | None, *args: Any) -> Any:
    """Run ``op`` on ``args``, the public op's checked arguments less ``backend``, with the
    implementation the rule picks (the module docstring); ValueError for an unknown backend or one
    that lacks ``op``."""
    tensors = [arg for arg in args if isinstance(arg, Tensor)]
    implementation = IMPLEMENTATIONS[op, _choose(op, backend, tensors)]
    if implementation.covers is not None and not implementation.covers(*args):
        assert implementation.otherwise is not None, op  # one covering some calls names one for the rest
        implementation = IMPLEMENTATIONS[op, implementation.otherwise]
    return implementation.run(*args)


def choose_backend(op: str, backend: str | None, *args: Any) -> str:
    """The backend that will run ``op`` on ``args`` (rules 1 and 2 of the module docstring); the
    tensors among ``args`` decide where it can run."""
    return _choose(op, backend, [arg for arg in args if isinstance(arg, Tensor)])


def _choose(op: str, backend: str | None, tensors: list[Tensor]) -> str:
    """:func:`choose_backend` on the call's tensors."""
    choice = _default_backend(op, tensors) if backend is None else backend
    if (op, choice) not in IMPLEMENTATIONS:
        if choice not in BACKENDS:
            raise ValueError(f"{op}: unknown backend {choice!r}; expected one of {BACKENDS}")
        available = tuple(name for name in BACKENDS if (op, name) in IMPLEMENTATIONS)
        raise ValueError(f"{op}: no {choice} implementation; use backend {' or '.join(map(repr, available))}")
    if choice == "triton" and not triton_language.AVAILABLE:
        _warn_fallback(f"{op}: Triton is not installed here (it is a Linux-only dependency)")
        return "torch"
    if choice == "numba" and not numba_gelu.available():
        _warn_fallback(f"{op}: numba is not installed here (the numba extra)")
        return "torch"
    if choice == "torch" or all(t.is_cuda for t in tensors):
        return choice
    if choice == "triton" and triton_launch.INTERPRETING or choice == "numba" and numba_gelu.simulating():
        return choice
    _warn_fallback(
        f"{op} got tensors that are not on a CUDA device (set TRITON_INTERPRET=1 to run the Triton "
        "kernels on the CPU)"
    )
    return "torch"


_warned_fallback = False


def _warn_fallback(why: str) -> None:
    """One warning per process that the fused ops run their plain torch versions, and why."""
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(
            f"fused_layers: {why}; using the plain torch version. Warned once per process.",
            RuntimeWarning,
            stacklevel=5,  # the op's caller: this, _choose, call, the op
        )


def _default_backend(op: str, tensors: list[Tensor]) -> str:
    """The measured default for this call; a CUDA default that cannot run here becomes Triton.

    Under ``torch.compile``: the backend measured faster inside a compiled graph for this op, dtype
    and shape class (``fused_layers.compile_choice``), else "torch", whose plain ops Inductor
    compiles and fuses with their neighbours itself. Measured for the fused layers as a whole on an
    H200 (``trainprof ab``, 2026-11-22, bf16), before per-op measurement: GPT-2 124M compile 22.74
    ms/step, swap+compile through the Triton custom ops 24.06; Llama 1B 140.16 against 140.58.
    An explicit ``backend`` still puts that backend's custom op into the graph.
    """
    if torch.compiler.is_compiling():
        choice = compile_choice.backend_under_compile(op, tensors)
    else:
        differentiated = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        choice = DEFAULT_BACKEND[op][0 if differentiated else 1]
    if choice == "cuda" and not (all(t.is_cuda for t in tensors) and _cuda_extension_builds()):
        return "triton"
    return choice


_cuda_extension_state: bool | None = None


def _cuda_extension_builds() -> bool:
    """Whether the CUDA C++ extension builds here (once per process; the build is cached on disk).

    Without nvcc, or when the build fails, the CUDA default steps aside for Triton with one warning.
    """
    global _cuda_extension_state
    if _cuda_extension_state is None:
        try:
            cuda_build.load_extension()
            _cuda_extension_state = True
        except Exception as error:  # no toolchain, or a compiler error: Triton serves instead
            _cuda_extension_state = False
            warnings.warn(
                f"fused_layers: the CUDA C++ extension is unavailable ({error}); the ops whose "
                "measured default is CUDA use Triton instead. Warned once per process.",
                RuntimeWarning,
                stacklevel=6,  # the op's caller: this, _default_backend, _choose, call, the op
            )
    return _cuda_extension_state


# Dynamo runs it once while tracing and uses the result as a constant (what
# torch.compiler.assume_constant_result sets, without importing Dynamo here).
_cuda_extension_builds._dynamo_marked_constant = True  # type: ignore[attr-defined]


def eager_norm(
    op: str, backend: str | None, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor | None:
    """The result of this LayerNorm/RMSNorm call (``op``) through the CUDA extension's C++ autograd
    node, when the call can go there with no Python in between; else None, and the call takes
    :func:`call`, which gives the same result or raises the error.

    Not None for an eager call on a plain CUDA tensor of a supported dtype, with parameters of its
    dtype, shape and device, when the backend is "cuda" or the default (a call autograd
    differentiates), once a call has built the extension; the extension's ``norm_eager`` makes those
    checks. It exists for host time: on the H200's host the checked path's Python added 13-14 µs to
    a forward whose autograd node took 46-48 µs; through here, a LayerNorm forward took 23-34 µs of
    host time against eager's 35-47 (``benchmarks/results/host_phases_node.h200.json``).
    """
    extension = cuda_build.extension
    if extension is None or type(x) is not Tensor or torch.compiler.is_compiling():
        return None
    rms = op == "rms_norm"
    if backend is None:
        if DEFAULT_BACKEND[op][0] != "cuda":
            return None
        return extension.norm_eager(x, weight, bias, eps, rms, True)
    return extension.norm_eager(x, weight, bias, eps, rms, False) if backend == "cuda" else None
