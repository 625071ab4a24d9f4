"""CUDA C++ source of the GELU and LayerNorm kernels, kept as strings for ``load_inline``.

``KERNELS`` needs only ``<cuda_fp16.h>``/``<cuda_bf16.h>``, so it also compiles standalone with plain
``nvcc`` (see :func:`standalone_translation_unit`); ``HOST`` holds the torch launchers and bindings.
Both compile with torch's ``-D__CUDA_NO_HALF_CONVERSIONS__``-style flags: every conversion is explicit.

Bandwidth notes (H100/H200, ~3.3-4.8 TB/s): every global access moves 16 bytes per thread where the
pointers are 16-byte aligned (8 bf16/fp16 or 4 fp32 per access, ``VEC``); a scalar instantiation
(``VEC == 1``) covers misaligned views and rows whose width is not a multiple of ``VEC``.
"""

from __future__ import annotations

KERNELS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace fused_layers {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// VEC elements moved by one load/store: 16 bytes (LDG.128/STG.128) when VEC * sizeof(T) == 16.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// ---------------------------------------------------------------------------------------------
// GELU. Exact (erf) and tanh-approximate forms and their derivatives, in fp32.
// No --use_fast_math: it turns tanhf/erff/expf into MUFU approximations (~1e-3 relative error
// for tanh) and flushes denormals; GELU is bandwidth-bound, so the accurate libdevice calls cost
// nothing measurable while keeping fp32 results within a few ulp of torch.
// ---------------------------------------------------------------------------------------------
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

template <bool TANH>
__device__ __forceinline__ float gelu_value(float x) {
  if (TANH) {
    const float inner = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}

template <bool TANH>
__device__ __forceinline__ float gelu_grad(float x) {
  if (TANH) {
    const float x2 = x * x;
    const float t = tanhf(kSqrt2OverPi * x * (1.0f + kGeluCoeff * x2));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  }
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

// Grid-stride loop over VEC-packs; the n % VEC tail is done by the first block's first threads.
template <typename T, int VEC, bool TANH>
__global__ void gelu_forward_kernel(const T* __restrict__ x,  // [n]
                                    T* __restrict__ y,        // [n]
                                    int64_t n) {
  using P = Pack<T, VEC>;
  const int64_t n_packs = n / VEC;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_packs; i += stride) {
    const P in = reinterpret_cast<const P*>(x)[i];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(gelu_value<TANH>(to_float(in.v[j])));
    reinterpret_cast<P*>(y)[i] = out;
  }
  const int64_t tail = n_packs * VEC + threadIdx.x;
  if (VEC > 1 && blockIdx.x == 0 && tail < n) y[tail] = from_float<T>(gelu_value<TANH>(to_float(x[tail])));
}

template <typename T, int VEC, bool TANH>
__global__ void gelu_backward_kernel(const T* __restrict__ dy,  // [n]
                                     const T* __restrict__ x,   // [n]
                                     T* __restrict__ dx,        // [n]
                                     int64_t n) {
  using P = Pack<T, VEC>;
  const int64_t n_packs = n / VEC;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_packs; i += stride) {
    const P g = reinterpret_cast<const P*>(dy)[i];
    const P in = reinterpret_cast<const P*>(x)[i];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      out.v[j] = from_float<T>(to_float(g.v[j]) * gelu_grad<TANH>(to_float(in.v[j])));
    }
    reinterpret_cast<P*>(dx)[i] = out;
  }
  const int64_t tail = n_packs * VEC + threadIdx.x;
  if (VEC > 1 && blockIdx.x == 0 && tail < n) {
    dx[tail] = from_float<T>(to_float(dy[tail]) * gelu_grad<TANH>(to_float(x[tail])));
  }
}

// ---------------------------------------------------------------------------------------------
// Row reductions. A row is handled by the blockDim.x threads of one threadIdx.y: either a warp
// per row (blockDim.x == 32, several rows per block, no shared memory, no __syncthreads) or a
// whole block per row (blockDim.y == 1). All combines are commutative bit for bit, so the
// xor-butterfly leaves the same value in every lane and every thread sees identical statistics.
// ---------------------------------------------------------------------------------------------
struct Welford {
  float count;
  float mean;
  float m2;
};

struct SumPair {
  float a;
  float b;
};

