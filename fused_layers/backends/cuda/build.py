"""Build (once, lazily) and load the CUDA C++ extension with ``torch.utils.cpp_extension.load_inline``.

The build folder is ``$TORCH_EXTENSIONS_DIR/fused_layers/<hash>`` when that variable is set, else
``~/.cache/fused_layers/cuda/<hash>``; the hash covers the sources, flags, torch and CUDA versions
and the GPU architecture, so a changed kernel or a new machine never picks up a stale build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch

from fused_layers.cuda import _source


class CudaExtensionUnavailable(RuntimeError):
    """Raised when the CUDA extension cannot be built here: no CUDA device, no nvcc, or a CPU torch."""


_lock = threading.Lock()
_extension: ModuleType | None = None


def _nvcc_flags(major: int, minor: int) -> list[str]:
    """nvcc flags for the current GPU.

    - ``-O3``; ``-lineinfo`` maps SASS to source lines in Nsight Compute at no runtime cost.
    - One ``-gencode`` for the device's own architecture (``sm_90`` on H100/H200), so the build is
      short; passing an arch flag also stops torch from adding its own list.
    - No ``--use_fast_math``: it replaces tanhf/erff/expf with MUFU approximations (tanh.approx is
      ~2^-11 relative error) and flushes denormals. Both kernels are bandwidth-bound, so the accurate
      functions cost nothing measurable and fp32 results stay within a few ulp of torch.
    """
    arch = f"{major}{minor}"
    return ["-O3", "-lineinfo", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def _check_toolchain() -> None:
    if torch.version.cuda is None:
        raise CudaExtensionUnavailable(
            "fused_layers.cuda: this torch build has no CUDA support (torch.version.cuda is None); "
            "install a CUDA build of torch or use backend='triton' / 'torch'"
        )
    if not torch.cuda.is_available():
        raise CudaExtensionUnavailable(
            "fused_layers.cuda: no CUDA device is available; use backend='triton' or 'torch'"
        )
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if nvcc is None or not nvcc.exists():
        found = shutil.which("nvcc")
        raise CudaExtensionUnavailable(
            "fused_layers.cuda: nvcc not found (CUDA_HOME="
            f"{CUDA_HOME!r}, nvcc on PATH: {found!r}); set CUDA_HOME to a CUDA toolkit to build the extension"
        )


def _build_directory(digest: str) -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        base = Path(root) / "fused_layers"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fused_layers" / "cuda"
    path = base / digest
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_extension() -> ModuleType:
    """Return the compiled extension, building it on the first call of the process (about a minute).

    Raises :class:`CudaExtensionUnavailable` when there is no CUDA device, no nvcc or no CUDA torch;
    compiler errors propagate from ``load_inline`` with nvcc's output.
    """
    global _extension
    if _extension is not None:
        return _extension
    with _lock:
        if _extension is not None:
            return _extension
        _check_toolchain()
        from torch.utils.cpp_extension import load_inline

        major, minor = torch.cuda.get_device_capability()
        cuda_flags = _nvcc_flags(major, minor)
        key = "\n".join(
            [
                _source.DECLARATIONS,
                _source.KERNELS,
                _source.HOST,
                *cuda_flags,
                torch.__version__,
                str(torch.version.cuda),
            ]
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        _extension = load_inline(
            name=f"fused_layers_cuda_{digest}",
            cpp_sources=[_source.DECLARATIONS],
            cuda_sources=[_source.KERNELS + _source.HOST],
            functions=list(_source.FUNCTIONS),
            extra_cflags=["-O3"],
            extra_cuda_cflags=cuda_flags,
            build_directory=str(_build_directory(digest)),
            with_cuda=True,
            verbose=False,
        )
        return _extension
