"""The numba CUDA backend: GELU written in Python with ``numba.cuda``, beside Triton's and CUDA C++.

numba is an optional dependency (the ``numba`` extra) and is imported on the first call, never at
import. Its kernels run on torch's tensors without a copy (``__cuda_array_interface__``) on
torch's current stream. Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) they run on the
CPU, one Python thread per GPU thread: how the tests check them without a GPU, on small tensors.
float32 and float16 only: numba has no bfloat16 arrays, so a bf16 call goes to Triton.
"""
