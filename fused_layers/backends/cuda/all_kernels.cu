// Every kernel instantiation that norm.cu can launch, for plain `nvcc -c` (no torch headers, no
// GPU): tests/gpu/test_cuda_ops.py compiles this file with `-Xptxas -v` and checks that no kernel
// spills. Keep it in step with norm.cu's launchers: element types float, __half and __nv_bfloat16,
// each with its 16-byte pack (VEC) and the scalar fallback (VEC == 1).
#include "kernels.cuh"

using namespace fused_layers;

// The kernels of one element type T, pack width V and norm kind RMS. fp16 has no 4-pack pipelined
// backward: it spills there, and the launcher takes the held kernel instead.
#define FL_NORM_KERNELS(T, V, RMS)                                                                      \
  (const void*)&norm_forward_kernel<T, V, 1, RMS>, (const void*)&norm_forward_kernel<T, V, 2, RMS>,     \
      (const void*)&norm_forward_kernel<T, V, 4, RMS>, (const void*)&norm_forward_looped_kernel<T, V, RMS>, \
      (const void*)&norm_backward_kernel<T, V, 1, RMS>, (const void*)&norm_backward_kernel<T, V, 2, RMS>,   \
      (const void*)&norm_backward_kernel<T, V, 4, RMS>,                                                 \
      (const void*)&norm_backward_pipelined_kernel<T, V, 1, RMS>,                                       \
      (const void*)&norm_backward_pipelined_kernel<T, V, 2, RMS>,                                       \
      (const void*)&norm_backward_dx_looped_kernel<T, V, RMS>,                                          \
      (const void*)&norm_backward_dwdb_kernel<T, V, RMS>
#define FL_PIPELINED_4(T, V, RMS) (const void*)&norm_backward_pipelined_kernel<T, V, 4, RMS>
#define FL_BOTH_NORMS(T, V) FL_NORM_KERNELS(T, V, false), FL_NORM_KERNELS(T, V, true)

const void* fused_layers_all_kernels[] = {
    FL_BOTH_NORMS(float, 4), FL_BOTH_NORMS(float, 1),
    FL_PIPELINED_4(float, 4, false), FL_PIPELINED_4(float, 4, true),
    FL_PIPELINED_4(float, 1, false), FL_PIPELINED_4(float, 1, true),
    FL_BOTH_NORMS(__nv_bfloat16, 8), FL_BOTH_NORMS(__nv_bfloat16, 1),
    FL_PIPELINED_4(__nv_bfloat16, 8, false), FL_PIPELINED_4(__nv_bfloat16, 8, true),
    FL_PIPELINED_4(__nv_bfloat16, 1, false), FL_PIPELINED_4(__nv_bfloat16, 1, true),
    FL_BOTH_NORMS(__half, 8), FL_BOTH_NORMS(__half, 1),
    (const void*)&sum_partials_kernel<float>, (const void*)&sum_partials_kernel<__nv_bfloat16>,
    (const void*)&sum_partials_kernel<__half>,
};
