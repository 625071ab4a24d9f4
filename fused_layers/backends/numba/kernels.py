"""The numba CUDA GELU kernels. Importing this module imports numba and defines them (numba
compiles each on its first launch per dtype); ``gelu.py`` imports it on its first call only.

Module-level definitions: numba's CUDA simulator runs a kernel with the ``cuda`` of its module's
globals replaced by its own, which it cannot do for a ``cuda`` held in a closure.
"""

from __future__ import annotations

import math

import numpy

# numba-cuda (0.30.4 and the lent H200 image's, 2026-11-25) registers an overload of
# numpy.row_stack when its CUDA target loads; numpy 2.5 no longer has that alias of vstack, and the
# first kernel compile then fails with AttributeError. The alias is put back for it.
if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack

from numba import cuda, float32  # noqa: E402

SQRT_2_OVER_PI = 0.7978845608028654
INV_SQRT_2 = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


@cuda.jit(device=True)
def value_and_grad(x, approx_tanh):
    """(GELU(x), dGELU/dx) of an fp32 value, tanh or erf form."""
    if approx_tanh:
        inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        s = 1.0 / (1.0 + math.exp(-2.0 * inner))  # 0.5 * (1 + tanh(inner)), no cancellation
        d_inner = SQRT_2_OVER_PI * (1.0 + 0.134145 * x * x)
        return x * s, s + 2.0 * x * s * (1.0 - s) * d_inner
    cdf = 0.5 * (1.0 + math.erf(x * INV_SQRT_2))
    return x * cdf, cdf + x * INV_SQRT_2PI * math.exp(-0.5 * x * x)


@cuda.jit
def forward(x, y, n, approx_tanh):
    # x, y: (n,) contiguous, input dtype. Grid-stride: each thread walks the rest of the array.
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        value, _ = value_and_grad(float32(x[i]), approx_tanh)
        y[i] = value


@cuda.jit
def backward(x, dy, dx, n, approx_tanh):
    # x, dy, dx: (n,) contiguous, input dtype
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        _, grad = value_and_grad(float32(x[i]), approx_tanh)
        dx[i] = float32(dy[i]) * grad
