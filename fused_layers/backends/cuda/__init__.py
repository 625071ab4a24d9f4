"""The CUDA C++ backend: LayerNorm and RMSNorm, with their autograd node written in C++.

::

    layer_norm.py  rms_norm.py   the entry functions (checks, then norm.py)
    norm.py                      what both share: the extension's calls, custom ops for traced calls
    build.py                     load_extension(): torch.utils.cpp_extension.load of the sources below
    norm.h                       the extension's entry points (declarations)
    norm.cu                      their host code: launchers, the NormBackward autograd node
    kernels.cuh                  the kernels (device code only, no torch header)
    bindings.cpp                 the Python module: norm.h's functions bound by name
    all_kernels.cu               every kernel instantiation, for a plain nvcc compile in the tests

Inputs of any leading shape in float32, float16 or bfloat16; math in fp32, results stored in the
input's dtype; non-contiguous inputs are copied to contiguous ones; zero rows are allowed. The
extension is compiled on the first call that needs it, never at import.

Where it pays, as measured on an H200 (2026-11-24, bf16, ``fused_layers.dispatch.DEFAULT_BACKEND``):
for a call autograd differentiates, the C++ autograd node takes a LayerNorm or RMSNorm
forward+backward's host time to 184-258 µs against Triton's 459-708, with kernels at 87-95% of copy
bandwidth; so both norms default to it there. There is no CUDA GELU: its kernels ran at 3.41-3.65
TB/s against Triton's 3.75-4.15 in both passes (2026-11-22), its autograd was a Python Function
like Triton's, and no default chose it, so it did not pay for itself and was dropped.
"""
