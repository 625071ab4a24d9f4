// LayerNorm and RMSNorm kernels of the CUDA C++ backend (fused_layers/backends/cuda), and the
// helpers they share. Device code only: it needs <cuda_fp16.h> and <cuda_bf16.h> but no torch
// header, so all_kernels.cu compiles it with plain nvcc (register and spill counts on a machine
// with no GPU and no torch); norm.cu launches it. Every conversion is explicit: torch compiles
// with -D__CUDA_NO_HALF_CONVERSIONS__ and its siblings.
//
// Bandwidth notes (H100/H200, ~3.3-4.8 TB/s): every global access moves 16 bytes per thread where
// the pointers are 16-byte aligned (8 bf16/fp16 or 4 fp32 per access, VEC); a scalar
// instantiation (VEC == 1) covers misaligned views and rows whose width is not a multiple of VEC.
#pragma once

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
