// softmax / log_softmax against float64 loops on every dim, dtype and layout; their
// backward helpers against central finite differences of the forward op in float64; the
// differentiable ops (autograd/ops/softmax.h) through gradcheck.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/softmax.h"
#include "tensor/factory.h"
#include "tensor/ops/softmax.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

/// Reference softmax (or log_softmax) of row-major values `v` of `shape` along `dim`, in double:
/// the (outer, D, inner) slices are walked explicitly.
std::vector<double> ref_softmax(const std::vector<double>& v, const Shape& shape, int64_t dim, bool log) {
  const int64_t nd = int64_t(shape.size());
  const int64_t d = dim < 0 ? dim + nd : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= shape[size_t(k)];
  for (int64_t k = d + 1; k < nd; ++k) inner *= shape[size_t(k)];
  const int64_t D = shape[size_t(d)];
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return size_t((o * D + j) * inner + i); };
      double m = -kInf;
      for (int64_t j = 0; j < D; ++j) m = std::max(m, v[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < D; ++j) s += std::exp(v[at(j)] - m);
      for (int64_t j = 0; j < D; ++j) out[at(j)] = log ? v[at(j)] - m - std::log(s) : std::exp(v[at(j)] - m) / s;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("softmax: softmax and log_softmax match float64 loops on every dim, dtype and layout") {
  const Shape shape = {3, 4, 5};
  uint64_t seed = 1;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim : {0, 1, 2, -1, -3}) {
        const Tensor x = random_tensor(shape, dt, seed++, layout, -3, 3);
        const std::vector<double> xv = values_of(x);
        const std::string what =
            std::string(dtype_name(dt)) + " " + layout_name(layout) + " dim " + std::to_string(dim);
        const double rtol = default_rtol(dt), atol = dt == kFloat64 ? 1e-14 : rtol * 0.1;
        const Tensor y = ops::softmax(x, dim), ly = ops::log_softmax(x, dim);
        CHECK(y.sizes() == shape);
        CHECK(y.dtype() == dt);
        CHECK(ly.dtype() == dt);
        CHECK(y.is_contiguous());
        check_close(y, ref_softmax(xv, shape, dim, false), rtol, atol, "softmax " + what);
        // log_softmax is O(1) in size: compare with an absolute tolerance scaled by the dtype.
        check_close(ly, ref_softmax(xv, shape, dim, true), rtol, rtol * 4, "log_softmax " + what);
      }
    }
  }
}

TEST_CASE("softmax: slices sum to 1; a long last dim and a long middle dim") {
  for (const auto& [shape, dim] : std::vector<std::pair<Shape, int64_t>>{{{4, 50000}, 1}, {{3, 5000, 7}, 1}}) {
    const Tensor x = random_tensor(shape, kFloat32, 11, Layout::Contiguous, -10, 10);
    const Tensor y = ops::softmax(x, dim);
    const std::vector<double> yv = values_of(y);
    const int64_t D = shape[size_t(dim)], inner = dim + 1 < int64_t(shape.size()) ? shape.back() : 1;
    for (int64_t o = 0; o < shape[0]; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double s = 0;
        for (int64_t j = 0; j < D; ++j) s += yv[size_t((o * D + j) * inner + i)];
        CHECK(std::fabs(s - 1.0) < 1e-5);
      }
    }
    check_close(y, ref_softmax(values_of(x), shape, dim, false), 1e-5, 1e-9, "long softmax");
    check_close(ops::log_softmax(x, dim), ref_softmax(values_of(x), shape, dim, true), 1e-5, 1e-5, "long log_softmax");
  }
}

