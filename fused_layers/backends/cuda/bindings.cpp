// The Python module of the CUDA C++ backend: binds norm.h's entry points by name. Built by
// fused_layers/backends/cuda/build.py, which sets TORCH_EXTENSION_NAME. wrap_pybind_function turns
// a c10::Error (TORCH_CHECK) into the matching Python exception, with torch's error message.
#include "norm.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_forward", torch::wrap_pybind_function(norm_forward), "norm_forward");
  m.def("norm_backward", torch::wrap_pybind_function(norm_backward), "norm_backward");
  m.def("norm_autograd", torch::wrap_pybind_function(norm_autograd), "norm_autograd");
  m.def("norm_eager", torch::wrap_pybind_function(norm_eager), "norm_eager");
}
