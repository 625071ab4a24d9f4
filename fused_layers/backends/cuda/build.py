"""Build (once, lazily) and load the CUDA C++ extension with ``torch.utils.cpp_extension.load``.

The sources are the files beside this one (:data:`SOURCES`, and the headers they include,
:data:`HEADERS`). The build folder is ``$TORCH_EXTENSIONS_DIR/fused_layers/<hash>`` when that
variable is set, else ``~/.cache/fused_layers/cuda/<hash>``; the hash covers the sources and
headers, flags, torch and CUDA versions and the GPU architecture, so a changed kernel or a new
machine never picks up a stale build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["HEADERS", "SOURCES", "CudaExtensionUnavailable", "extension", "load_extension"]

_HERE = Path(__file__).resolve().parent
#: What the build compiles: the host code and kernels (nvcc), and the Python bindings (c++).
SOURCES = (_HERE / "norm.cu", _HERE / "bindings.cpp")
#: What the sources include; part of the build's hash, as they are.
HEADERS = (_HERE / "norm.h", _HERE / "kernels.cuh")


class CudaExtensionUnavailable(RuntimeError):
    """Raised when the CUDA extension cannot be built here: no CUDA device, no nvcc, or a CPU torch."""


_lock = threading.Lock()
#: The loaded extension, None until :func:`load_extension` has built or loaded it in this process.
#: ``fused_layers.dispatch`` reads it on every eager norm call: an attribute, not a function call.
extension: ModuleType | None = None


def _nvcc_flags(major: int, minor: int) -> list[str]:
    """nvcc flags for the current GPU.

    - ``-O3``; ``-lineinfo`` maps SASS to source lines in Nsight Compute at no runtime cost.
    - One ``-gencode`` for the device's own architecture (``sm_90`` on H100/H200), so the build is
      short; passing an arch flag also stops torch from adding its own list.
    - No ``--use_fast_math``: it flushes denormals to zero and makes divisions and square roots
      approximate. The norm kernels are bandwidth-bound, so exact arithmetic costs nothing
      measurable and fp32 results stay within a few ulp of torch.
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
    compiler errors propagate from ``load`` with nvcc's output, which names the source file and line.
    """
    global extension
    if extension is not None:
        return extension
    with _lock:
        if extension is not None:
            return extension
        _check_toolchain()
        from torch.utils.cpp_extension import load

        major, minor = torch.cuda.get_device_capability()
        cuda_flags = _nvcc_flags(major, minor)
        digest = hashlib.sha256()
        for path in (*SOURCES, *HEADERS):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        digest.update("\n".join([*cuda_flags, torch.__version__, str(torch.version.cuda)]).encode())
        tag = digest.hexdigest()[:16]
        extension = load(
            name=f"fused_layers_cuda_{tag}",
            sources=[str(path) for path in SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=cuda_flags,
            build_directory=str(_build_directory(tag)),
            with_cuda=True,
            verbose=False,
        )
        return extension