TEST_CASE("softmax: large-magnitude inputs are stable (x * 1000)") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    // float16 tops out at 65504, so scale it less.
    const double scale = dt == kFloat16 ? 100.0 : 1000.0;
    std::vector<double> v = random_values(6 * 7, 3, -2, 2);
    for (double& e : v) e *= scale;
    for (int64_t dim : {0, 1}) {
      const Tensor x = make_tensor(v, {6, 7}, dt);
      const std::vector<double> xv = values_of(x);
      const std::vector<double> y = values_of(ops::softmax(x, dim)), ly = values_of(ops::log_softmax(x, dim));
      for (double e : y) CHECK(std::isfinite(e));
      for (double e : ly) CHECK(!std::isnan(e));
      const double rtol = default_rtol(dt);
      const double atol = dt == kFloat16 ? 6e-8 : 1e-12;  // below float16's smallest subnormal, 0 is the answer
      check_close(y, ref_softmax(xv, {6, 7}, dim, false), rtol, atol, std::string("big softmax ") + dtype_name(dt));
      check_close(ly, ref_softmax(xv, {6, 7}, dim, true), rtol, rtol, std::string("big log_softmax ") + dtype_name(dt));
    }
  }
}

TEST_CASE("softmax: -inf masks, all -inf slices and NaN") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const Tensor x = make_tensor({-kInf, 0.0, 0.0, -kInf, -kInf, -kInf, 1.0, nan, 2.0}, {3, 3}, dt);
    const std::vector<double> y = values_of(ops::softmax(x, 1)), ly = values_of(ops::log_softmax(x, 1));
    CHECK(y[0] == 0.0);
    CHECK(y[1] == 0.5);
    CHECK(y[2] == 0.5);
    CHECK(ly[0] == -kInf);
    CHECK(std::fabs(ly[1] + std::log(2.0)) < 1e-2);
    for (int k = 3; k < 9; ++k) {
      CHECK(std::isnan(y[size_t(k)]));  // row 1: all -inf; row 2: a NaN
      CHECK(std::isnan(ly[size_t(k)]));
    }
  }
}

TEST_CASE("softmax: backward helpers match central differences of the forward in float64") {
  const Shape shape = {2, 3, 4};
  const double h = 1e-6;
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool log : {false, true}) {
      const auto fwd = [&](const Tensor& t) { return log ? ops::log_softmax(t, dim) : ops::softmax(t, dim); };
      const std::vector<double> xv = random_values(24, uint64_t(10 + dim), -2, 2);
      const std::vector<double> gv = random_values(24, uint64_t(20 + dim), -1, 1);
      const Tensor x = make_tensor(xv, shape, kFloat64);
      const Tensor g = make_tensor(gv, shape, kFloat64);
      const Tensor y = fwd(x);
      const Tensor gi = log ? ops::log_softmax_backward(g, y, dim) : ops::softmax_backward(g, y, dim);
      // grad_in[j] = sum_i g[i] * d y[i] / d x[j], by central differences.
      std::vector<double> expected(24);
      for (size_t j = 0; j < 24; ++j) {
        std::vector<double> xp = xv, xm = xv;
        xp[j] += h;
        xm[j] -= h;
        const std::vector<double> yp = values_of(fwd(make_tensor(xp, shape, kFloat64)));
        const std::vector<double> ym = values_of(fwd(make_tensor(xm, shape, kFloat64)));
        double acc = 0;
        for (size_t i = 0; i < 24; ++i) acc += gv[i] * (yp[i] - ym[i]) / (2 * h);
        expected[j] = acc;
      }
      check_close(gi, expected, 1e-6, 1e-8,
                  std::string(log ? "log_softmax" : "softmax") + "_backward dim " + std::to_string(dim));
    }
  }
}

