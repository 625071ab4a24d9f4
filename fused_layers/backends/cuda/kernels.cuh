"""CUDA C++ source of the GELU, LayerNorm and RMSNorm kernels, kept as strings for ``load_inline``.

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

// A pack in fp32. Callers load a pack from global memory into a local first: given a reference to
// global memory, the word-wise bf16 conversion below would load it 4 bytes at a time.
template <typename T, int VEC>
__device__ __forceinline__ void unpack(const Pack<T, VEC>& p, float (&f)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) f[j] = to_float(p.v[j]);
}

// bf16 is the top half of an fp32, so a 32-bit word of two bf16 converts with one integer
// instruction per element (u << 16, u & 0xffff0000); the generic conversion of the upper half
// takes two (a byte permute, then the shift). The norm kernels issue about one instruction per
// cycle per scheduler, so this shows up in their time.
template <int VEC>
__device__ __forceinline__ void unpack(const Pack<__nv_bfloat16, VEC>& p, float (&f)[VEC]) {
  if constexpr (VEC % 2 == 0) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&p);
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      f[2 * j] = __uint_as_float(words[j] << 16);
      f[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = to_float(p.v[j]);
  }
}

// f *= w, element by element.
template <typename T, int VEC>
__device__ __forceinline__ void scale_by(float (&f)[VEC], const Pack<T, VEC>& w) {
  float wf[VEC];
  unpack(w, wf);
#pragma unroll
  for (int j = 0; j < VEC; ++j) f[j] *= wf[j];
}

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

// `turn` counts the calls (every thread of the block makes the same ones). Rows wider than a warp
// exchange partials through two buffers, used in turn: a thread still reading the previous call's
// partials holds no one up, since the buffer written now was last read before the previous call's
// barrier. One __syncthreads per call instead of two.
template <typename S>
__device__ __forceinline__ S row_allreduce(S v, int& turn) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = combine(v, shfl_xor(v, mask));
  if (blockDim.x == 32) return v;
  // Rows of blockDim.x > 32 threads: every thread of the block must call this together.
  __shared__ S warp_partials[2][32];
  S* partials = warp_partials[turn++ & 1];
  const int n_warps = blockDim.x >> 5;
  const int first = threadIdx.y * n_warps;  // this row's warps are first .. first + n_warps - 1
  if ((threadIdx.x & 31) == 0) partials[first + (threadIdx.x >> 5)] = v;
  __syncthreads();
  // Every thread folds its row's <= 32 partials in the same order: a broadcast read, identical results.
  v = partials[first];
  for (int w = 1; w < n_warps; ++w) v = combine(v, partials[first + w]);
  return v;
}

__device__ __forceinline__ void welford_update(Welford& w, float value) {
  w.count += 1.0f;
  const float delta = value - w.mean;
  w.mean += delta / w.count;
  w.m2 += delta * (value - w.mean);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm (RMS = true) over the last dim of a [M, N] row-major tensor.
//   LayerNorm: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps).
//   RMSNorm, with Hugging Face Llama's casting: y = weight * T(x * rstd), rstd = 1 / sqrt(mean(x^2)
//   + eps): the normalised row is rounded to T before the weight multiplies it.
// Rows are processed in groups of blockDim.y (one per threadIdx.y); every thread runs the same
// number of group iterations, so the block-wide reductions of rows wider than a warp stay in step.
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// v: the row's values, minus the mean already for LayerNorm (RMSNorm: as they are).
template <typename T, int VEC, bool RMS>
__device__ __forceinline__ void normalize_store(const float (&v)[VEC], float rstd,
                                                const T* __restrict__ weight, const T* __restrict__ bias,
                                                T* __restrict__ y_row, int p) {
  using P = Pack<T, VEC>;
  float h[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) h[j] = RMS ? round_to<T>(v[j] * rstd) : v[j] * rstd;
  if (weight != nullptr) {
    float w[VEC];
    unpack(P(reinterpret_cast<const P*>(weight)[p]), w);
#pragma unroll
    for (int j = 0; j < VEC; ++j) h[j] *= w[j];
  }
  if (!RMS && bias != nullptr) {
    float b[VEC];
    unpack(P(reinterpret_cast<const P*>(bias)[p]), b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) h[j] += b[j];
  }
  P out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(h[j]);
  reinterpret_cast<P*>(y_row)[p] = out;
}

// Register path: each thread keeps its PACKS packs of the row in fp32 registers, so the exact
// two-pass mean/variance costs no extra memory traffic.
template <typename T, int VEC, int PACKS, bool RMS>
__global__ void __launch_bounds__(1024) norm_forward_kernel(
    const T* __restrict__ x,       // [M, N]
    const T* __restrict__ weight,  // [N] or nullptr
    const T* __restrict__ bias,    // [N] or nullptr (LayerNorm only)
    T* __restrict__ y,             // [M, N]
    float* __restrict__ mean_out,  // [M] (LayerNorm only)
    float* __restrict__ rstd_out,  // [M]
    int64_t M, int N, float eps,
    float inv_n) {  // 1 / N from the host: an fp32 division's slow path is a subroutine call, and
                    // with one in a kernel ptxas holds instantiations to 64 registers and spills
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;  // the launcher picks VEC dividing N
  int turn = 0;                 // row_allreduce's calls
  for (int64_t group = blockIdx.x; group * blockDim.y < M; group += gridDim.x) {
    const int64_t row = group * blockDim.y + threadIdx.y;
    const bool active = row < M;
    const P* x_row = reinterpret_cast<const P*>(x + (active ? row : 0) * N);
    float v[PACKS][VEC];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) {
        unpack(P(x_row[p]), v[k]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum += v[k][j];
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[k][j] = 0.0f;
      }
    }
    const float mean = RMS ? 0.0f : row_allreduce(sum, turn) * inv_n;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      if (threadIdx.x + k * blockDim.x < n_packs) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if (!RMS) v[k][j] -= mean;  // centred once, for the variance and the output
          sq += v[k][j] * v[k][j];
        }
      }
    }
    const float rstd = rsqrtf(row_allreduce(sq, turn) * inv_n + eps);
    if (!active) continue;  // after the last reduction: no block-wide step follows in this group
    if (threadIdx.x == 0) {
      if (!RMS) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p < n_packs) normalize_store<T, VEC, RMS>(v[k], rstd, weight, bias, y + row * N, p);
    }
  }
}

// Looped path (rows too wide for registers, up to any N): one row per block; streaming Welford
// (LayerNorm) or a sum of squares (RMSNorm), then a second read that mostly hits L2.
template <typename T, int VEC, bool RMS>
__global__ void __launch_bounds__(1024) norm_forward_looped_kernel(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ y,
    float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t M, int N, float eps,
    float inv_n) {  // 1 / N, as for norm_forward_kernel
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;
  int turn = 0;  // row_allreduce's calls
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const P* x_row = reinterpret_cast<const P*>(x + row * N);
    float mean = 0.0f;
    float rstd = 0.0f;
    if (RMS) {
      float sq = 0.0f;
      for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
        float v[VEC];
        unpack(P(x_row[p]), v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sq += v[j] * v[j];
      }
      rstd = rsqrtf(row_allreduce(sq, turn) * inv_n + eps);
    } else {
      Welford w = {0.0f, 0.0f, 0.0f};
      for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
        float v[VEC];
        unpack(P(x_row[p]), v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) welford_update(w, v[j]);
      }
      w = row_allreduce(w, turn);
      mean = w.mean;
      rstd = rsqrtf(w.m2 * inv_n + eps);
    }
    if (threadIdx.x == 0) {
      if (!RMS) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      float v[VEC];
      unpack(P(x_row[p]), v);
      if (!RMS) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] -= mean;
      }
      normalize_store<T, VEC, RMS>(v, rstd, weight, bias, y + row * N, p);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward. With x_hat = (x - mean) * rstd (RMSNorm: x * rstd) and g = dy * weight:
//   dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (RMSNorm: no mean(g) term),
//   dweight = sum_rows dy * x_hat (RMSNorm: x_hat rounded to T, as the forward used it),
//   dbias = sum_rows dy.
// x_hat is recomputed from the saved fp32 mean/rstd; the two row sums share one reduction.
// ---------------------------------------------------------------------------------------------

// Adds one pack's terms to a row's sums: a += g (LayerNorm only), b += g * (x - mean), where
// g = dy * weight; w is the weight's pack, or nullptr for no weight.
template <bool RMS, typename T, int VEC>
__device__ __forceinline__ void add_row_sums(SumPair& sums, const Pack<T, VEC>& x, const Pack<T, VEC>& dy,
                                             const Pack<T, VEC>* w, float mu) {
  float xf[VEC], g[VEC];
  unpack(x, xf);
  unpack(dy, g);
  if (w != nullptr) scale_by(g, *w);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (!RMS) sums.a += g[j];
    sums.b += g[j] * (xf[j] - mu);
  }
}

// The same, with the weight's pack p loaded from global memory (weight may be nullptr).
template <bool RMS, typename T, int VEC>
__device__ __forceinline__ void add_row_sums(SumPair& sums, const Pack<T, VEC>& x, const Pack<T, VEC>& dy,
                                             const T* __restrict__ weight, int p, float mu) {
  if (weight == nullptr) return add_row_sums<RMS>(sums, x, dy, (const Pack<T, VEC>*)nullptr, mu);
  const Pack<T, VEC> w(reinterpret_cast<const Pack<T, VEC>*>(weight)[p]);
  add_row_sums<RMS>(sums, x, dy, &w, mu);
}

// dx = rs * (g - mean(g) - x_hat * mean(g * x_hat)) = rs * g + (x_hat * b + c), from the row's
// reduced sums: two fused multiply-adds per element. The sums stay centred on the mean: the
// uncentred form torch's older kernel used (sum(g * x) - mean * sum(g), times rs^3) blows a
// rounding error up to O(1) where the variance is near zero (a row of one element, a constant row).
struct DxTerms {
  float b;  // -rs * mean(g * x_hat)
  float c;  // -rs * mean(g) (0 for RMSNorm)
};

template <bool RMS>
__device__ __forceinline__ DxTerms dx_terms(SumPair sums, float rs, float inv_n) {
  return {-sums.b * rs * rs * inv_n, RMS ? 0.0f : -sums.a * rs * inv_n};
}

__device__ __forceinline__ float dx_value(float g, float x_hat, float rs, DxTerms t) {
  return fmaf(rs, g, fmaf(x_hat, t.b, t.c));
}

// Per-thread sums in shared memory, laid out [VEC / 4][n_packs] float4s (VEC % 4 == 0) or
// [VEC][n_packs] floats (VEC == 1), so that a warp's lanes touch consecutive words: no bank
// conflicts. Each thread only ever touches its own entries.
template <int VEC>
__device__ __forceinline__ void smem_add(float* base, int n_packs, int p, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
    float4* b = reinterpret_cast<float4*>(base);
#pragma unroll
    for (int c = 0; c < VEC / 4; ++c) {
      float4 a = b[c * n_packs + p];
      a.x += v[4 * c];
      a.y += v[4 * c + 1];
      a.z += v[4 * c + 2];
      a.w += v[4 * c + 3];
      b[c * n_packs + p] = a;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) base[j * n_packs + p] += v[j];
  }
}

template <int VEC>
__device__ __forceinline__ float& smem_at(float* base, int n_packs, int p, int j) {
  if constexpr (VEC % 4 == 0) return base[((j / 4) * n_packs + p) * 4 + j % 4];
  else return base[j * n_packs + p];
}

// VEC floats to or from memory at a pack's columns (16-byte aligned when VEC % 4 == 0): float4
// accesses, so that a warp's stores of consecutive packs coalesce.
template <int VEC>
__device__ __forceinline__ void store_floats(float* dst, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int c = 0; c < VEC / 4; ++c) {
      reinterpret_cast<float4*>(dst)[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dst[j] = v[j];
  }
}

template <int VEC>
__device__ __forceinline__ void add_floats(float (&v)[VEC], const float* src) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int c = 0; c < VEC / 4; ++c) {
      const float4 a = reinterpret_cast<const float4*>(src)[c];
      v[4 * c] += a.x;
      v[4 * c + 1] += a.y;
      v[4 * c + 2] += a.z;
      v[4 * c + 3] += a.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] += src[j];
  }
}

// Copies one pack from global to shared memory asynchronously (cp.async, sm_80+: no registers
// held while it is in flight); packs of other sizes, or older GPUs, copy synchronously.
template <typename P>
__device__ __forceinline__ void copy_async(P* smem_dst, const P* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(P) == 16) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
    return;
  }
#endif
  *smem_dst = *global_src;
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Starts copying this thread's packs of row `row` of x and dy into its row slot's stage.
template <typename T, int VEC, int PACKS>
__device__ __forceinline__ void stage_row(const T* __restrict__ dy, const T* __restrict__ x, int64_t row,
                                          int N, Pack<T, VEC>* x_stage, Pack<T, VEC>* dy_stage) {
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;
  const P* x_row = reinterpret_cast<const P*>(x + row * N);
  const P* dy_row = reinterpret_cast<const P*>(dy + row * N);
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < n_packs) {
      copy_async(x_stage + p, x_row + p);
      copy_async(dy_stage + p, dy_row + p);
    }
  }
  copy_async_commit();
}

// Register path, persistent grid. Each thread holds its PACKS packs of x and dy of the current
// row in registers; the next row's are copied into shared memory (cp.async) while this one is
// reduced and written, so the SM keeps loads in flight through the reductions without holding a
// second row in registers. Each thread copies and reads back only its own packs, so the stage
// needs no __syncthreads. When sums are wanted, each row slot (threadIdx.y) adds dy * x_hat and
// dy for the columns it owns (the same ones in every row) into shared memory; at the end the
// block folds its row slots and writes one row of fp32 partials per sum, [gridDim.x, n_sums, N]
// (dweight first), summed by sum_partials_kernel.
template <typename T, int VEC, int PACKS, bool RMS>
__global__ void __launch_bounds__(512, 1) norm_backward_kernel(
    const T* __restrict__ dy,        // [M, N]
    const T* __restrict__ x,         // [M, N]
    const T* __restrict__ weight,    // [N] or nullptr
    const float* __restrict__ mean,  // [M] (LayerNorm only)
    const float* __restrict__ rstd,  // [M]
    T* __restrict__ dx,              // [M, N]
    float* __restrict__ partials,    // [gridDim.x, n_sums, N] or nullptr
    bool sum_dw, bool sum_db, int64_t M, int N,
    float inv_n) {  // 1 / N, as for norm_forward_kernel
  using P = Pack<T, VEC>;
  // [n_sums][blockDim.y][N] floats of sums, then [blockDim.y][2][N] T of staged x and dy
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int n_packs = N / VEC;
  const int n_sums = (int)sum_dw + (int)sum_db;
  float* acc_dw = sum_dw ? smem + (size_t)threadIdx.y * N : nullptr;
  float* acc_db = sum_db ? smem + ((size_t)(sum_dw ? blockDim.y : 0) + threadIdx.y) * N : nullptr;
  P* x_stage =
      reinterpret_cast<P*>(smem + (size_t)n_sums * blockDim.y * N) + (size_t)threadIdx.y * 2 * n_packs;
  P* dy_stage = x_stage + n_packs;
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < n_packs) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (acc_dw != nullptr) smem_at<VEC>(acc_dw, n_packs, p, j) = 0.0f;
        if (acc_db != nullptr) smem_at<VEC>(acc_db, n_packs, p, j) = 0.0f;
      }
    }
  }
  const int64_t stride = (int64_t)gridDim.x * blockDim.y;
  int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  int turn = 0;  // row_allreduce's calls
  float mu = 0.0f, rs = 0.0f;
  if (row < M) {
    stage_row<T, VEC, PACKS>(dy, x, row, N, x_stage, dy_stage);
    mu = RMS ? 0.0f : mean[row];
    rs = rstd[row];
  }
  // Every thread runs the same number of iterations (rows past M are masked), in step for the
  // block-wide reductions.
  for (int64_t first = (int64_t)blockIdx.x * blockDim.y; first < M; first += stride, row += stride) {
    const bool active = row < M;
    P cx[PACKS], cd[PACKS];
    copy_async_wait();
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) {
        cx[k] = x_stage[p];
        cd[k] = dy_stage[p];
      }
    }
    const bool has_next = row + stride < M;
    float next_mu = 0.0f, next_rs = 0.0f;
    if (has_next) {
      next_mu = RMS ? 0.0f : mean[row + stride];
      next_rs = rstd[row + stride];
    }
    SumPair sums = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) add_row_sums<RMS>(sums, cx[k], cd[k], weight, p, mu);
    }
    // The sum pass has consumed cx and cd, so their shared-memory slots are free to refill.
    if (has_next) stage_row<T, VEC, PACKS>(dy, x, row + stride, N, x_stage, dy_stage);
    const DxTerms terms = dx_terms<RMS>(row_allreduce(sums, turn), rs, inv_n);
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) {
        float xf[VEC], d[VEC], w[VEC], dw[VEC];
        unpack(cx[k], xf);
        unpack(cd[k], d);
        if (weight != nullptr) unpack(P(reinterpret_cast<const P*>(weight)[p]), w);
        P out;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float g = weight != nullptr ? d[j] * w[j] : d[j];
          const float xh = (xf[j] - mu) * rs;
          out.v[j] = from_float<T>(dx_value(g, xh, rs, terms));
          dw[j] = d[j] * (RMS ? round_to<T>(xh) : xh);
        }
        reinterpret_cast<P*>(dx + row * N)[p] = out;
        if (acc_dw != nullptr) smem_add<VEC>(acc_dw, n_packs, p, dw);
        if (acc_db != nullptr) smem_add<VEC>(acc_db, n_packs, p, d);
      }
    }
    mu = next_mu;
    rs = next_rs;
  }
  if (n_sums == 0) return;
  __syncthreads();  // every row slot's sums are complete
  if (threadIdx.y != 0) return;
  // Row slot 0 folds the others into its sums and writes the block's partial row per sum.
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p >= n_packs) continue;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (s >= n_sums) break;
      float* first_slot = smem + (size_t)s * blockDim.y * N;
      float total[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        total[j] = smem_at<VEC>(first_slot, n_packs, p, j);
        for (int y = 1; y < (int)blockDim.y; ++y) {
          total[j] += smem_at<VEC>(first_slot + (size_t)y * N, n_packs, p, j);
        }
      }
      store_floats(partials + ((size_t)blockIdx.x * n_sums + s) * N + (size_t)p * VEC, total);
    }
  }
}

template <int N>
__device__ __forceinline__ void copy_async_wait_newest() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Pipelined path (rows of up to 4 packs a thread, at most 512 threads), persistent grid. The
// dweight / dbias sums stay in fp32 registers (at 4 packs, 128 registers a thread, no spill but in
// fp16), the weight's packs are loaded once, and x and dy rows go through a two-slot shared-memory
// ring: at the top of each row the next row's copy (cp.async) goes into the slot read during the
// previous row, so a load is always in flight, also through the row's reduction and its dx pass.
// The dx pass reads x and dy from the slot again (the reduction's barrier comes between), which
// keeps fewer registers live than holding both packs. At the end the block adds its row slots' sums
// through shared memory and writes one row of fp32 partials per sum, [gridDim.x, n_sums, N], as
// the held path does. LayerNorm, H200, bf16, 2026-11-24: 198 / 204 / 210 / 205 µs at 131072x1024,
// 32768x4096, 16384x8192 and 8192x16384 (at 16384 wide, norm_backward_kernel took 248). Slower:
// a third ring slot (3-27 µs); loading the weight's packs at each use instead of holding them (54 µs
// at 16384 wide); writing the partials one float at a time instead of float4s (8 µs at 8192 wide,
// 17 at 16384).
template <typename T, int VEC, int PACKS, bool RMS>
__global__ void __launch_bounds__(512, 1) norm_backward_pipelined_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
    const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
    float* __restrict__ partials,  // [gridDim.x, n_sums, N] or nullptr
    bool sum_dw, bool sum_db, int64_t M, int N,
    float inv_n) {  // 1 / N, as for norm_forward_kernel
  using P = Pack<T, VEC>;
  // [2 ring slots][blockDim.y][2][n_packs] packs: x then dy of each row slot's staged row
  extern __shared__ float4 smem4[];
  const int n_packs = N / VEC;
  P* ring = reinterpret_cast<P*>(smem4);
  auto slot = [&](int s) { return ring + ((size_t)s * blockDim.y + threadIdx.y) * 2 * n_packs; };
  P w_packs[PACKS];
  float dw[PACKS][VEC], db[PACKS][VEC];
#pragma unroll
  for (int k = 0; k < PACKS; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (weight != nullptr && p < n_packs) w_packs[k] = reinterpret_cast<const P*>(weight)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dw[k][j] = 0.0f;
      db[k][j] = 0.0f;
    }
  }
  const int64_t stride = (int64_t)gridDim.x * blockDim.y;
  const int64_t first = (int64_t)blockIdx.x * blockDim.y;
  // Every thread runs the same number of iterations (rows past M are masked), in step for the
  // block-wide reductions.
  const int64_t iterations = first < M ? (M - first + stride - 1) / stride : 0;
  int64_t row = first + threadIdx.y;
  float mu = 0.0f, rs = 0.0f;
  if (row < M) {
    stage_row<T, VEC, PACKS>(dy, x, row, N, slot(0), slot(0) + n_packs);
    mu = RMS ? 0.0f : mean[row];
    rs = rstd[row];
  } else {
    copy_async_commit();
  }
  int turn = 0;  // row_allreduce's calls
  for (int64_t i = 0; i < iterations; ++i, row += stride) {
    const bool active = row < M;
    const bool has_next = row + stride < M;
    const int next = (int)((i + 1) & 1);
    // The next row goes into the slot this thread read during the previous row: those reads fed
    // that row's dx stores, so they are complete.
    if (has_next) stage_row<T, VEC, PACKS>(dy, x, row + stride, N, slot(next), slot(next) + n_packs);
    else copy_async_commit();  // an empty group keeps the count the wait below relies on
    float next_mu = 0.0f, next_rs = 0.0f;
    if (has_next) {
      next_mu = RMS ? 0.0f : mean[row + stride];
      next_rs = rstd[row + stride];
    }
    copy_async_wait_newest<1>();  // this row's group is complete; the next row's may be in flight
    const P* x_stage = slot((int)(i & 1));
    const P* dy_stage = x_stage + n_packs;
    SumPair sums = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) {
        add_row_sums<RMS>(sums, P(x_stage[p]), P(dy_stage[p]), weight != nullptr ? &w_packs[k] : nullptr, mu);
      }
    }
    const DxTerms terms = dx_terms<RMS>(row_allreduce(sums, turn), rs, inv_n);
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (active && p < n_packs) {
        float xf[VEC], d[VEC], w[VEC];
        unpack(P(x_stage[p]), xf);
        unpack(P(dy_stage[p]), d);
        if (weight != nullptr) unpack(w_packs[k], w);
        P out;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (xf[j] - mu) * rs;
          out.v[j] = from_float<T>(dx_value(weight != nullptr ? d[j] * w[j] : d[j], xh, rs, terms));
          dw[k][j] += d[j] * (RMS ? round_to<T>(xh) : xh);
          db[k][j] += d[j];
        }
        reinterpret_cast<P*>(dx + row * N)[p] = out;
      }
    }
    mu = next_mu;
    rs = next_rs;
  }
  copy_async_wait_newest<0>();
  // Row slot 0 adds the other row slots' sums, which come through the ring's shared memory
  // ([blockDim.y - 1][N] floats fit in it: 2 * 2 * sizeof(T) >= sizeof(float) bytes per element and
  // slot), and writes the block's partial row of each sum, a pack's VEC columns at a time.
  float* fold = reinterpret_cast<float*>(smem4);
  const int n_sums = (int)sum_dw + (int)sum_db;
  auto write_partial = [&](float (&acc)[PACKS][VEC], int s) {
    if (blockDim.y > 1) {
      __syncthreads();  // the ring, or the previous sum's fold, is no longer read
#pragma unroll
      for (int k = 0; k < PACKS; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (threadIdx.y > 0 && p < n_packs) {
          store_floats(fold + (threadIdx.y - 1) * (size_t)N + p * VEC, acc[k]);
        }
      }
      __syncthreads();
    }
    if (threadIdx.y != 0) return;
    float* out = partials + ((size_t)blockIdx.x * n_sums + s) * N;
#pragma unroll
    for (int k = 0; k < PACKS; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p >= n_packs) continue;
      for (int y = 1; y < (int)blockDim.y; ++y) add_floats(acc[k], fold + (y - 1) * (size_t)N + p * VEC);
      store_floats(out + (size_t)p * VEC, acc[k]);
    }
  };
  if (sum_dw) write_partial(dw, 0);
  if (sum_db) write_partial(db, (int)sum_dw);
}

// Looped path for rows too wide to hold: one row per block; the second read of dy and x comes
// from L2 (this block read the same row a moment ago).
template <typename T, int VEC, bool RMS>
__global__ void __launch_bounds__(512) norm_backward_dx_looped_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
    const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx, int64_t M, int N,
    float inv_n) {  // 1 / N, as for norm_forward_kernel
  using P = Pack<T, VEC>;
  const int n_packs = N / VEC;
  int turn = 0;  // row_allreduce's calls
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const float mu = RMS ? 0.0f : mean[row];
    const float rs = rstd[row];
    const P* x_row = reinterpret_cast<const P*>(x + row * N);
    const P* dy_row = reinterpret_cast<const P*>(dy + row * N);
    SumPair sums = {0.0f, 0.0f};
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      add_row_sums<RMS>(sums, P(x_row[p]), P(dy_row[p]), weight, p, mu);
    }
    const DxTerms terms = dx_terms<RMS>(row_allreduce(sums, turn), rs, inv_n);
    for (int p = threadIdx.x; p < n_packs; p += blockDim.x) {
      float xf[VEC], g[VEC];
      unpack(P(x_row[p]), xf);
      unpack(P(dy_row[p]), g);
      if (weight != nullptr) scale_by(g, P(reinterpret_cast<const P*>(weight)[p]));
      P out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(dx_value(g[j], (xf[j] - mu) * rs, rs, terms));
      reinterpret_cast<P*>(dx + row * N)[p] = out;
    }
  }
}

// Weight and bias gradients on the looped path (or where the held path's shared-memory sums would
// not fit): a second pass over dy and x. blockIdx.x picks a tile of column packs (one pack per
// thread, so a warp reads 512 contiguous bytes per row), blockIdx.y strides over rows; each thread
// keeps its VEC sums in fp32 registers and writes them as partial row blockIdx.y,
// [gridDim.y, n_sums, N], summed by sum_partials_kernel.
template <typename T, int VEC, bool RMS>
__global__ void __launch_bounds__(256) norm_backward_dwdb_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, float* __restrict__ partials, bool sum_dw, bool sum_db, int64_t M,
    int N) {
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
    float d[VEC], xf[VEC];
    unpack(P(reinterpret_cast<const P*>(dy + row * N)[p]), d);
    unpack(P(reinterpret_cast<const P*>(x + row * N)[p]), xf);
    const float mu = RMS ? 0.0f : mean[row];
    const float rs = rstd[row];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xh = (xf[j] - mu) * rs;
      db[j] += d[j];
      dw[j] += d[j] * (RMS ? round_to<T>(xh) : xh);
    }
  }
  const int n_sums = (int)sum_dw + (int)sum_db;
  float* out = partials + (size_t)blockIdx.y * n_sums * N + (size_t)p * VEC;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (sum_dw) out[j] = dw[j];
    if (sum_db) out[(sum_dw ? N : 0) + j] = db[j];
  }
}

// Sums the [P, n_sums, N] fp32 partials over P in a fixed order (deterministic) and stores sum s
// in T to out[s]. Block: 32 columns x 8 row strides, folded in shared memory.
template <typename T>
__global__ void __launch_bounds__(256) sum_partials_kernel(const float* __restrict__ partials,
                                                            T* __restrict__ out0, T* __restrict__ out1,
                                                            int P, int n_sums, int N) {
  __shared__ float tile[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int s = blockIdx.y;
  float total = 0.0f;
  if (col < N) {
#pragma unroll 4
    for (int p = threadIdx.y; p < P; p += 8) total += partials[((size_t)p * n_sums + s) * N + col];
  }
  tile[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += tile[i][threadIdx.x];
    (s == 0 ? out0 : out1)[col] = from_float<T>(sum);
  }
}

}  // namespace fused_layers
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
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

struct DeviceInfo {
  int sms = 0;
  int max_smem_optin = 0;  // bytes of shared memory a block may opt in to
};

// Looked up once per device and process: attribute queries cost host time on every call. `device`
// is the tensors' device index, read from a tensor (not cudaGetDevice: host time on every call).
// Kept to c10 headers (no ATen/cuda/CUDAContext.h, which pulls in cuBLAS/cuSPARSE headers), so the
// host code also compiles in a syntax check against torch's headers on a machine without them.
const DeviceInfo& device_info(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<DeviceInfo, kMaxDevices> info;
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "fused_layers.cuda: device index ", device,
              " out of range");
  std::call_once(once[device], [device] {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&info[device].sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&info[device].max_smem_optin,
                                          cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  });
  return info[device];
}

// ---- GELU ------------------------------------------------------------------------------------

// 256 threads x 8 resident blocks fill an SM's 2048 thread slots; more blocks than that only
// add scheduling work, the grid-stride loop covers the rest.
template <typename T, int VEC>
void launch_gelu(const torch::Tensor* dy, const torch::Tensor& x, torch::Tensor& out, bool tanh_approx) {
  const int64_t n = x.numel();
  const int threads = 256;
  const int64_t packs = std::max<int64_t>(n / VEC, 1);
  const int device = x.get_device();
  const int64_t max_blocks = (int64_t)device_info(device).sms * 8;
  const int blocks = (int)std::min<int64_t>((packs + threads - 1) / threads, max_blocks);
  auto stream = c10::cuda::getCurrentCUDAStream(device);
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
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
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

// ---- LayerNorm and RMSNorm ---------------------------------------------------------------------

// How a row is spread over threads: threads_per_row (a multiple of 32), rows_per_block, and how
// many packs each thread keeps in registers (0: the looped kernels).
struct RowPlan {
  int threads_per_row;
  int rows_per_block;
  int packs;
};

// About max_packs packs (4: 64 bytes) per thread, the fewest threads that hold the row that way;
// rows of one warp or a few warps share a block of at least min_block_threads. Rows needing more
// than max_threads threads get packs = 0 (the looped kernels, or another plan).
RowPlan plan_rows(int n_packs, int max_threads, int min_block_threads, int max_packs = 4) {
  const int threads = std::max(32, ((n_packs + max_packs - 1) / max_packs + 31) / 32 * 32);
  if (threads > max_threads) return {max_threads, 1, 0};
  const int per_thread = (n_packs + threads - 1) / threads;  // 1 .. max_packs
  return {threads, std::max(1, min_block_threads / threads), per_thread <= 2 ? per_thread : 4};
}

int row_groups(int64_t M, const RowPlan& plan) {
  return (int)std::min<int64_t>((M + plan.rows_per_block - 1) / plan.rows_per_block, 1 << 30);
}

template <typename T, int VEC, bool RMS>
void launch_norm_forward(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                         const std::optional<torch::Tensor>& bias, torch::Tensor& y, float* mean, float* rstd,
                         int64_t M, int N, float eps) {
  const RowPlan plan = plan_rows(N / VEC, 1024, 128);
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  const int grid = plan.packs > 0 ? row_groups(M, plan) : (int)std::min<int64_t>(M, 1 << 30);
  auto stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  const T* w = data_or_null<T>(weight);
  const T* b = data_or_null<T>(bias);
#define FL_NORM_FWD(...) \
  __VA_ARGS__<<<grid, block, 0, stream>>>(data<T>(x), w, b, data<T>(y), mean, rstd, M, N, eps, 1.0f / N)
  switch (plan.packs) {
    case 1: FL_NORM_FWD(norm_forward_kernel<T, VEC, 1, RMS>); break;
    case 2: FL_NORM_FWD(norm_forward_kernel<T, VEC, 2, RMS>); break;
    case 4: FL_NORM_FWD(norm_forward_kernel<T, VEC, 4, RMS>); break;
    default: FL_NORM_FWD(norm_forward_looped_kernel<T, VEC, RMS>); break;
  }
#undef FL_NORM_FWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Resident warps per SM the persistent backward aims at: enough loads in flight with each thread
// prefetching its next row, and few partial rows to sum.
constexpr int kBackwardWarpsPerSm = 16;

// Blocks for a persistent launch: kBackwardWarpsPerSm worth per SM (fewer if they do not fit),
// at most `needed`. Occupancy is looked up once per kernel, block shape and shared memory size.
template <typename Kernel>
int persistent_blocks(Kernel kernel, int threads, size_t smem_bytes, int needed, int device) {
  static std::mutex lock;
  static std::map<std::tuple<const void*, int, size_t, int>, int> per_sm_cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, smem_bytes, device);
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> guard(lock);
    auto found = per_sm_cache.find(key);
    if (found != per_sm_cache.end()) {
      per_sm = found->second;
    } else {
      // The kernel may take all the dynamic shared memory the device allows beside its static
      // buffers: one setting per kernel, whatever size each launch asks for.
      cudaFuncAttributes attributes;
      C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
      const int dynamic_max = device_info(device).max_smem_optin - (int)attributes.sharedSizeBytes;
      C10_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_max));
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
      TORCH_CHECK(per_sm > 0, "fused_layers.cuda: the norm backward does not fit on an SM (", threads,
                  " threads, ", smem_bytes, " bytes of shared memory)");
      per_sm = std::min(per_sm, std::max(1, kBackwardWarpsPerSm * 32 / threads));
      per_sm_cache.emplace(key, per_sm);
    }
  }
  return std::max(1, std::min(needed, per_sm * device_info(device).sms));
}

// Writes dx, and dweight / dbias (in T) where they are defined tensors. mean is nullptr for RMSNorm.
template <typename T, int VEC, bool RMS>
void launch_norm_backward(const torch::Tensor& dy, const torch::Tensor& x,
                          const std::optional<torch::Tensor>& weight, const float* mean_ptr,
                          const float* rstd_ptr, torch::Tensor& dx, torch::Tensor& dweight,
                          torch::Tensor& dbias, int64_t M, int N) {
  const bool sum_dw = dweight.defined();
  const bool sum_db = dbias.defined();
  const int n_sums = (int)sum_dw + (int)sum_db;
  const int device = x.get_device();
  const DeviceInfo& info = device_info(device);
  const size_t static_smem = 1024;  // row_allreduce's partials, with room to spare
  const size_t smem_limit = (size_t)info.max_smem_optin - static_smem;
  // Pipelined: 2 packs a thread (4 for rows that 512 threads cannot cover with 2, except in fp16,
  // where 4 packs spill), 512 threads at most; the ring's two slots of x and dy per row.
  RowPlan piped = plan_rows(N / VEC, 512, 256, 2);
  if (piped.packs == 0 && !std::is_same_v<T, __half>) piped = plan_rows(N / VEC, 512, 256, 4);
  const size_t piped_smem = (size_t)2 * piped.rows_per_block * 2 * N * sizeof(T);
  const bool pipelined = piped.packs > 0 && piped_smem <= smem_limit;
  // Held (fp16 rows of over 1024 packs, or where the ring does not fit): 4 packs a thread, 512
  // threads at most (128 registers each); the sums, then the next rows of x and dy staged.
  const RowPlan plan = plan_rows(N / VEC, 512, 256);
  const size_t smem = (size_t)plan.rows_per_block * N * (n_sums * sizeof(float) + 2 * sizeof(T));
  const bool held = plan.packs > 0 && smem <= smem_limit;
  auto stream = c10::cuda::getCurrentCUDAStream(device);
  auto f32 = x.options().dtype(at::kFloat);
  const T* w = data_or_null<T>(weight);
  torch::Tensor partials;
  int n_partials = 0;
  // Both persistent kernels take the same arguments: grid, partials and launch on plan p with
  // `bytes` of dynamic shared memory.
  auto launch_persistent = [&](auto kernel, const RowPlan& p, size_t bytes) {
    n_partials =
        persistent_blocks(kernel, p.threads_per_row * p.rows_per_block, bytes, row_groups(M, p), device);
    if (n_sums > 0) partials = at::empty({n_partials, n_sums, N}, f32);
    kernel<<<n_partials, dim3(p.threads_per_row, p.rows_per_block), bytes, stream>>>(
        data<T>(dy), data<T>(x), w, mean_ptr, rstd_ptr, data<T>(dx),
        n_sums > 0 ? data<float>(partials) : nullptr, sum_dw, sum_db, M, N, 1.0f / N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (pipelined) {
    switch (piped.packs) {
      case 1: launch_persistent(norm_backward_pipelined_kernel<T, VEC, 1, RMS>, piped, piped_smem); break;
      case 2: launch_persistent(norm_backward_pipelined_kernel<T, VEC, 2, RMS>, piped, piped_smem); break;
      default:
        if constexpr (!std::is_same_v<T, __half>) {
          launch_persistent(norm_backward_pipelined_kernel<T, VEC, 4, RMS>, piped, piped_smem);
        }
        break;
    }
  } else if (held) {
    switch (plan.packs) {
      case 1: launch_persistent(norm_backward_kernel<T, VEC, 1, RMS>, plan, smem); break;
      case 2: launch_persistent(norm_backward_kernel<T, VEC, 2, RMS>, plan, smem); break;
      default: launch_persistent(norm_backward_kernel<T, VEC, 4, RMS>, plan, smem); break;
    }
  } else {
    const int grid = (int)std::min<int64_t>(M, (int64_t)info.sms * 4);
    norm_backward_dx_looped_kernel<T, VEC, RMS><<<grid, plan.threads_per_row, 0, stream>>>(
        data<T>(dy), data<T>(x), w, mean_ptr, rstd_ptr, data<T>(dx), M, N, 1.0f / N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (n_sums > 0) {
      // Column tiles x row chunks: about 4 waves of blocks on the SMs, each chunk >= 8 rows.
      const int col_threads = 256;
      const int64_t col_tiles = (N / VEC + col_threads - 1) / col_threads;
      const int64_t wanted = std::max<int64_t>(1, 4 * info.sms / col_tiles);
      n_partials = (int)std::max<int64_t>(1, std::min<int64_t>({wanted, (M + 7) / 8, 1024}));
      partials = at::empty({n_partials, n_sums, N}, f32);
      const dim3 grid2((unsigned)col_tiles, n_partials);
      norm_backward_dwdb_kernel<T, VEC, RMS><<<grid2, col_threads, 0, stream>>>(
          data<T>(dy), data<T>(x), mean_ptr, rstd_ptr, data<float>(partials), sum_dw, sum_db, M, N);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  if (n_sums > 0) {
    T* first = sum_dw ? data<T>(dweight) : data<T>(dbias);
    T* second = sum_dw && sum_db ? data<T>(dbias) : nullptr;
    const dim3 grid3((unsigned)((N + 31) / 32), n_sums);
    sum_partials_kernel<T><<<grid3, dim3(32, 8), 0, stream>>>(data<float>(partials), first, second,
                                                             n_partials, n_sums, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// True when every pointer is 16-byte aligned and N splits into 16-byte packs.
template <typename T>
bool can_vectorize(int64_t N, std::initializer_list<const void*> pointers) {
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

// x contiguous, of any shape with at least one dimension; returns {y (x's shape), stats}: stats is
// fp32 [2, rows] (mean, then rstd) for LayerNorm and [rows] (rstd) for RMSNorm, one allocation
// rather than two (each allocation is host time on every call).
std::vector<torch::Tensor> norm_forward_impl(const torch::Tensor& x,
                                             const std::optional<torch::Tensor>& weight,
                                             const std::optional<torch::Tensor>& bias, double eps, bool rms) {
  check_input(x, x, "x");
  TORCH_CHECK(x.dim() >= 1, "fused_layers.cuda: norms need at least one dimension");
  const int64_t N = x.size(-1);
  TORCH_CHECK(N > 0 && N <= INT32_MAX, "fused_layers.cuda: the normalised width must be in [1, 2^31)");
  const int64_t M = x.numel() / N;
  check_affine(weight, x, N, "weight");
  TORCH_CHECK(!(rms && bias.has_value()), "fused_layers.cuda: rms_norm takes no bias");
  check_affine(bias, x, N, "bias");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto f32 = x.options().dtype(at::kFloat);
  auto y = at::empty(x.sizes(), x.options());
  auto stats = rms ? at::empty({M}, f32) : at::empty({2, M}, f32);
  if (M == 0) return {y, stats};
  float* mean = rms ? nullptr : data<float>(stats);
  float* rstd = data<float>(stats) + (rms ? 0 : M);
  dispatch_dtype(x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int VEC = 16 / sizeof(T);
    const bool vec_ok =
        can_vectorize<T>(N, {x.data_ptr(), y.data_ptr(), data_or_null<T>(weight), data_or_null<T>(bias)});
    const int n = (int)N;
    const float e = (float)eps;
    if (rms) {
      if (vec_ok) launch_norm_forward<T, VEC, true>(x, weight, bias, y, mean, rstd, M, n, e);
      else launch_norm_forward<T, 1, true>(x, weight, bias, y, mean, rstd, M, n, e);
    } else {
      if (vec_ok) launch_norm_forward<T, VEC, false>(x, weight, bias, y, mean, rstd, M, n, e);
      else launch_norm_forward<T, 1, false>(x, weight, bias, y, mean, rstd, M, n, e);
    }
  });
  return {y, stats};
}

// grad_output and x contiguous, of one shape; stats holds x's rows' fp32 statistics as
// norm_forward_impl returns them. Returns {dx, dweight, dbias}, the gradients in x's dtype, an
// undefined tensor for one not asked for.
std::vector<torch::Tensor> norm_backward_impl(const torch::Tensor& grad_output, const torch::Tensor& x,
                                              const std::optional<torch::Tensor>& weight,
                                              const torch::Tensor& stats, bool need_dweight, bool need_dbias,
                                              bool rms) {
  check_input(x, x, "x");
  check_input(grad_output, x, "grad_output");
  TORCH_CHECK(x.dim() >= 1 && grad_output.sizes() == x.sizes(),
              "fused_layers.cuda: norm backward expects grad_output and x of one shape");
  const int64_t N = x.size(-1);
  const int64_t M = N > 0 ? x.numel() / N : 0;
  const float* mean = rms ? nullptr : data<float>(stats);
  const float* rstd = data<float>(stats) + (rms ? 0 : M);
  check_affine(weight, x, N, "weight");
  TORCH_CHECK(!(need_dweight && !weight.has_value()), "fused_layers.cuda: no weight to differentiate");
  TORCH_CHECK(!(rms && need_dbias), "fused_layers.cuda: rms_norm has no bias");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto dx = at::empty(x.sizes(), x.options());
  torch::Tensor dweight = need_dweight ? at::empty({N}, x.options()) : torch::Tensor();
  torch::Tensor dbias = need_dbias ? at::empty({N}, x.options()) : torch::Tensor();
  if (M == 0) {
    if (need_dweight) dweight.zero_();
    if (need_dbias) dbias.zero_();
  } else {
    dispatch_dtype(x, [&](auto tag) {
      using T = typename decltype(tag)::type;
      constexpr int VEC = 16 / sizeof(T);
      const bool vec_ok =
          can_vectorize<T>(N, {x.data_ptr(), grad_output.data_ptr(), dx.data_ptr(), data_or_null<T>(weight)});
      const int n = (int)N;
#define FL_NORM_BWD_CALL(V, R) \
  launch_norm_backward<T, V, R>(grad_output, x, weight, mean, rstd, dx, dweight, dbias, M, n)
      if (rms) {
        if (vec_ok) FL_NORM_BWD_CALL(VEC, true);
        else FL_NORM_BWD_CALL(1, true);
      } else {
        if (vec_ok) FL_NORM_BWD_CALL(VEC, false);
        else FL_NORM_BWD_CALL(1, false);
      }
#undef FL_NORM_BWD_CALL
    });
  }
  return {dx, dweight, dbias};
}

// An autograd node is held by std::shared_ptr up to torch 2.12 and by c10::intrusive_ptr from 2.13.
template <typename N>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) return c10::make_intrusive<N>();
  else return std::make_shared<N>();
}

// The eager call's backward node, built the way torch's generated nodes are (saved variables, next
// edges to x, weight and bias, the output's history): no torch::autograd::Function, whose
// bookkeeping (input and output records, a context, a locked apply) is host time on every call.
// Not supported, as for a node without compiled_args: compiled autograd (traced calls take the
// custom ops instead), and double backward (the gradients carry no history).
struct NormBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable x_;  // contiguous
  torch::autograd::SavedVariable weight_;  // default-constructed when there is no weight
  torch::autograd::SavedVariable stats_;  // see norm_forward_impl
  bool rms_ = false;
  bool has_bias_ = false;

  std::string name() const override {
    return rms_ ? "fused_layers::RMSNormBackward" : "fused_layers::LayerNormBackward";
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    weight_.reset_data();
    stats_.reset_data();
  }

  // Next edges 0, 1, 2: x, weight, bias (an edge that is not valid where there is no parameter or it
  // needs no gradient); returns their gradients in that order.
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const torch::Tensor x = x_.unpack();
    const torch::Tensor weight = weight_.unpack();
    const torch::Tensor stats = stats_.unpack();
    std::optional<torch::Tensor> weight_opt;
    if (weight.defined()) weight_opt = weight;
    const bool need_dweight = weight.defined() && task_should_compute_output(1);
    const bool need_dbias = has_bias_ && task_should_compute_output(2);
    std::vector<torch::Tensor> g =
        norm_backward_impl(grads[0].contiguous(), x, weight_opt, stats, need_dweight, need_dbias, rms_);
    return {g[0], g[1], g[2]};
  }
};

// y, recording a NormBackward node when `track` (autograd tracks the call: compute_requires_grad of
// x, weight and bias). Checks as norm_forward_impl.
torch::Tensor norm_with_node(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                             const std::optional<torch::Tensor>& bias, double eps, bool rms, bool track) {
  namespace ag = torch::autograd;
  torch::Tensor input;
  std::vector<torch::Tensor> out;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a contiguous copy records no history
    input = x.contiguous();
    out = norm_forward_impl(input, weight, bias, eps, rms);
  }
  if (track) {
    auto node = make_node<NormBackward>();
    node->set_next_edges(ag::collect_next_edges(x, weight, bias));
    node->x_ = ag::SavedVariable(input, false);
    if (weight.has_value()) node->weight_ = ag::SavedVariable(*weight, false);
    node->stats_ = ag::SavedVariable(out[1], false);
    node->rms_ = rms;
    node->has_bias_ = bias.has_value();
    ag::set_history(out[0], node);
  }
  return out[0];
}

// Whether a tensor can go to the kernels as it is: strided, on a CUDA device, a plain tensor (not a
// Python subclass or fake tensor, not wrapped by vmap, functionalization or a grad transform).
bool plain_cuda(const torch::Tensor& t) {
  using c10::DispatchKey;
  static const c10::DispatchKeySet wrapped({DispatchKey::Python, DispatchKey::PythonTLSSnapshot,
                                            DispatchKey::Functionalize, DispatchKey::FuncTorchBatched,
                                            DispatchKey::BatchedNestedTensor,
                                            DispatchKey::FuncTorchGradWrapper});
  return t.is_cuda() && t.layout() == at::kStrided && !t.key_set().has_any(wrapped);
}

// A parameter that needs no cast and can fail no check: absent, or (N,) of x's dtype on x's device.
bool direct_param(const std::optional<torch::Tensor>& p, const torch::Tensor& x, int64_t N) {
  if (!p.has_value()) return true;
  return plain_cuda(*p) && p->scalar_type() == x.scalar_type() && p->device() == x.device() &&
         p->dim() == 1 && p->size(0) == N;
}

}  // namespace fused_layers

// ---- Entry points bound by load_inline (global names, declared in DECLARATIONS) ---------------
using namespace fused_layers;

torch::Tensor gelu_forward(torch::Tensor x, bool tanh_approx) { return gelu_impl(nullptr, x, tanh_approx); }

torch::Tensor gelu_backward(torch::Tensor grad_output, torch::Tensor x, bool tanh_approx) {
  return gelu_impl(&grad_output, x, tanh_approx);
}

// {y, stats} (see norm_forward_impl): the traced path's forward.
std::vector<torch::Tensor> norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                        std::optional<torch::Tensor> bias, double eps, bool rms) {
  return norm_forward_impl(x.contiguous(), weight, bias, eps, rms);
}

// {dx, dweight, dbias}, each (0,) when not asked for: the traced path's backward. stats as
// norm_forward returns them.
std::vector<torch::Tensor> norm_backward(torch::Tensor grad_output, torch::Tensor x,
                                         std::optional<torch::Tensor> weight, torch::Tensor stats,
                                         bool need_dweight, bool need_dbias, bool rms) {
  const int64_t rows = x.dim() >= 1 && x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
  TORCH_CHECK(stats.device() == x.device() && stats.scalar_type() == at::kFloat && stats.is_contiguous() &&
                  stats.numel() == (rms ? 1 : 2) * rows,
              "fused_layers.cuda: stats must be a contiguous float32 tensor of ", (rms ? 1 : 2) * rows,
              " elements on x's device, as norm_forward returns it");
  std::vector<torch::Tensor> g = norm_backward_impl(grad_output.contiguous(), x.contiguous(), weight, stats,
                                                    need_dweight, need_dbias, rms);
  for (torch::Tensor& t : g) {
    if (!t.defined()) t = torch::empty({0}, x.options());
  }
  return g;
}

torch::Tensor norm_autograd(torch::Tensor x, std::optional<torch::Tensor> weight,
                            std::optional<torch::Tensor> bias, double eps, bool rms) {
  return norm_with_node(x, weight, bias, eps, rms, torch::autograd::compute_requires_grad(x, weight, bias));
}

// fused_layers.ops' fast path (see fused_layers.cuda.eager_norm): norm_autograd's result where the
// call needs no Python (no cast, no error to raise, no tracing), else None. only_differentiated:
// None also where autograd does not track the call (the default backend sends those to Triton).
std::optional<torch::Tensor> norm_eager(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                                        const std::optional<torch::Tensor>& bias, double eps, bool rms,
                                        bool only_differentiated) {
  const at::ScalarType dtype = x.scalar_type();
  const bool supported = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
  if (!supported || !plain_cuda(x) || x.dim() < 1 || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return std::nullopt;
  }
  const int64_t N = x.size(-1);
  if (N < 1 || !direct_param(weight, x, N) || !direct_param(bias, x, N) || (rms && bias.has_value())) {
    return std::nullopt;
  }
  const bool track = torch::autograd::compute_requires_grad(x, weight, bias);
  if (only_differentiated && !track) return std::nullopt;
  return norm_with_node(x, weight, bias, eps, rms, track);
}
"""

