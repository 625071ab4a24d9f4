"""GELU, tanh or erf form, in numba CUDA: a grid-stride forward kernel, one backward, one
autograd.Function and, for traced calls, custom ops.

The same math as the Triton kernels (``fused_layers.backends.triton.gelu``), in fp32, stored in
the input's dtype; the kernels are in ``kernels.py``, compiled by numba on first use per dtype.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import Tensor

from fused_layers.backends.custom_ops import define, eager_function, registers, run_op

#: Threads per block: 256 (8 warps), the usual choice for a flat elementwise kernel.
THREADS = 256
#: Blocks per SM of the grid-stride launch: enough resident warps to hide memory latency (H200:
#: 132 SMs x 8 blocks x 256 threads ~ 270k threads, each looping over the rest).
BLOCKS_PER_SM = 8
#: numba's dtypes for torch's: bfloat16 has none (``covers``).
DTYPES = (torch.float32, torch.float16)

def simulating() -> bool:
    """Whether numba's CUDA simulator is on: the kernels then run on CPU tensors."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def available() -> bool:
    """Whether numba can be imported here."""
    try:
        import numba.cuda  # noqa: F401
    except Exception:
        return False
    return True


def covers(x: Tensor, approximate: str) -> bool:
    """float32 and float16 inputs (numba has no bfloat16)."""
    return x.dtype in DTYPES


def _launch(kernel_name: str, tensors: list[Tensor], n: int, approximate: str) -> None:
    """Run a kernel on flat contiguous tensors: on the GPU on torch's current stream, or on the
    simulator over numpy views of CPU tensors."""
    from fused_layers.backends.numba import kernels  # imports numba: first call only

    kernel = getattr(kernels, kernel_name)
    approx_tanh = approximate == "tanh"
    if simulating():
        arrays = [t.detach().numpy() for t in tensors]
        kernel[max(1, math.ceil(n / THREADS)), THREADS](*arrays, n, approx_tanh)
        return
    from numba import cuda

    device = tensors[0].device
    # sync=False: the launch below is queued on torch's current stream, behind what wrote the inputs
    arrays = [cuda.as_cuda_array(t.detach(), sync=False) for t in tensors]
    stream = cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = max(1, min(math.ceil(n / THREADS), sms * BLOCKS_PER_SM))
    kernel[blocks, THREADS, stream](*arrays, n, approx_tanh)


def _gelu_fwd(x: Tensor, approximate: str) -> Tensor:
    """GELU(x), contiguous; the body of ``fused_layers::gelu_numba``."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        _launch("forward", [x.view(-1), y.view(-1)], x.numel(), approximate)
    return y


def _gelu_bwd(dy: Tensor, x: Tensor, approximate: str) -> Tensor:
    """dx = dy * GELU'(x); the body of ``fused_layers::gelu_numba_backward``."""
    x, dy = x.contiguous(), dy.contiguous().to(x.dtype)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        _launch("backward", [x.view(-1), dy.view(-1), dx.view(-1)], x.numel(), approximate)
    return dx


def _setup_context(ctx: Any, inputs: tuple[Tensor, str], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.approximate = inputs[1]


def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None]:
    (x,) = ctx.saved_tensors
    return run_op("gelu_numba_backward", _gelu_bwd, dy, x, ctx.approximate), None


NumbaGELUFunction = eager_function("NumbaGELUFunction", _gelu_fwd, _setup_context, _backward)


@registers
def _define() -> None:
    def like(x: Tensor) -> Tensor:  # what the launchers allocate
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    define("gelu_numba_backward", _gelu_bwd, fake=lambda dy, x, approximate: like(x))
    define("gelu_numba", _gelu_fwd, fake=lambda x, approximate: like(x)).register_autograd(
        _backward, setup_context=_setup_context
    )


def gelu(x: Tensor, approximate: str) -> Tensor:
    """GELU of ``x`` (checked by ``fused_layers.ops.gelu``; float32 or float16): the custom op
    when traced, else the autograd.Function."""
    return run_op("gelu_numba", NumbaGELUFunction.apply, x, approximate)
