// The CUDA C++ backend's entry points, defined in norm.cu and bound to Python in bindings.cpp.
// LayerNorm (rms = false) and RMSNorm (rms = true) over the last dim of x, in float32, float16 or
// bfloat16; math in fp32, results in x's dtype. Statistics are one fp32 tensor: [2, rows] (mean,
// then rstd) for LayerNorm, [rows] (rstd) for RMSNorm.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

// {y, stats}: the traced path's forward (the custom op fused_layers::cuda_norm).
std::vector<torch::Tensor> norm_forward(torch::Tensor x, std::optional<torch::Tensor> weight,
                                        std::optional<torch::Tensor> bias, double eps, bool rms);

// {dx, dweight, dbias}, each (0,) when not asked for: the traced path's backward
// (fused_layers::cuda_norm_backward). stats as norm_forward returns them.
std::vector<torch::Tensor> norm_backward(torch::Tensor grad_output, torch::Tensor x,
                                         std::optional<torch::Tensor> weight, torch::Tensor stats,
                                         bool need_dweight, bool need_dbias, bool rms);

// y, with a NormBackward autograd node (C++ throughout) where autograd tracks the call.
torch::Tensor norm_autograd(torch::Tensor x, std::optional<torch::Tensor> weight,
                            std::optional<torch::Tensor> bias, double eps, bool rms);

// The ops' fast path (fused_layers.dispatch.eager_norm): norm_autograd's result where the call
// needs no Python (no cast, no error to raise, no tracing), else None. only_differentiated: None
// also where autograd does not track the call (the default backend sends those to Triton).
std::optional<torch::Tensor> norm_eager(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                                        const std::optional<torch::Tensor>& bias, double eps, bool rms,
                                        bool only_differentiated);