# Declarations for load_inline's generated pybind11 module (it binds ``FUNCTIONS`` by name).
DECLARATIONS = r"""
#include <torch/extension.h>
#include <optional>
#include <vector>
torch::Tensor gelu_forward(torch::Tensor x, bool tanh_approx);
torch::Tensor gelu_backward(torch::Tensor grad_output, torch::Tensor x, bool tanh_approx);
std::vector<torch::Tensor> norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                        std::optional<torch::Tensor> bias, double eps, bool rms);
std::vector<torch::Tensor> norm_backward(torch::Tensor grad_output, torch::Tensor x,
                                         std::optional<torch::Tensor> weight, torch::Tensor stats,
                                         bool need_dweight, bool need_dbias, bool rms);
torch::Tensor norm_autograd(torch::Tensor x, std::optional<torch::Tensor> weight,
                            std::optional<torch::Tensor> bias, double eps, bool rms);
std::optional<torch::Tensor> norm_eager(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                                        const std::optional<torch::Tensor>& bias, double eps, bool rms,
                                        bool only_differentiated);
"""

FUNCTIONS = ("gelu_forward", "gelu_backward", "norm_forward", "norm_backward", "norm_autograd", "norm_eager")

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
            for rms in ("false", "true"):
                for packs in (1, 2, 4):
                    kernels.append(f"norm_forward_kernel<{t}, {v}, {packs}, {rms}>")
                    kernels.append(f"norm_backward_kernel<{t}, {v}, {packs}, {rms}>")
                kernels.append(f"norm_forward_looped_kernel<{t}, {v}, {rms}>")
                for packs in (1, 2) if t == "__half" else (1, 2, 4):
                    kernels.append(f"norm_backward_pipelined_kernel<{t}, {v}, {packs}, {rms}>")
                kernels.append(f"norm_backward_dx_looped_kernel<{t}, {v}, {rms}>")
                kernels.append(f"norm_backward_dwdb_kernel<{t}, {v}, {rms}>")
        kernels.append(f"sum_partials_kernel<{t}>")
    table = ",\n  ".join(f"(const void*)&fused_layers::{k}" for k in kernels)
    return KERNELS + f"\nconst void* fused_layers_all_kernels[] = {{\n  {table}\n}};\n"