__device__ __forceinline__ float combine(float p, float q) { return p + q; }
__device__ __forceinline__ SumPair combine(SumPair p, SumPair q) { return {p.a + q.a, p.b + q.b}; }
__device__ __forceinline__ Welford combine(Welford p, Welford q) {
  if (p.count == 0.0f) return q;
  if (q.count == 0.0f) return p;
  const float count = p.count + q.count;
  const float delta = q.mean - p.mean;
  // (p.count * p.mean + q.count * q.mean) / count is symmetric in p and q, unlike p.mean + delta * ...
  return {count, (p.count * p.mean + q.count * q.mean) / count,
          p.m2 + q.m2 + delta * delta * (p.count * q.count / count)};
}

__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ SumPair shfl_xor(SumPair v, int mask) {
  return {shfl_xor(v.a, mask), shfl_xor(v.b, mask)};
}
__device__ __forceinline__ Welford shfl_xor(Welford v, int mask) {
  return {shfl_xor(v.count, mask), shfl_xor(v.mean, mask), shfl_xor(v.m2, mask)};
}

template <typename S>
__device__ __forceinline__ S row_allreduce(S v) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = combine(v, shfl_xor(v, mask));
  if (blockDim.x == 32) return v;
  __shared__ S warp_partials[32];
  const int warp = threadIdx.x >> 5;
  const int n_warps = blockDim.x >> 5;
  __syncthreads();  // a previous call may still be reading warp_partials
  if ((threadIdx.x & 31) == 0) warp_partials[warp] = v;
  __syncthreads();
  // Every thread folds the <= 32 partials in the same order: a broadcast read, identical results.
  v = warp_partials[0];
  for (int w = 1; w < n_warps; ++w) v = combine(v, warp_partials[w]);
  return v;
}

__device__ __forceinline__ void welford_update(Welford& w, float value) {
  w.count += 1.0f;
  const float delta = value - w.mean;
  w.mean += delta / w.count;
  w.m2 += delta * (value - w.mean);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm forward over the last dim of a [M, N] row-major tensor.
// Register path: each thread keeps its PACKS packs of the row in fp32 registers, so the exact
// two-pass mean/variance costs no extra memory traffic. Looped path (rows too wide for registers,
// up to any N): streaming Welford, then a second read that mostly hits L2 (a row is <= 256 KB).
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC>
__device__ __forceinline__ void normalize_store(const float (&v)[VEC], float mean, float rstd,
                                                const T* __restrict__ weight, const T* __restrict__ bias,
                                                T* __restrict__ y_row, int p) {
  using P = Pack<T, VEC>;
  float h[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) h[j] = (v[j] - mean) * rstd;
  if (weight != nullptr) {
    const P w = reinterpret_cast<const P*>(weight)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) h[j] *= to_float(w.v[j]);
  }
  if (bias != nullptr) {
    const P b = reinterpret_cast<const P*>(bias)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) h[j] += to_float(b.v[j]);
  }
  P out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(h[j]);
  reinterpret_cast<P*>(y_row)[p] = out;
}

template <typename T, int VEC, int PACKS>
__global__ void __launch_bounds__(1024) layer_norm_forward_kernel(
    const T* __restrict__ x,       // [M, N]
    const T* __restrict__ weight,  // [N] or nullptr
    const T* __restrict__ bias,    // [N] or nullptr
    T* __restrict__ y,             // [M, N]
    float* __restrict__ mean_out,  // [M]
    float* __restrict__ rstd_out,  // [M]
    int64_t M, int N, float eps) {
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;  // the launcher picks VEC dividing N
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (int64_t)gridDim.x * blockDim.y) {
    const P* x_row = reinterpret_cast<const P*>(x + row * N);
    float v[PACKS][VEC];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p < n_packs) {
        const P in = x_row[p];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = to_float(in.v[j]);
          sum += v[k][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[k][j] = 0.0f;
      }
    }
    const float mean = row_allreduce(sum) / N;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      if (threadIdx.x + k * blockDim.x < n_packs) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) sq += (v[k][j] - mean) * (v[k][j] - mean);
      }
    }
    const float rstd = rsqrtf(row_allreduce(sq) / N + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p < n_packs) normalize_store<T, VEC>(v[k], mean, rstd, weight, bias, y + row * N, p);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(1024) layer_norm_forward_looped_kernel(
    const T* __restrict__ x,       // [M, N]
    const T* __restrict__ weight,  // [N] or nullptr
    const T* __restrict__ bias,    // [N] or nullptr
    T* __restrict__ y,             // [M, N]
    float* __restrict__ mean_out,  // [M]
    float* __restrict__ rstd_out,  // [M]
    int64_t M, int N, float eps) {
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (int64_t)gridDim.x * blockDim.y) {
    const P* x_row = reinterpret_cast<const P*>(x + row * N);
    Welford w = {0.0f, 0.0f, 0.0f};
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      const P in = x_row[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) welford_update(w, to_float(in.v[j]));
    }
    w = row_allreduce(w);
    const float mean = w.mean;
    const float rstd = rsqrtf(w.m2 / N + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      const P in = x_row[p];
      float v[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = to_float(in.v[j]);
      normalize_store<T, VEC>(v, mean, rstd, weight, bias, y + row * N, p);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm backward. With x_hat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)),  dweight = sum_rows dy * x_hat,
