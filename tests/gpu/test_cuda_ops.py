"""fused_layers.backends.cuda: the CUDA C++ LayerNorm and RMSNorm against float64 references.

On a GPU: builds the extension (about a minute the first time, cached after) and checks every
output and gradient, and compiles the kernels alone with nvcc for their register/spill counts.
Without one: only the clear-error checks run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fused_layers import dispatch
from fused_layers.backends.cuda import build
from fused_layers.backends.cuda.layer_norm import layer_norm as cuda_layer_norm
from fused_layers.backends.cuda.rms_norm import rms_norm as cuda_rms_norm

CUDA_SOURCES = Path(build.__file__).parent  # the backend's .cu/.cuh/.cpp files
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# 1000: a warp a row, 8 rows a block; 2048: 64 threads a row, 4 rows a block (block-wide
# reductions per row slot); 16384: 512 threads a row; 4097 (unaligned) and 65536: looped kernels.
WIDTHS = (1, 7, 127, 1000, 2048, 4097, 16384, 65536)
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
    return build.load_extension()


@requires_cuda
@pytest.mark.parametrize("affine", ("weight_bias", "weight", "bias", "none"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_layer_norm_matches_float64(extension, width, dtype, affine):
    torch.manual_seed(width)
    x = (2 * torch.randn(_shape(width), device="cuda") + 0.5).to(dtype).requires_grad_()
    weight = (torch.rand(width, device="cuda") + 0.5).to(dtype).requires_grad_()
    bias = torch.randn(width, device="cuda").to(dtype).requires_grad_()
    weight = weight if "weight" in affine else None
    bias = bias if "bias" in affine else None
    dy = torch.randn_like(x)
    y = cuda_layer_norm(x, weight, bias, eps=1e-5)
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


def _llama_rms_norm64(x64: torch.Tensor, w64: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm in float64, with its rounding of the normalised row to ``dtype``."""
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    normed = normed + (normed.detach().to(dtype).double() - normed.detach())  # rounded value, fp64 gradient
    return normed if w64 is None else w64 * normed


