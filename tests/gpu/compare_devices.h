#pragma once
// Ops on CUDA against the CPU. A DevicePair holds the same values on both devices and
// check_same compares a CUDA result with the CPU op's elementwise, with the tolerance `tol`
// (the raw ops' tests: tests/gpu/test_{loss,norm,softmax,reduce,...}_cuda.cpp). Through autograd:
// forward_backward runs an op on fresh leaves in one dtype and device, compare_devices runs it
// on both devices from the same float64 values and compares the output and every input gradient
// by max-norm (tests/gpu/test_{conv,pool,batch_norm}_cuda.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/factory.h"
#include "tests/norm_close.h"
#include "tests/test_util.h"

namespace frugal::testing {

inline constexpr Device kGpu = cuda(0);
inline constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};

/// The same values on the CPU and on the GPU (kGpu), in the same layout.
struct DevicePair {
  Tensor cpu, gpu;
};

inline DevicePair on_both(const std::vector<double>& v, const Shape& shape, DType dt,
                          Layout layout = Layout::Contiguous) {
  return {make_tensor(v, shape, dt, layout), make_tensor(v, shape, {dt, kGpu}, layout)};
}

inline DevicePair random_pair(const Shape& shape, DType dt, uint64_t seed, Layout layout = Layout::Contiguous,
                              double lo = -2, double hi = 2) {
  return on_both(random_values(numel_of(shape), seed, lo, hi), shape, dt, layout);
}

inline DevicePair pair_of(const Tensor& cpu) { return {cpu, cpu.to(kGpu)}; }

/// Results computed in float on both sides (the CPU sums in double) agree within a few
/// roundings of the stored type; `scale` widens it for long sums.
inline double tol(DType t, double scale = 1.0) {
  return scale * (t == kFloat32 ? 2e-5 : t == kFloat64 ? 1e-12 : 2 * default_rtol(t));
}

/// A CUDA result against the CPU's: both defined or both not, on kGpu, the same dtype and
/// sizes, and values within atol + rtol * |cpu| (check_close).
inline void check_same(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined() == cpu.defined(), what);
  if (!gpu.defined()) return;
  CHECK_MESSAGE(gpu.device() == kGpu, what);
  CHECK_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what, ": ", shape_str(gpu.sizes()), " vs ", shape_str(cpu.sizes()));
  check_close(gpu, values_of(cpu), rtol, atol, what);
}

/// check_same with rtol = atol = tolerance (copies: 0; sums in another order: a rounding).
inline void check_same(const Tensor& gpu, const Tensor& cpu, double tolerance, const std::string& what) {
  check_same(gpu, cpu, tolerance, tolerance, what);
}

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