//   dbias = sum_rows dy.
// x_hat is recomputed from the saved fp32 mean/rstd; the two row sums share one reduction.
// ---------------------------------------------------------------------------------------------

// Loads pack p of a row as x_hat and g; when acc_dw/acc_db are given (a thread's own shared-memory
// accumulators, laid out [VEC][n_packs] so that a warp's lanes hit consecutive banks), adds
// dy * x_hat and dy to them.
template <typename T, int VEC>
__device__ __forceinline__ void load_xhat_g(const T* __restrict__ dy_row, const T* __restrict__ x_row,
                                            const T* __restrict__ weight, int p, float mean, float rstd,
                                            float (&xhat)[VEC], float (&g)[VEC], float* acc_dw = nullptr,
                                            float* acc_db = nullptr, int n_packs = 0) {
  using P = Pack<T, VEC>;
  const P d = reinterpret_cast<const P*>(dy_row)[p];
  const P in = reinterpret_cast<const P*>(x_row)[p];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    xhat[j] = (to_float(in.v[j]) - mean) * rstd;
    g[j] = to_float(d.v[j]);
  }
  if (acc_dw != nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_dw[j * n_packs + p] += g[j] * xhat[j];
  }
  if (acc_db != nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_db[j * n_packs + p] += g[j];
  }
  if (weight != nullptr) {
    const P w = reinterpret_cast<const P*>(weight)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] *= to_float(w.v[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_dx(const float (&xhat)[VEC], const float (&g)[VEC], float rstd,
                                         float mean_g, float mean_gx, T* __restrict__ dx_row, int p) {
  using P = Pack<T, VEC>;
  P out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(rstd * (g[j] - mean_g - xhat[j] * mean_gx));
  reinterpret_cast<P*>(dx_row)[p] = out;
}

// Register path. With dweight_part/dbias_part set, the grid is persistent (a few blocks per SM
// striding over rows): each thread sums dy * x_hat and dy for the columns it owns (the same ones
// in every row) in dynamic shared memory, and at the end writes them as row
// blockIdx.x * blockDim.y + threadIdx.y of the fp32 partials, which torch.sum reduces. Shared
// memory, not registers, because x_hat and g already take 2 x PACKS x VEC registers per thread.
template <typename T, int VEC, int PACKS>
__global__ void __launch_bounds__(512, 1) layer_norm_backward_dx_kernel(
    const T* __restrict__ dy,            // [M, N]
    const T* __restrict__ x,             // [M, N]
    const T* __restrict__ weight,        // [N] or nullptr
    const float* __restrict__ mean,      // [M]
    const float* __restrict__ rstd,      // [M]
    T* __restrict__ dx,                  // [M, N]
    float* __restrict__ dweight_part,    // [gridDim.x * blockDim.y, N] or nullptr
    float* __restrict__ dbias_part,      // [gridDim.x * blockDim.y, N] or nullptr
    int64_t M, int N) {
  extern __shared__ float partials_smem[];  // [2, blockDim.y, VEC, n_packs] when partials are wanted
  const int n_packs = N / VEC;
  float* acc_dw = dweight_part != nullptr ? partials_smem + (size_t)threadIdx.y * N : nullptr;
  float* acc_db = dbias_part != nullptr ? partials_smem + (size_t)(blockDim.y + threadIdx.y) * N : nullptr;
  // Each thread zeroes, updates and reads back only its own entries: no __syncthreads needed.
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < n_packs) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (acc_dw != nullptr) acc_dw[j * n_packs + p] = 0.0f;
        if (acc_db != nullptr) acc_db[j * n_packs + p] = 0.0f;
      }
    }
  }
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (int64_t)gridDim.x * blockDim.y) {
    const float mu = mean[row];
    const float rs = rstd[row];
    float xhat[PACKS][VEC];
    float g[PACKS][VEC];
    SumPair sums = {0.0f, 0.0f};  // a: sum(g), b: sum(g * x_hat)
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p < n_packs) {
        load_xhat_g<T, VEC>(dy + row * N, x + row * N, weight, p, mu, rs, xhat[k], g[k], acc_dw, acc_db,
                            n_packs);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          sums.a += g[k][j];
          sums.b += g[k][j] * xhat[k][j];
        }
      }
    }
    sums = row_allreduce(sums);
    const float mean_g = sums.a / N;
    const float mean_gx = sums.b / N;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p < n_packs) store_dx<T, VEC>(xhat[k], g[k], rs, mean_g, mean_gx, dx + row * N, p);
    }
  }
  const int64_t out_row = ((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * N;
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < n_packs) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (dweight_part != nullptr) dweight_part[out_row + p * VEC + j] = acc_dw[j * n_packs + p];
        if (dbias_part != nullptr) dbias_part[out_row + p * VEC + j] = acc_db[j * n_packs + p];
      }
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(512) layer_norm_backward_dx_looped_kernel(
    const T* __restrict__ dy,        // [M, N]
    const T* __restrict__ x,         // [M, N]
    const T* __restrict__ weight,    // [N] or nullptr
    const float* __restrict__ mean,  // [M]
    const float* __restrict__ rstd,  // [M]
    T* __restrict__ dx,              // [M, N]
    int64_t M, int N) {
  const int n_packs = N / VEC;
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (int64_t)gridDim.x * blockDim.y) {
    const float mu = mean[row];
    const float rs = rstd[row];
    float xhat[VEC];
    float g[VEC];
    SumPair sums = {0.0f, 0.0f};
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      load_xhat_g<T, VEC>(dy + row * N, x + row * N, weight, p, mu, rs, xhat, g);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        sums.a += g[j];
        sums.b += g[j] * xhat[j];
      }
    }
    sums = row_allreduce(sums);
    const float mean_g = sums.a / N;
    const float mean_gx = sums.b / N;
    // Second read of dy and x: this block read the same row a moment ago, so it comes from L2.
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      load_xhat_g<T, VEC>(dy + row * N, x + row * N, weight, p, mu, rs, xhat, g);
      store_dx<T, VEC>(xhat, g, rs, mean_g, mean_gx, dx + row * N, p);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm backward, weight and bias gradients on the looped path (or where the register path's
// shared-memory accumulators would not fit): a second pass over dy and x. Persistent grid:
// blockIdx.x picks a tile of column packs (one pack per thread, so a warp reads 512 contiguous
// bytes per row), blockIdx.y strides over rows; each thread keeps its VEC partial sums in fp32
// registers and writes one row of partials [gridDim.y, N], summed by torch.sum.
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC>
__global__ void __launch_bounds__(256) layer_norm_backward_dwdb_kernel(
    const T* __restrict__ dy,           // [M, N]
    const T* __restrict__ x,            // [M, N]
    const float* __restrict__ mean,     // [M]
    const float* __restrict__ rstd,     // [M]
    float* __restrict__ dweight_part,   // [gridDim.y, N] or nullptr
    float* __restrict__ dbias_part,     // [gridDim.y, N] or nullptr
    int64_t M, int N) {
  using P = Pack<T, VEC>;
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= N / VEC) return;  // no block-wide synchronisation below, so an early exit is safe
  float dw[VEC];
  float db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    dw[j] = 0.0f;
    db[j] = 0.0f;
  }