@requires_cuda
@pytest.mark.parametrize("affine", ("weight", "none"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_rms_norm_matches_float64(extension, width, dtype, affine):
    torch.manual_seed(width)
    x = (2 * torch.randn(_shape(width), device="cuda") + 0.5).to(dtype).requires_grad_()
    weight = (torch.rand(width, device="cuda") + 0.5).to(dtype).requires_grad_() if affine != "none" else None
    dy = torch.randn_like(x)
    y = cuda_rms_norm(x, weight, eps=1e-6)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = None if weight is None else weight.detach().double().requires_grad_()
    y64 = _llama_rms_norm64(x64, w64, dtype)
    y64.backward(dy.double())
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, y64, dtype, "rms_norm output")
    _close(x.grad, x64.grad, dtype, "rms_norm grad of input")
    if weight is not None:
        assert weight.grad.dtype == dtype
        _close(weight.grad, w64.grad, dtype, "rms_norm grad of weight")


@requires_cuda
@pytest.mark.parametrize("rms", (False, True), ids=("layer_norm", "rms_norm"))
@pytest.mark.parametrize("width", (1024, 2048, 16384))
def test_persistent_backward_over_many_rows(extension, width, rms):
    """Enough rows that every block of the persistent backward loops many times (the staged next
    row, the per-slot sums folded at the end, the partials summed), and a last group part-filled."""
    torch.manual_seed(1)
    rows = 4099 if width < 16384 else 1031
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16).requires_grad_()
    weight = (torch.rand(width, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_()
    bias = None if rms else torch.randn(width, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn_like(x)
    if rms:
        cuda_rms_norm(x, weight).backward(dy)
    else:
        cuda_layer_norm(x, weight, bias).backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    b64 = None if rms else bias.detach().double().requires_grad_()
    if rms:
        _llama_rms_norm64(x64, w64, torch.bfloat16).backward(dy.double())
    else:
        F.layer_norm(x64, (width,), w64, b64, eps=1e-5).backward(dy.double())
    _close(x.grad, x64.grad, torch.bfloat16, "grad of input")
    # sums over thousands of rows: compare against the sum's own scale, not element by element
    for name, leaf, leaf64 in (("weight", weight, w64), ("bias", bias, b64)):
        if leaf is not None:
            scale = leaf64.grad.abs().mean().item()
            err = (leaf.grad.double() - leaf64.grad).abs().max().item()
            assert err <= 2e-2 * scale, f"{name}: max error {err} against mean |grad| {scale}"


@requires_cuda
def test_eager_norms_run_a_cpp_autograd_node(extension):
    """The fast path is taken: eager calls record the C++ node, not a Python autograd.Function
    (whose host cost alone is what kept LayerNorm above eager's host time)."""
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    w = torch.ones(256, device="cuda", requires_grad=True)
    for y, name in ((cuda_layer_norm(x, w), "LayerNorm"), (cuda_rms_norm(x, w), "RMSNorm")):
        assert y.grad_fn.name() == f"fused_layers::{name}Backward", y.grad_fn.name()
        assert not isinstance(y.grad_fn, torch.autograd.function.BackwardCFunction)


@requires_cuda
def test_the_cpp_node_meets_autograds_contracts(extension):
    """The hand-built node behaves as torch's generated ones: gradients only where asked for
    (torch.autograd.grad of one input), an error for a second backward without retain_graph and for
    an input changed in place, saved-tensor hooks see its saved tensors, and no node without grad."""
    torch.manual_seed(0)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(512, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_()
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    (dw_only,) = torch.autograd.grad(cuda_layer_norm(x, w, b), w, dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    (expected,) = torch.autograd.grad(F.layer_norm(x64, (512,), w64, b64), w64, dy.double())
    assert (dw_only.double() - expected).abs().max() <= 2e-2 * expected.abs().mean()
    assert x.grad is None and w.grad is None and b.grad is None
    (dx_once,) = torch.autograd.grad(cuda_layer_norm(x, w, b), x, dy)
    y = cuda_layer_norm(x, w, b)
    y.backward(dy, retain_graph=True)
    y.backward(dy)
    assert torch.equal(x.grad, 2 * dx_once)  # bf16 doubling is exact
    y = cuda_rms_norm(x, w)
    y.backward(dy)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(dy)
    leaf = torch.randn(8, 512, device="cuda", requires_grad=True)
    inner = leaf * 2
    y = cuda_layer_norm(inner, None, None)
    with torch.no_grad():
        inner.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        cuda_rms_norm(leaf, None).sum().backward()
    assert (8, 512) in packed and (8,) in packed, packed  # x and the fp32 rstd
    with torch.no_grad():
        assert cuda_layer_norm(x, w, b).grad_fn is None
    assert cuda_layer_norm(x.detach(), w.detach(), None).grad_fn is None


@requires_cuda
def test_layer_norm_casts_affine_params_in_the_graph_and_checks_them(extension):
    """Eager calls check and cast weight and bias in C++: fp32 parameters of a bf16 input get fp32
    gradients, and a misshapen or misplaced parameter is a ValueError, as on the traced path."""
    torch.manual_seed(0)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.rand(256, device="cuda") + 0.5).requires_grad_()
    bias = torch.randn(256, device="cuda", requires_grad=True)
    y = cuda_layer_norm(x, weight, bias)
    assert y.dtype == torch.bfloat16
    w64, b64 = (param.to(torch.bfloat16).double() for param in (weight, bias))
    expected = F.layer_norm(x.double(), (256,), w64, b64)
    _close(y, expected, torch.bfloat16, "output")
    y.float().sum().backward()
    assert weight.grad.dtype == torch.float32 and bias.grad.dtype == torch.float32
    assert weight.grad.abs().sum() > 0 and torch.all(bias.grad == 16)
    with pytest.raises(ValueError, match="weight has shape"):
        cuda_layer_norm(x, torch.ones(128, device="cuda"))
    with pytest.raises(ValueError, match="bias is on cpu"):
        cuda_layer_norm(x, weight, torch.zeros(256))
    with pytest.raises(ValueError, match="at least one dimension"):
        cuda_layer_norm(torch.tensor(1.0, device="cuda"))


@requires_cuda
def test_ops_norms_go_straight_to_the_cpp_node_only_where_the_checked_path_picks_cuda(extension):
    from fused_layers.ops.layer_norm import layer_norm
    from fused_layers.ops.rms_norm import rms_norm

    direct = dispatch.eager_norm
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(256, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_()
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = direct("layer_norm", None, x, w, b, 1e-5)
    assert y.grad_fn.name() == "fused_layers::LayerNormBackward", y.grad_fn.name()
    _close(y, F.layer_norm(x.double(), (256,), w.double(), b.double()), torch.bfloat16, "output")
    assert direct("rms_norm", "cuda", x, w, None, 1e-6).grad_fn.name() == "fused_layers::RMSNormBackward"
    assert layer_norm(x, w, b).grad_fn.name() == "fused_layers::LayerNormBackward"
    assert rms_norm(x, w).grad_fn.name() == "fused_layers::RMSNormBackward"
    with torch.no_grad():  # a forward-only call's default is Triton
        assert direct("layer_norm", None, x, w, b, 1e-5) is None
        assert direct("layer_norm", "cuda", x, w, b, 1e-5) is not None
    assert direct("layer_norm", None, x.detach(), w.detach(), None, 1e-5) is None  # nothing to differentiate
    assert direct("layer_norm", "triton", x, w, b, 1e-5) is None
    assert direct("layer_norm", None, x, w.float(), b, 1e-5) is None  # cast first: the checked path
    assert direct("rms_norm", None, x, w.float(), None, 1e-6) is None  # Llama's casting: Triton
    assert direct("layer_norm", None, x, w[:128], b, 1e-5) is None  # the checked path's ValueError
    with pytest.raises(ValueError, match="weight must have shape"):
        layer_norm(x, w[:128], b)
    assert direct("layer_norm", None, x, w, b.cpu(), 1e-5) is None
    assert direct("rms_norm", None, x, w, b, 1e-6) is None  # RMSNorm takes no bias
    assert direct("layer_norm", None, x.detach().cpu().requires_grad_(), None, None, 1e-5) is None
    assert direct("layer_norm", None, x.detach()[:, :0].requires_grad_(), None, None, 1e-5) is None
    assert direct("layer_norm", None, torch.nn.Parameter(x.detach()), None, None, 1e-5) is None  # a subclass
    with TorchDispatchMode():
        assert direct("layer_norm", None, x, w, b, 1e-5) is None


@requires_cuda
def test_rms_norm_needs_one_dtype(extension):
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="one\\s+dtype|needs one"):
        cuda_rms_norm(x, torch.ones(64, device="cuda"))


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
            (lambda t: cuda_layer_norm(t, weight, bias), lambda t: F.layer_norm(t, (width,), w64, b64)),
            (lambda t: cuda_rms_norm(t, weight), lambda t: _llama_rms_norm64(t, w64, dtype)),
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
    y = cuda_layer_norm(x, weight, bias)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.equal(weight.grad, torch.zeros(64, device="cuda"))
    assert torch.equal(bias.grad, torch.zeros(64, device="cuda"))
    weight.grad = None
    cuda_rms_norm(x, weight).sum().backward()
    assert torch.equal(weight.grad, torch.zeros(64, device="cuda"))


@requires_cuda
def test_ops_cuda_backend_calls_extension(extension):
    from fused_layers.ops.layer_norm import layer_norm
    from fused_layers.ops.rms_norm import rms_norm

    x = torch.randn(4, 128, device="cuda")
    leaf = x.clone().requires_grad_()
    assert layer_norm(leaf, backend="cuda").grad_fn.name() == "fused_layers::LayerNormBackward"
    torch.testing.assert_close(layer_norm(x, backend="cuda"), F.layer_norm(x, (128,)), atol=1e-5, rtol=1e-4)
    w = torch.rand(128, device="cuda") + 0.5
    expected = rms_norm(x, w, backend="torch")
    torch.testing.assert_close(rms_norm(x, w, backend="cuda"), expected, atol=1e-5, rtol=1e-4)


def test_cpu_tensor_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA tensor"):
        cuda_layer_norm(torch.randn(2, 4))
    with pytest.raises(ValueError, match="CUDA tensor"):
        cuda_rms_norm(torch.randn(2, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_build_without_gpu_is_a_clear_error():
    with pytest.raises(build.CudaExtensionUnavailable, match="no CUDA|no CUDA support"):
        build.load_extension()


# The defines torch.utils.cpp_extension passes to nvcc (COMMON_NVCC_FLAGS), so the standalone check
# sees the kernels as the extension's build compiles them.
TORCH_NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
)


@requires_cuda  # nvcc alone needs no GPU, but takes 20-50 s of a CPU machine's suite
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_kernels_compile_standalone_without_spills(tmp_path):
    """Plain nvcc on all_kernels.cu (no torch headers, no GPU): compiles for sm_90, every kernel
    template of kernels.cuh is instantiated, and none spills."""
    source = CUDA_SOURCES / "all_kernels.cu"
    command = ["nvcc", "-c", "-std=c++17", "-O3", "-arch=sm_90", "-Xptxas", "-v", *TORCH_NVCC_DEFINES]
    result = subprocess.run(
        [*command, str(source), "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    # (kernel, spill stores, spill loads) for every kernel ptxas compiled
    spills = re.findall(
        r"Compiling entry function '(\w+)'.*?\n.*?\n\s+\d+ bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads",
        result.stderr,
    )
    assert len(spills) == result.stderr.count("Compiling entry function")  # every kernel parsed
    # 3 dtypes x 2 pack widths x 2 norms x 11 kernels, the 4-pack pipelined backward for fp32 and
    # bf16 (2 x 2 x 2), sum_partials for each dtype
    assert len(spills) == 3 * 2 * 2 * 11 + 8 + 3, len(spills)
    names = [name for name, _, _ in spills]
    demangled = dict(zip(names, subprocess.run(["c++filt", *names], capture_output=True, text=True)
                         .stdout.splitlines(), strict=True))  # fmt: skip
    compiled = {re.search(r"fused_layers::(\w+)<", d).group(1) for d in demangled.values()}
    kernels = (CUDA_SOURCES / "kernels.cuh").read_text()
    assert compiled == set(re.findall(r"__global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(", kernels))
    # The 16-byte-pack bf16/fp16 kernels (training's) spill nothing; ptxas keeps a few cold values
    # of some fp32 and unaligned variants in local memory (at most a few dozen bytes).
    for name, stores, loads in spills:
        limit = 0 if re.search(r"<(__nv_bfloat16|__half), 8\b", demangled[name]) else 64
        assert int(stores) <= limit and int(loads) <= limit, f"{demangled[name]}: {stores}/{loads} bytes"
