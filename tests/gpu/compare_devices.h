#pragma once
// Ops on CUDA against the CPU through autograd: forward_backward runs an op on fresh leaves
// in one dtype and device, compare_devices runs it on both devices from the same float64
// values and compares the output and every input gradient by max-norm. The conv, pool and
// batch_norm tests (tests/gpu/test_{conv,pool,batch_norm}_cuda.cpp) share them.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "memory/error.h"
#include "tensor/factory.h"
#include "tests/norm_close.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// Max-norm agreement: max |a - e| <= rtol * max |e|. Both backends accumulate in float32
/// (float64 for float64) in different orders and round once, so they differ by about one
/// rounding of the stored type relative to the largest value; cuDNN's float32 algorithms
/// (Winograd, FFT) add a little more.
inline double rtol_for(DType t) {
  switch (t) {
    case DType::Float16: return 4e-3;
    case DType::BFloat16: return 3e-2;
    case DType::Float32: return 5e-5;
    default: return 1e-10;
  }
}

/// check_norm_close, and the dtypes must match too.
inline void check_dtype_norm_close(const Tensor& actual, const Tensor& expected, double rtol, const std::string& what) {
  CHECK_MESSAGE(actual.dtype() == expected.dtype(), what);
  check_norm_close(actual, expected, rtol, what);
}

/// Forward and backward of f on leaves made from `inputs` (on `device`, in dtype t) with
/// output gradient `gy` (float64 values, converted likewise): the output and every input's grad.
template <typename F>
std::vector<Tensor> forward_backward(F&& f, const std::vector<Tensor>& inputs, const Tensor& gy, DType t,
                                     Device device) {
  std::vector<Tensor> leaves;
  for (const Tensor& in : inputs) {
    if (!in.defined()) {
      leaves.emplace_back();
      continue;
    }
    Tensor l = in.detach().to(device, t).clone();  // a fresh leaf, never `in` itself
    l.requires_grad_();
    leaves.push_back(l);
  }
  Tensor y = f(leaves);
  std::vector<Tensor> out = {y.detach()};
  y.backward(gy.to(device, t));
  for (const Tensor& l : leaves) out.push_back(l.defined() ? l.grad() : Tensor());
  return out;
}

/// Runs f on CPU and GPU from the same float64 values in dtype t; compares the output and all grads.
template <typename F>
void compare_devices(F&& f, const std::vector<Tensor>& inputs, const Shape& out_shape, DType t, uint64_t seed,
                     const std::string& what, double rtol_scale = 1.0) {
  const Tensor gy = random_tensor(out_shape, kFloat64, seed);
  const std::vector<Tensor> gpu = forward_backward(f, inputs, gy, t, cuda(0));
  const std::vector<Tensor> cpu = forward_backward(f, inputs, gy, t, kCPU);
  const char* names[] = {"output", "grad 0", "grad 1", "grad 2", "grad 3"};
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!cpu[i].defined()) continue;
    REQUIRE_MESSAGE(gpu[i].defined(), what, " ", names[i]);
    CHECK(gpu[i].device() == cuda(0));
    check_dtype_norm_close(gpu[i], cpu[i], rtol_for(t) * rtol_scale,
                           detail::str_cat(what, " ", dtype_name(t), " ", names[i]));
  }
}

}  // namespace frugal::testing