#pragma unroll 4
  for (int64_t row = blockIdx.y; row < M; row += gridDim.y) {
    const P d = reinterpret_cast<const P*>(dy + row * N)[p];
    const P in = reinterpret_cast<const P*>(x + row * N)[p];
    const float mu = mean[row];
    const float rs = rstd[row];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float dyj = to_float(d.v[j]);
      db[j] += dyj;
      dw[j] += dyj * (to_float(in.v[j]) - mu) * rs;
    }
  }
  const int64_t out = (int64_t)blockIdx.y * N + (int64_t)p * VEC;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (dweight_part != nullptr) dweight_part[out + j] = dw[j];
    if (dbias_part != nullptr) dbias_part[out + j] = db[j];
  }
}

}  // namespace fused_layers
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace fused_layers {

template <typename T> struct Tag { using type = T; };

// Calls f(Tag<cuda type>) for the tensor's dtype: at::Half/at::BFloat16 share the layout of
// __half/__nv_bfloat16, so their data pointers are reinterpreted.
template <typename F>
void dispatch_dtype(const torch::Tensor& t, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: f(Tag<float>{}); break;
    case at::kHalf: f(Tag<__half>{}); break;
    case at::kBFloat16: f(Tag<__nv_bfloat16>{}); break;
    default: TORCH_CHECK(false, "fused_layers.cuda: unsupported dtype ", t.scalar_type(),
                         " (expected float32, float16 or bfloat16)");
  }
}

