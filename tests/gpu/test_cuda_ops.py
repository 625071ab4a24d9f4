"""fused_layers.cuda: the CUDA C++ GELU and LayerNorm against float64 references.

On a GPU: builds the extension (about a minute the first time, cached after) and checks every
output and gradient. Without one: only the checks that need no GPU run (clear errors, and the
standalone nvcc compile of the kernels with register/spill counts when nvcc is on the machine).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import fused_layers.cuda as fused_cuda
from fused_layers.cuda import _source

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WIDTHS = (1, 7, 127, 1000, 4097, 65536)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (atol, rtol) against float64 computed from the same rounded inputs: a few ulp of the stored dtype.
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 2e-2),
}


def _shape(width: int) -> tuple[int, ...]:
    return (3, width) if width >= 65536 else (3, 5, width)  # odd row counts, a leading batch dim


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.fixture(scope="module")
def extension():
    return fused_cuda.load_extension()


@requires_cuda
@pytest.mark.parametrize("approximate", ("tanh", "none"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_gelu_matches_float64(extension, width, dtype, approximate):
    torch.manual_seed(width)
    x = (3 * torch.randn(_shape(width), device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn_like(x)
    y = fused_cuda.gelu(x, approximate)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = F.gelu(x64, approximate=approximate)
    y64.backward(dy.double())
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, y64, dtype, "gelu output")
    _close(x.grad, x64.grad, dtype, "gelu grad_input")


@requires_cuda
@pytest.mark.parametrize("affine", ("weight_bias", "weight", "none"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_layer_norm_matches_float64(extension, width, dtype, affine):
    torch.manual_seed(width)
    x = (2 * torch.randn(_shape(width), device="cuda") + 0.5).to(dtype).requires_grad_()
    weight = (torch.rand(width, device="cuda") + 0.5).to(dtype).requires_grad_() if affine != "none" else None
    bias = torch.randn(width, device="cuda").to(dtype).requires_grad_() if affine == "weight_bias" else None
    dy = torch.randn_like(x)
    y = fused_cuda.layer_norm(x, weight, bias, eps=1e-5)
    y.backward(dy)

    def as_float64(t):
        return None if t is None else t.detach().double().requires_grad_()

    x64, w64, b64 = as_float64(x), as_float64(weight), as_float64(bias)
    y64 = F.layer_norm(x64, (width,), w64, b64, eps=1e-5)
    y64.backward(dy.double())
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, y64, dtype, "layer_norm output")
    for name, leaf, leaf64 in (("input", x, x64), ("weight", weight, w64), ("bias", bias, b64)):
        if leaf is not None:
            assert leaf.grad.dtype == leaf.dtype
            _close(leaf.grad, leaf64.grad, dtype, f"layer_norm grad of {name}")


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_and_misaligned_inputs(extension, dtype):
    torch.manual_seed(0)
    width = 256
    transposed = torch.randn(width, 6, device="cuda", dtype=dtype).t()  # [6, width], not contiguous
    misaligned = torch.randn(6 * width + 1, device="cuda", dtype=dtype)[1:].view(6, width)  # scalar path
    weight = torch.rand(width, device="cuda", dtype=dtype) + 0.5
    bias = torch.randn(width, device="cuda", dtype=dtype)
    w64, b64 = weight.double(), bias.double()
    for x in (transposed, misaligned):
        x = x.detach().requires_grad_()
        dy = torch.randn(x.shape, device="cuda", dtype=dtype).t().contiguous().t()  # non-contiguous grad
        cases = (
            (lambda t: fused_cuda.layer_norm(t, weight, bias), lambda t: F.layer_norm(t, (width,), w64, b64)),
            (lambda t: fused_cuda.gelu(t, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
        )
        for op, reference in cases:
            x.grad = None
            op(x).backward(dy)
            x64 = x.detach().double().requires_grad_()
            expected = reference(x64)
            expected.backward(dy.double())
            _close(op(x), expected, dtype, "output")
            _close(x.grad, x64.grad, dtype, "grad_input")


@requires_cuda
def test_zero_rows(extension):
    x = torch.empty(0, 64, device="cuda", requires_grad=True)
    weight = torch.ones(64, device="cuda", requires_grad=True)
    bias = torch.zeros(64, device="cuda", requires_grad=True)
    y = fused_cuda.layer_norm(x, weight, bias)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.equal(weight.grad, torch.zeros(64, device="cuda"))
    assert torch.equal(bias.grad, torch.zeros(64, device="cuda"))
    g = fused_cuda.gelu(x.detach().requires_grad_(), "none")
    assert g.shape == (0, 64)


@requires_cuda
def test_ops_cuda_backend_calls_extension(extension):
    from fused_layers.ops.gelu import gelu
    from fused_layers.ops.layer_norm import layer_norm

    x = torch.randn(4, 128, device="cuda")
    torch.testing.assert_close(gelu(x, "tanh", backend="cuda"), F.gelu(x, approximate="tanh"))
    torch.testing.assert_close(layer_norm(x, backend="cuda"), F.layer_norm(x, (128,)), atol=1e-5, rtol=1e-4)


def test_cpu_tensor_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA tensor"):
        fused_cuda.gelu(torch.randn(4))
    with pytest.raises(ValueError, match="CUDA tensor"):
        fused_cuda.layer_norm(torch.randn(2, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_build_without_gpu_is_a_clear_error():
    with pytest.raises(fused_cuda.CudaExtensionUnavailable, match="no CUDA|no CUDA support"):
        fused_cuda.load_extension()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_kernels_compile_standalone_without_spills(tmp_path):
    """Plain nvcc on the kernel string (no torch headers, no GPU): compiles for sm_90, no spills."""
    source = tmp_path / "kernels.cu"
    source.write_text(_source.standalone_translation_unit())
    command = ["nvcc", "-c", "-std=c++17", "-O3", "-arch=sm_90", "-Xptxas", "-v", *_source.TORCH_NVCC_DEFINES]
    result = subprocess.run(
        [*command, str(source), "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.stderr)
    assert len(spills) == _source.standalone_translation_unit().count("(const void*)&")
    assert all(stores == "0" and loads == "0" for stores, loads in spills), result.stderr
