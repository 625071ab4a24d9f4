"""The implementations behind each fused op, one folder per backend with the same file names.

::

    backends/
      custom_ops.py     what the kernel backends share: custom ops for traced calls
      triton/           gelu.py gated.py layer_norm.py rms_norm.py rope.py linear_cross_entropy.py
                        (+ their shared helpers)
      cuda/             layer_norm.py rms_norm.py, the C++/CUDA sources and the build that loads them
      numba/            gelu.py, in numba CUDA (optional: the numba extra)
      torch/            gelu.py gated.py layer_norm.py rms_norm.py rope.py linear_cross_entropy.py,
                        in plain torch

``fused_layers.dispatch`` holds the one table from (op, backend) to these implementations and the
rule that picks a backend for a call; a backend imports nothing from ``fused_layers.ops``.
"""
