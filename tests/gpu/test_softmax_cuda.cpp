// CUDA softmax and log_softmax against the CPU ops on the same inputs: every dim, dtype and
// layout, long rows (block per row), many short rows (warp per row), long columns, large
// magnitudes, -inf masks and NaN, their backward kernels, empty and 0-d tensors, errors; the
// differentiable ops, forward values and gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/softmax.h"
#include "tensor/factory.h"
#include "tensor/ops/softmax.h"
#include "tests/gpu/autograd_check.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// kFloatTypes in the order this file's seeds are drawn in.
const DType kTypesInSeedOrder[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

void check_softmax(const DevicePair& x, int64_t dim, const std::string& what) {
  const DType dt = x.cpu.dtype();
  const double rtol = std::max(default_rtol(dt), 1e-5);
  const double atol = dt == kFloat64 ? 1e-14 : dt == kFloat32 ? 1e-7 : rtol * 0.1;
  check_same(ops::softmax(x.gpu, dim), ops::softmax(x.cpu, dim), rtol, atol, "softmax " + what);
  check_same(ops::log_softmax(x.gpu, dim), ops::log_softmax(x.cpu, dim), rtol, dt == kFloat64 ? 1e-12 : 4 * rtol,
             "log_softmax " + what);
  // Backward helpers on the CPU forward outputs (same inputs on both devices).
  const Tensor y = ops::softmax(x.cpu, dim), ly = ops::log_softmax(x.cpu, dim);
  const Tensor g = random_tensor(x.cpu.sizes(), dt, 99);
  check_same(ops::softmax_backward(g.to(cuda()), y.to(cuda()), dim), ops::softmax_backward(g, y, dim), rtol,
             dt == kFloat64 ? 1e-12 : 4 * rtol, "softmax_backward " + what);
  check_same(ops::log_softmax_backward(g.to(cuda()), ly.to(cuda()), dim), ops::log_softmax_backward(g, ly, dim), rtol,
             dt == kFloat64 ? 1e-12 : 4 * rtol, "log_softmax_backward " + what);
}

}  // namespace

TEST_CASE("cuda softmax: every dim, dtype and layout matches the CPU") {
  uint64_t seed = 1;
  for (DType dt : kTypesInSeedOrder) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim : {0, 1, 2, -1}) {
        check_softmax(random_pair({3, 4, 5}, dt, seed++, layout, -3, 3), dim,
                      std::string(dtype_name(dt)) + " " + layout_name(layout) + " dim " + std::to_string(dim));
      }
    }
  }
}

TEST_CASE("cuda softmax: long rows, many short rows, long columns") {
  struct Case {
    Shape shape;
    int64_t dim;
    const char* name;
  };
  const Case cases[] = {
      {{4, 50000}, 1, "rows of 50000 (block per row)"}, {{20000, 33}, 1, "20000 rows of 33 (warp per row)"},
      {{64, 1024}, 1, "rows of 1024 (warp)"},           {{64, 1025}, 1, "rows of 1025 (block)"},
      {{3, 5000, 7}, 1, "middle dim of 5000"},          {{50000, 4}, 0, "first dim of 50000"},
      {{8, 12, 128, 128}, -1, "attention scores"},      {{16, 64, 257}, 1, "columns of 257"},
  };
  uint64_t seed = 50;
  for (const Case& c : cases) {
    for (DType dt : kTypesInSeedOrder) {
      check_softmax(random_pair(c.shape, dt, seed++, Layout::Contiguous, -10, 10), c.dim,
                    std::string(dtype_name(dt)) + " " + c.name);
    }
  }
}

TEST_CASE("cuda softmax: large magnitudes, -inf masks and NaN") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kTypesInSeedOrder) {
    const double scale = dt == kFloat16 ? 100.0 : 1000.0;
    std::vector<double> v = random_values(40 * 300, 3, -2, 2);
    for (double& e : v) e *= scale;
    for (int64_t dim : {0, 1}) {
      const DevicePair x = on_both(v, {40, 300}, dt);
      const Tensor y = ops::softmax(x.gpu, dim);
      for (double e : values_of(y)) REQUIRE(std::isfinite(e));
      check_softmax(x, dim, std::string("x1000 ") + dtype_name(dt));
    }
    // Row 0: half masked; row 1: all -inf (NaN); row 2: a NaN; rows 3..: ordinary. Long and short rows.
    for (int64_t D : {int64_t(10), int64_t(3000)}) {
      std::vector<double> m = random_values(6 * D, 4);
      for (int64_t j = 0; j < D; j += 2) m[size_t(j)] = -inf;
      for (int64_t j = 0; j < D; ++j) m[size_t(D + j)] = -inf;
      m[size_t(2 * D + D / 2)] = nan;
      const DevicePair x = on_both(m, {6, D}, dt);
      check_same(ops::softmax(x.gpu, 1), ops::softmax(x.cpu, 1), std::max(default_rtol(dt), 1e-5), 1e-6, "masked");
      check_same(ops::log_softmax(x.gpu, 1), ops::log_softmax(x.cpu, 1), std::max(default_rtol(dt), 1e-5), 1e-4,
                 "masked log");
      const DevicePair xt = on_both(m, {6, D}, dt, Layout::Transposed);
      check_same(ops::softmax(xt.gpu.t(), 0), ops::softmax(xt.cpu.t(), 0), std::max(default_rtol(dt), 1e-5), 1e-6,
                 "masked columns");
    }
  }
}

TEST_CASE("cuda softmax: empty, 0-d, and device mismatch errors") {
  CHECK(ops::softmax(empty({0, 5}, {kFloat32, cuda()}), 1).sizes() == Shape{0, 5});
  CHECK(ops::softmax(scalar_tensor(3.0, {kFloat32, cuda()}), 0).item<float>() == 1.0f);
  const Tensor y = ops::softmax(random_tensor({2, 3}, {kFloat32, cuda()}, 1), 1);
  check_error([&] { ops::softmax_backward(zeros({2, 3}), y, 1); }, {"softmax_backward", "cpu", "cuda"});
  check_error([&] { ops::log_softmax_backward(zeros({2, 3}), y, 1); }, {"log_softmax_backward", "cpu", "cuda"});
  check_error([&] { ops::softmax(zeros({2, 3}, {kInt32, cuda()}), 1); }, {"softmax", "int32"});
}

// ---- the differentiable ops on CUDA: autograd/ops/softmax.h -----------------------------

namespace {

std::vector<AutogradCase> autograd_softmax_cases() {
  using L = const TensorList&;
  const Shape s{6, 37, 50};
  std::vector<AutogradCase> cases;
  for (int64_t dim : {0, 1, -1}) {
    const std::string d = " dim " + std::to_string(dim);
    cases.push_back({"softmax" + d, {grad_input(s, -4.0, 4.0)}, [=](L in) { return softmax(in[0], dim); }});
    cases.push_back({"log_softmax" + d, {grad_input(s, -4.0, 4.0)}, [=](L in) { return log_softmax(in[0], dim); }});
  }
  cases.push_back({"softmax long rows", {grad_input({4, 3000}, -8.0, 8.0)}, [](L in) { return softmax(in[0], -1); }});
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: softmax and log_softmax forward and gradients match the CPU") {
  run_autograd_cases(autograd_softmax_cases());
}
