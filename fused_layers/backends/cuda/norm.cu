// Host side of the CUDA C++ backend: the torch launchers of kernels.cuh, the NormBackward autograd
// node, and the entry points declared in norm.h. Built with torch.utils.cpp_extension.load by
// fused_layers/backends/cuda/build.py.
#include "norm.h"

#include "kernels.cuh"

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

// ---- Entry points (global names; see norm.h) ---------------------------------------------------
using namespace fused_layers;

std::vector<torch::Tensor> norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                        std::optional<torch::Tensor> bias, double eps, bool rms) {
  return norm_forward_impl(x.contiguous(), weight, bias, eps, rms);
}

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
