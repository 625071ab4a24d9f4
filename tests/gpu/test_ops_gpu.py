"""fused_layers.ops on CUDA at larger shapes: the checks of tests/test_ops.py, compiled, not interpreted.

Skips the whole module without a CUDA device. The ``op_case`` fixture is in tests/conftest.py.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from fused_layers.backends.triton import heuristics  # noqa: E402
from fused_layers.ops import rms_norm  # noqa: E402

OPS = ("gelu_tanh", "gelu_erf", "layer_norm", "rms_norm", "geglu", "swiglu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# narrow rows packed per program, one row per program, the widest fused row, the looped path
SHAPES = ((257, 1024), (33, 4097), (8, 16384), (3, 70000))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_op_matches_float64_cuda(op_case, op, dtype, shape):
    op_case(op, shape, dtype, "cuda")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["transposed", "strided", "row_strided"])
def test_non_contiguous_cuda(op_case, op, layout):
    op_case(op, (64, 1000), torch.bfloat16, "cuda", layout=layout)


@pytest.mark.parametrize("op", OPS)
def test_zero_rows_cuda(op_case, op):
    op_case(op, (0, 1024), torch.bfloat16, "cuda")


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_looped_path_forced_cuda(op_case, monkeypatch, op):
    monkeypatch.setattr(heuristics, "MAX_FUSED_WIDTH", 512)
    op_case(op, (300, 4096), torch.bfloat16, "cuda")
    op_case(op, (300, 4097), torch.float32, "cuda", weight=False, bias=False)


def test_layer_norm_without_affine_cuda(op_case):
    op_case("layer_norm", (128, 4096), torch.bfloat16, "cuda", weight=False, bias=False)
    op_case("layer_norm", (128, 4096), torch.bfloat16, "cuda", weight=True, bias=False)


def _skip_without_cuda_extension() -> None:
    from fused_layers.backends.cuda.build import CudaExtensionUnavailable, load_extension

    try:
        load_extension()
    except CudaExtensionUnavailable as exc:  # no nvcc here: the Triton path still works
        pytest.skip(f"the CUDA C++ extension does not build here: {exc}")


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_matches_llama_cuda(dtype, backend):
    """On the GPU the casts round to nearest even, so fp16/bf16 outputs match LlamaRMSNorm bit for bit
    except where rsqrt or the row sum differ in the last place."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    width = 4096
    module = LlamaRMSNorm(width, eps=1e-6).to("cuda")
    with torch.no_grad():
        module.weight.copy_(1 + 0.5 * torch.randn(width, device="cuda"))
    module.to(dtype)
    x = torch.randn(512, width, device="cuda").to(dtype)
    ref = module(x)
    if backend == "cuda":
        _skip_without_cuda_extension()
    out = rms_norm(x, module.weight, eps=1e-6, backend=backend)
    assert out.dtype == ref.dtype
    diff = (out.float() - ref.float()).abs()
    # a last-place difference in x_normed, times the weight, rounded again: two ulps at most
    ulps = 4 if dtype == torch.float32 else 2
    bound = ulps * torch.finfo(dtype).eps * ref.float().abs() + torch.finfo(dtype).tiny
    assert bool((diff <= bound).all()), f"max diff {diff.max().item()}"
    if dtype != torch.float32:
        assert (diff == 0).float().mean().item() >= 0.99


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cuda_backend(op_case, op):
    """The CUDA C++ versions (fused_layers.backends.cuda), where they build here."""
    _skip_without_cuda_extension()
    op_case(op, (64, 4096), torch.bfloat16, "cuda", backend="cuda")
