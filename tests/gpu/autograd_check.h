#pragma once
// Differentiable ops on CUDA against the CPU: a case is an op applied to random inputs;
// run_autograd_case runs it on both devices from the same values and upstream gradient,
// and compares the forward values and every input gradient, in one of kAutogradTypes.
// The test_<stem>_cuda.cpp files list their stem's cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/factory.h"
#include "tests/test_util.h"

namespace frugal::testing {

inline constexpr DType kAutogradTypes[] = {kFloat32, kFloat16, kBFloat16};

/// Tolerance for CUDA vs CPU after a forward and a backward: both round the same
/// intermediates, but in different orders (reductions) and with different libm's.
inline double autograd_cross_tol(DType t) { return t == kFloat32 ? 1e-4 : t == kFloat16 ? 1e-2 : 5e-2; }

inline void check_autograd_same(const Tensor& gpu, const Tensor& cpu, DType dt, double scale, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined(), what);
  REQUIRE_MESSAGE(cpu.defined(), what);
  REQUIRE_MESSAGE(gpu.device().is_cuda(), what);
  REQUIRE_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what);
  const std::vector<double> expected = values_of(cpu);
  double peak = 1.0;
  for (double v : expected)
    if (std::isfinite(v)) peak = std::max(peak, std::fabs(v));
  const double tol = autograd_cross_tol(dt) * scale;
  check_close(values_of(gpu), expected, tol, tol * peak, what);
}

/// One input of a case: a random floating tensor in the case's dtype (requires grad unless
/// `grad` is false), or an int64 index tensor with values in [0, hi).
struct AutogradInput {
  Shape shape;
  double lo = -2.0, hi = 2.0;
  bool grad = true;
  bool index = false;
};

inline AutogradInput grad_input(Shape s, double lo = -2.0, double hi = 2.0) {
  return {std::move(s), lo, hi, true, false};
}
inline AutogradInput const_input(Shape s, double lo = -2.0, double hi = 2.0) {
  return {std::move(s), lo, hi, false, false};
}
inline AutogradInput index_input(Shape s, int64_t n) { return {std::move(s), 0.0, double(n), false, true}; }

struct AutogradCase {
  std::string name;
  std::vector<AutogradInput> inputs;
  std::function<Tensor(const TensorList&)> f;
  double tol_scale = 1.0;
};

inline Tensor make_autograd_input(const AutogradInput& in, DType dt, uint64_t seed, Device device) {
  if (in.index) {
    std::vector<int64_t> v;
    for (double r : random_values(numel_of(in.shape), seed, 0.0, in.hi)) v.push_back(int64_t(r));
    return from_vector(v, in.shape).to(device);
  }
  return random_tensor(in.shape, {dt, device}, seed, Layout::Contiguous, in.lo, in.hi);
}

inline void run_autograd_case(const AutogradCase& c, DType dt) {
  const std::string what = c.name + " " + dtype_name(dt);
  CAPTURE(what);
  TensorList cpu_in, gpu_in;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    cpu_in.push_back(make_autograd_input(c.inputs[k], dt, 100 + k, kCPU));
    gpu_in.push_back(make_autograd_input(c.inputs[k], dt, 100 + k, cuda()));
    if (c.inputs[k].grad) {
      cpu_in.back().requires_grad_();
      gpu_in.back().requires_grad_();
    }
  }
  const Tensor y_cpu = c.f(cpu_in), y_gpu = c.f(gpu_in);
  check_autograd_same(y_gpu, y_cpu, dt, c.tol_scale, what + " forward");
  REQUIRE(y_cpu.requires_grad());
  REQUIRE(y_gpu.requires_grad());
  const Tensor up = random_tensor(y_cpu.sizes(), y_cpu.dtype(), 7);
  y_cpu.backward(up);
  y_gpu.backward(up.to(cuda()));
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    if (!c.inputs[k].grad) continue;
    REQUIRE_MESSAGE(gpu_in[k].grad().dtype() == gpu_in[k].dtype(), what);
    check_autograd_same(gpu_in[k].grad(), cpu_in[k].grad(), dt, c.tol_scale,
                        what + " grad of input " + std::to_string(k));
  }
}

/// Runs every case in every dtype of kAutogradTypes.
inline void run_autograd_cases(const std::vector<AutogradCase>& cases) {
  for (const AutogradCase& c : cases)
    for (DType dt : kAutogradTypes) run_autograd_case(c, dt);
}

}  // namespace frugal::testing