TEST_CASE("softmax: backward helpers in every dtype and layout vs the float64 formula") {
  const Shape shape = {3, 4, 6};
  uint64_t seed = 77;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim : {0, 1, -1}) {
        const Tensor x = random_tensor(shape, dt, seed++, Layout::Contiguous);
        const Tensor y = ops::softmax(x, dim), ly = ops::log_softmax(x, dim);
        const Tensor g = random_tensor(shape, dt, seed++, layout);
        const std::vector<double> yv = values_of(y), lyv = values_of(ly), gv = values_of(g);
        // Slice sums in double, written out for (outer, D, inner).
        const int64_t d = dim < 0 ? dim + 3 : dim;
        int64_t outer = 1, inner = 1;
        for (int64_t k = 0; k < d; ++k) outer *= shape[size_t(k)];
        for (int64_t k = d + 1; k < 3; ++k) inner *= shape[size_t(k)];
        const int64_t D = shape[size_t(d)];
        std::vector<double> e_soft(yv.size()), e_log(yv.size());
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t i = 0; i < inner; ++i) {
            double dot = 0, gsum = 0;
            for (int64_t j = 0; j < D; ++j) {
              const size_t k = size_t((o * D + j) * inner + i);
              dot += gv[k] * yv[k];
              gsum += gv[k];
            }
            for (int64_t j = 0; j < D; ++j) {
              const size_t k = size_t((o * D + j) * inner + i);
              e_soft[k] = yv[k] * (gv[k] - dot);
              e_log[k] = gv[k] - std::exp(lyv[k]) * gsum;
            }
          }
        }
        const std::string what =
            std::string(dtype_name(dt)) + " " + layout_name(layout) + " dim " + std::to_string(dim);
        const double rtol = default_rtol(dt), atol = dt == kFloat64 ? 1e-13 : 4 * rtol;
        check_close(ops::softmax_backward(g, y, dim), e_soft, rtol, atol, "softmax_backward " + what);
        check_close(ops::log_softmax_backward(g, ly, dim), e_log, rtol, atol, "log_softmax_backward " + what);
      }
    }
  }
}

TEST_CASE("softmax: 0-d and empty tensors") {
  const Tensor s = scalar_tensor(3.0);
  CHECK(ops::softmax(s, 0).item<float>() == 1.0f);
  CHECK(ops::softmax(s, -1).dim() == 0);
  CHECK(ops::log_softmax(s, 0).item<float>() == 0.0f);
  CHECK(ops::softmax_backward(scalar_tensor(2.0), scalar_tensor(1.0), 0).item<float>() == 0.0f);
  const Tensor e = empty({0, 3});
  CHECK(ops::softmax(e, 1).sizes() == Shape{0, 3});
  CHECK(ops::log_softmax(e, 0).sizes() == Shape{0, 3});
  CHECK(ops::softmax_backward(e, e, 1).sizes() == Shape{0, 3});
}

TEST_CASE("softmax: errors name the op, the dim, the shapes and the dtypes") {
  const Tensor x = zeros({2, 3});
  check_error([&] { ops::softmax(x, 2); }, {"softmax", "dim 2", "[2, 3]"});
  check_error([&] { ops::log_softmax(x, -3); }, {"log_softmax", "dim -3", "[2, 3]"});
  check_error([&] { ops::softmax(zeros({2}, kInt64), 0); }, {"softmax", "floating-point", "int64[2]"});
  check_error([&] { ops::log_softmax(zeros({2}, kInt32), 0); }, {"log_softmax", "int32"});
  check_error([&] { ops::softmax_backward(zeros({3, 2}), x, 1); }, {"softmax_backward", "[3, 2]", "[2, 3]"});
  check_error(
      [&] {
        ops::log_softmax_backward(zeros({2, 3}, kFloat64), x, 1);
      },
      {"log_softmax_backward", "float64[2, 3]", "float32[2, 3]"});
  check_error([&] { ops::softmax_backward(x, x, 5); }, {"softmax_backward", "dim 5"});
  check_error([&] { ops::softmax(Tensor(), 0); }, {"softmax", "undefined"});
}

// ---- the differentiable ops: autograd/ops/softmax.h -------------------------------------

TEST_CASE("autograd reduce: softmax rows sum to 1, so a constant upstream gradient gives a zero gradient") {
  // Gradchecks of softmax and log_softmax: the differentiable op table (tests/cpu/test_grad_table.cpp).
  Tensor x = leaf({3, 5}, 34);
  softmax(x, 1).backward(ones({3, 5}, kFloat64));
  for (double v : values_of(x.grad())) CHECK(std::fabs(v) < 1e-14);
  CHECK(log_softmax(x, 0).grad_fn_name() == "LogSoftmaxBackward");
}