template <typename T> T* data(const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }
template <typename T> const T* data_or_null(const std::optional<torch::Tensor>& t) {
  return t.has_value() ? reinterpret_cast<const T*>(t->data_ptr()) : nullptr;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_input(const torch::Tensor& t, const torch::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cuda(), "fused_layers.cuda: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "fused_layers.cuda: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "fused_layers.cuda: ", name, " has dtype ",
              t.scalar_type(), ", expected ", like.scalar_type());
  TORCH_CHECK(t.device() == like.device(), "fused_layers.cuda: ", name, " is on another device");
}

// Kept to c10 headers (no ATen/cuda/CUDAContext.h, which pulls in cuBLAS/cuSPARSE headers), so the
// host code also compiles in a syntax check against torch's headers on a machine without them.
int sm_count() {
  int device = 0;
  int count = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// ---- GELU ------------------------------------------------------------------------------------

// 256 threads x 8 resident blocks fill an SM's 2048 thread slots; more blocks than that only
// add scheduling work, the grid-stride loop covers the rest.
template <typename T, int VEC>
void launch_gelu(const torch::Tensor* dy, const torch::Tensor& x, torch::Tensor& out, bool tanh_approx) {
  const int64_t n = x.numel();
  const int threads = 256;
  const int64_t packs = std::max<int64_t>(n / VEC, 1);
  const int blocks = (int)std::min<int64_t>((packs + threads - 1) / threads, (int64_t)sm_count() * 8);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const T* x_ptr = data<T>(x);
  T* out_ptr = data<T>(out);
  if (dy == nullptr) {
    if (tanh_approx) gelu_forward_kernel<T, VEC, true><<<blocks, threads, 0, stream>>>(x_ptr, out_ptr, n);
    else gelu_forward_kernel<T, VEC, false><<<blocks, threads, 0, stream>>>(x_ptr, out_ptr, n);
  } else {
    const T* dy_ptr = data<T>(*dy);
    if (tanh_approx)
      gelu_backward_kernel<T, VEC, true><<<blocks, threads, 0, stream>>>(dy_ptr, x_ptr, out_ptr, n);
    else
      gelu_backward_kernel<T, VEC, false><<<blocks, threads, 0, stream>>>(dy_ptr, x_ptr, out_ptr, n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor gelu_impl(const torch::Tensor* dy, const torch::Tensor& x, bool tanh_approx) {
  check_input(x, x, "x");
  if (dy != nullptr) {
    check_input(*dy, x, "grad_output");
    TORCH_CHECK(dy->sizes() == x.sizes(), "fused_layers.cuda: grad_output and x differ in shape");
  }
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto out = torch::empty_like(x, at::MemoryFormat::Contiguous);
  if (x.numel() == 0) return out;
  dispatch_dtype(x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int VEC = 16 / sizeof(T);
    const bool vec_ok = aligned16(x.data_ptr()) && aligned16(out.data_ptr()) &&
                        (dy == nullptr || aligned16(dy->data_ptr()));
    if (vec_ok) launch_gelu<T, VEC>(dy, x, out, tanh_approx);
    else launch_gelu<T, 1>(dy, x, out, tanh_approx);
  });
  return out;
}

// ---- LayerNorm -------------------------------------------------------------------------------

// How a row is spread over threads: threads_per_row (a multiple of 32), rows_per_block, and how
// many packs each thread keeps in registers (0: the looped kernel).
struct RowPlan {
  int threads_per_row;
  int rows_per_block;
  int packs;
};

// Prefer <= 256 threads per row with up to 4 packs each (enough loads in flight per thread);
// wider rows use up to max_threads x 4 packs, beyond that the looped kernel. A row that fits one
// warp gets a warp, and 4 such rows share a 128-thread block.
RowPlan plan_rows(int n_packs, int max_threads) {
  auto round_warp = [](int v) { return std::max(32, (v + 31) / 32 * 32); };
  RowPlan plan{0, 1, 0};
  for (int packs : {1, 2, 4}) {
    if (n_packs <= packs * 256) {
      plan = {round_warp((n_packs + packs - 1) / packs), 1, packs};
      break;
    }
  }
  if (plan.packs == 0 && n_packs <= 4 * max_threads) plan = {round_warp((n_packs + 3) / 4), 1, 4};
  if (plan.packs == 0) plan = {max_threads, 1, 0};
  if (plan.threads_per_row == 32) plan.rows_per_block = 4;
  return plan;
}

int row_blocks(int64_t M, const RowPlan& plan) {
  return (int)std::min<int64_t>((M + plan.rows_per_block - 1) / plan.rows_per_block, 1 << 30);
}

template <typename T, int VEC>
void launch_layer_norm_forward(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                               const std::optional<torch::Tensor>& bias, torch::Tensor& y,
                               torch::Tensor& mean, torch::Tensor& rstd, int64_t M, int N, float eps) {
  const RowPlan plan = plan_rows(N / VEC, 1024);
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  const int grid = row_blocks(M, plan);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const T* w = data_or_null<T>(weight);
  const T* b = data_or_null<T>(bias);
#define FL_LN_FWD(...) \
  __VA_ARGS__<<<grid, block, 0, stream>>>(data<T>(x), w, b, data<T>(y), data<float>(mean), \
                                          data<float>(rstd), M, N, eps)
  switch (plan.packs) {
    case 1: FL_LN_FWD(layer_norm_forward_kernel<T, VEC, 1>); break;
    case 2: FL_LN_FWD(layer_norm_forward_kernel<T, VEC, 2>); break;
    case 4: FL_LN_FWD(layer_norm_forward_kernel<T, VEC, 4>); break;
    default: FL_LN_FWD(layer_norm_forward_looped_kernel<T, VEC>); break;
  }
#undef FL_LN_FWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int max_shared_memory_optin() {
  int device = 0;
  int bytes = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

// Blocks for a persistent launch: as many as fit on the GPU at once, at most `needed`.
template <typename Kernel>
int persistent_blocks(Kernel kernel, int threads, size_t smem_bytes, int needed) {
  if (smem_bytes > 48 * 1024) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
  }
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  TORCH_CHECK(per_sm > 0, "fused_layers.cuda: layer_norm backward does not fit on an SM (", threads,
              " threads, ", smem_bytes, " bytes of shared memory)");
  return std::max(1, std::min(needed, per_sm * sm_count()));
}

// Returns {dweight, dbias} in fp32 (empty when not asked for) and writes dx.
template <typename T, int VEC>
std::vector<torch::Tensor> launch_layer_norm_backward(const torch::Tensor& dy, const torch::Tensor& x,
                                                      const std::optional<torch::Tensor>& weight,
                                                      const torch::Tensor& mean, const torch::Tensor& rstd,
                                                      torch::Tensor& dx, bool need_dweight, bool need_dbias,
                                                      int64_t M, int N) {
  // 512 threads at most: x_hat and g both live in registers (2 x PACKS x VEC floats per thread).
  const RowPlan plan = plan_rows(N / VEC, 512);
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  const int threads = plan.threads_per_row * plan.rows_per_block;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto f32 = x.options().dtype(at::kFloat);
  auto empty = torch::empty({0}, f32);
  const T* w = data_or_null<T>(weight);
  const bool partials = need_dweight || need_dbias;
  const size_t smem = partials ? 2 * (size_t)plan.rows_per_block * N * sizeof(float) : 0;
  const bool fused_partials = partials && plan.packs > 0 && smem <= (size_t)max_shared_memory_optin();
  int grid = row_blocks(M, plan);
  torch::Tensor dweight_part = empty;
  torch::Tensor dbias_part = empty;
#define FL_LN_BWD(...)                                                                                  \
  do {                                                                                                  \
    if (fused_partials) {                                                                               \
      grid = persistent_blocks(__VA_ARGS__, threads, smem, grid);                                       \
      if (need_dweight) dweight_part = torch::empty({(int64_t)grid * plan.rows_per_block, N}, f32);     \
      if (need_dbias) dbias_part = torch::empty({(int64_t)grid * plan.rows_per_block, N}, f32);         \
    }                                                                                                   \
    __VA_ARGS__<<<grid, block, fused_partials ? smem : 0, stream>>>(                                   \
        data<T>(dy), data<T>(x), w, data<float>(mean), data<float>(rstd), data<T>(dx),                 \
        (fused_partials && need_dweight) ? data<float>(dweight_part) : nullptr,                         \
        (fused_partials && need_dbias) ? data<float>(dbias_part) : nullptr, M, N);                      \
  } while (0)
  switch (plan.packs) {
    case 1: FL_LN_BWD(layer_norm_backward_dx_kernel<T, VEC, 1>); break;
    case 2: FL_LN_BWD(layer_norm_backward_dx_kernel<T, VEC, 2>); break;
    case 4: FL_LN_BWD(layer_norm_backward_dx_kernel<T, VEC, 4>); break;
    default:
      layer_norm_backward_dx_looped_kernel<T, VEC><<<grid, block, 0, stream>>>(
          data<T>(dy), data<T>(x), w, data<float>(mean), data<float>(rstd), data<T>(dx), M, N);
      break;
  }
#undef FL_LN_BWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (partials && !fused_partials) {
    // Column tiles x row chunks: about 4 waves of blocks on the SMs, each chunk >= 8 rows.
    const int col_threads = 256;
    const int64_t col_tiles = (N / VEC + col_threads - 1) / col_threads;
    const int64_t wanted = std::max<int64_t>(1, 4 * sm_count() / col_tiles);
    const int row_chunks = (int)std::max<int64_t>(1, std::min<int64_t>({wanted, (M + 7) / 8, 1024}));
    if (need_dweight) dweight_part = torch::empty({row_chunks, N}, f32);
    if (need_dbias) dbias_part = torch::empty({row_chunks, N}, f32);
    const dim3 grid2((unsigned)col_tiles, row_chunks);
    layer_norm_backward_dwdb_kernel<T, VEC><<<grid2, col_threads, 0, stream>>>(
        data<T>(dy), data<T>(x), data<float>(mean), data<float>(rstd),
        need_dweight ? data<float>(dweight_part) : nullptr,
        need_dbias ? data<float>(dbias_part) : nullptr, M, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {need_dweight ? dweight_part.sum(0) : empty, need_dbias ? dbias_part.sum(0) : empty};
}

// True when every pointer is 16-byte aligned and N splits into 16-byte packs.
template <typename T>
bool can_vectorize(int N, std::initializer_list<const void*> pointers) {
  if (N % (16 / sizeof(T)) != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;
  }
  return true;
}

void check_affine(const std::optional<torch::Tensor>& t, const torch::Tensor& x, int64_t N,
                  const char* name) {
  if (!t.has_value()) return;
  check_input(*t, x, name);
  TORCH_CHECK(t->dim() == 1 && t->size(0) == N, "fused_layers.cuda: ", name, " must have shape (", N, ",)");
}

}  // namespace fused_layers

// ---- Entry points bound by load_inline (global names, declared in DECLARATIONS) ---------------
using namespace fused_layers;

torch::Tensor gelu_forward(torch::Tensor x, bool tanh_approx) { return gelu_impl(nullptr, x, tanh_approx); }

torch::Tensor gelu_backward(torch::Tensor grad_output, torch::Tensor x, bool tanh_approx) {
  return gelu_impl(&grad_output, x, tanh_approx);
}

std::vector<torch::Tensor> layer_norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                              std::optional<torch::Tensor> bias, double eps) {
  check_input(x, x, "x");
  TORCH_CHECK(x.dim() == 2, "fused_layers.cuda: layer_norm_forward expects a [rows, width] tensor");
  const int64_t M = x.size(0);
  const int64_t N = x.size(1);
  TORCH_CHECK(N > 0 && N <= INT32_MAX, "fused_layers.cuda: layer_norm width must be in [1, 2^31)");
  check_affine(weight, x, N, "weight");
  check_affine(bias, x, N, "bias");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto y = torch::empty_like(x);
  auto mean = torch::empty({M}, x.options().dtype(at::kFloat));
  auto rstd = torch::empty({M}, x.options().dtype(at::kFloat));
  if (M == 0) return {y, mean, rstd};
  dispatch_dtype(x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int VEC = 16 / sizeof(T);
    const bool vec_ok =
        can_vectorize<T>((int)N, {x.data_ptr(), y.data_ptr(), data_or_null<T>(weight),
                                  data_or_null<T>(bias)});
    if (vec_ok)
      launch_layer_norm_forward<T, VEC>(x, weight, bias, y, mean, rstd, M, (int)N, (float)eps);
    else
      launch_layer_norm_forward<T, 1>(x, weight, bias, y, mean, rstd, M, (int)N, (float)eps);
  });
  return {y, mean, rstd};
}

// Returns {dx, dweight, dbias}; a gradient that was not asked for comes back as an empty tensor.
std::vector<torch::Tensor> layer_norm_backward(torch::Tensor grad_output, torch::Tensor x,
                                               std::optional<torch::Tensor> weight, torch::Tensor mean,
                                               torch::Tensor rstd, bool need_dweight, bool need_dbias) {
  check_input(x, x, "x");
  check_input(grad_output, x, "grad_output");
  TORCH_CHECK(x.dim() == 2 && grad_output.sizes() == x.sizes(),
              "fused_layers.cuda: layer_norm_backward expects grad_output and x of one [rows, width] shape");
  const int64_t M = x.size(0);
  const int64_t N = x.size(1);
  check_affine(weight, x, N, "weight");
  TORCH_CHECK(mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat && mean.is_contiguous() &&
                  rstd.is_contiguous() && mean.numel() == M && rstd.numel() == M,
              "fused_layers.cuda: mean and rstd must be contiguous float32 tensors of ", M, " elements");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto dx = torch::empty_like(x);
  auto f32 = x.options().dtype(at::kFloat);
  auto empty = torch::empty({0}, f32);
  if (M == 0) {
    return {dx, need_dweight ? torch::zeros({N}, f32) : empty, need_dbias ? torch::zeros({N}, f32) : empty};
  }
  std::vector<torch::Tensor> dweight_dbias;
  dispatch_dtype(x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int VEC = 16 / sizeof(T);
    const bool vec_ok = can_vectorize<T>(
        (int)N, {x.data_ptr(), grad_output.data_ptr(), dx.data_ptr(), data_or_null<T>(weight)});
    const int width = (int)N;
    dweight_dbias =
        vec_ok ? launch_layer_norm_backward<T, VEC>(grad_output, x, weight, mean, rstd, dx, need_dweight,
                                                    need_dbias, M, width)
               : launch_layer_norm_backward<T, 1>(grad_output, x, weight, mean, rstd, dx, need_dweight,
                                                  need_dbias, M, width);
  });
  return {dx, dweight_dbias[0], dweight_dbias[1]};
}
"""

# Declarations for load_inline's generated pybind11 module (it binds ``FUNCTIONS`` by name).
DECLARATIONS = r"""
#include <torch/extension.h>
#include <optional>
#include <vector>
torch::Tensor gelu_forward(torch::Tensor x, bool tanh_approx);
torch::Tensor gelu_backward(torch::Tensor grad_output, torch::Tensor x, bool tanh_approx);
std::vector<torch::Tensor> layer_norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                              std::optional<torch::Tensor> bias, double eps);
std::vector<torch::Tensor> layer_norm_backward(torch::Tensor grad_output, torch::Tensor x,
                                               std::optional<torch::Tensor> weight, torch::Tensor mean,
                                               torch::Tensor rstd, bool need_dweight, bool need_dbias);
"""

FUNCTIONS = ("gelu_forward", "gelu_backward", "layer_norm_forward", "layer_norm_backward")

# The same defines torch.utils.cpp_extension passes to nvcc, so the standalone check sees the
# kernels exactly as load_inline compiles them.
TORCH_NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
)


def standalone_translation_unit() -> str:
    """Return ``KERNELS`` plus a table taking every instantiation's address, for plain ``nvcc -c``.

    Lets the kernels be compiled (and ``-Xptxas -v`` register counts read) on a machine with nvcc
    but no GPU and no torch headers.
    """
    dtypes = ("float", "__half", "__nv_bfloat16")
    vec = {"float": 4, "__half": 8, "__nv_bfloat16": 8}
    kernels = []
    for t in dtypes:
        for v in (vec[t], 1):
            for approx in ("true", "false"):
                kernels.append(f"gelu_forward_kernel<{t}, {v}, {approx}>")
                kernels.append(f"gelu_backward_kernel<{t}, {v}, {approx}>")
            for packs in (1, 2, 4):
                kernels.append(f"layer_norm_forward_kernel<{t}, {v}, {packs}>")
                kernels.append(f"layer_norm_backward_dx_kernel<{t}, {v}, {packs}>")
            kernels.append(f"layer_norm_forward_looped_kernel<{t}, {v}>")
            kernels.append(f"layer_norm_backward_dx_looped_kernel<{t}, {v}>")
            kernels.append(f"layer_norm_backward_dwdb_kernel<{t}, {v}>")
    table = ",\n  ".join(f"(const void*)&fused_layers::{k}" for k in kernels)
    return KERNELS + f"\nconst void* fused_layers_all_kernels[] = {{\n  {table}\n}};\n"
