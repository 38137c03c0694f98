// ops::unary_backward, the fused derivative kernels: every op against its analytic
// derivative written here in double, in f64/f32/f16/bf16 and every layout; the
// conventions at the kinks; the error paths.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::UnaryOp;

namespace {

constexpr DType kFloatTypes[] = {kFloat64, kFloat32, kFloat16, kBFloat16};

struct DerivCase {
  std::string name;
  UnaryOp op;
  double a = 0, b = 0;
  std::function<double(double)> deriv;  // f'(x), written independently of unary_math.h
  double lo = -3.0, hi = 3.0;
};

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<DerivCase> deriv_cases() {
  const double pi = std::acos(-1.0);
  return {
      {"neg", UnaryOp::Neg, 0, 0, [](double) { return -1.0; }},
      {"exp", UnaryOp::Exp, 0, 0, [](double x) { return std::exp(x); }},
      {"log", UnaryOp::Log, 0, 0, [](double x) { return 1.0 / x; }, 0.1, 4.0},
      {"sqrt", UnaryOp::Sqrt, 0, 0, [](double x) { return 0.5 / std::sqrt(x); }, 0.1, 4.0},
      {"rsqrt", UnaryOp::Rsqrt, 0, 0, [](double x) { return -0.5 * std::pow(x, -1.5); }, 0.2, 4.0},
      {"tanh", UnaryOp::Tanh, 0, 0, [](double x) { return 1.0 / (std::cosh(x) * std::cosh(x)); }, -2.0, 2.0},
      {"sigmoid", UnaryOp::Sigmoid, 0, 0,
       [](double x) { return std::exp(-x) / ((1 + std::exp(-x)) * (1 + std::exp(-x))); }},
      {"relu", UnaryOp::Relu, 0, 0, [](double x) { return x > 0 ? 1.0 : 0.0; }},
      {"gelu", UnaryOp::Gelu, 0, 0,
       [pi](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-x * x / 2) / std::sqrt(2 * pi); }},
      {"gelu_tanh", UnaryOp::GeluTanh, 0, 0,
       [pi](double x) {
         const double k = std::sqrt(2 / pi), u = k * (x + 0.044715 * x * x * x);
         const double sech = 1.0 / std::cosh(u);
         return 0.5 * (1 + std::tanh(u)) + 0.5 * x * sech * sech * k * (1 + 3 * 0.044715 * x * x);
       }},
      {"silu", UnaryOp::Silu, 0, 0,
       [](double x) { return sigmoid_ref(x) + x * sigmoid_ref(x) * (1 - sigmoid_ref(x)); }},
      {"abs", UnaryOp::Abs, 0, 0, [](double x) { return x > 0 ? 1.0 : -1.0; }},
      {"square", UnaryOp::Square, 0, 0, [](double x) { return 2 * x; }},
      {"reciprocal", UnaryOp::Reciprocal, 0, 0, [](double x) { return -1.0 / (x * x); }, 0.2, 4.0},
      {"sin", UnaryOp::Sin, 0, 0, [](double x) { return std::cos(x); }, -6.0, 6.0},
      {"cos", UnaryOp::Cos, 0, 0, [](double x) { return -std::sin(x); }, -6.0, 6.0},
      {"pow(3)", UnaryOp::Pow, 3.0, 0, [](double x) { return 3 * x * x; }},
      {"pow(-1.5)", UnaryOp::Pow, -1.5, 0, [](double x) { return -1.5 * std::pow(x, -2.5); }, 0.3, 4.0},
      {"pow(0.5)", UnaryOp::Pow, 0.5, 0, [](double x) { return 0.5 / std::sqrt(x); }, 0.1, 4.0},
      {"affine", UnaryOp::Affine, 1.5, -0.25, [](double) { return 1.5; }},
      {"clamp", UnaryOp::Clamp, -0.5, 0.75, [](double x) { return (x >= -0.5 && x <= 0.75) ? 1.0 : 0.0; }},
  };
}

/// x or y = f(x) in `x`'s dtype and layout, as unary_backward wants it for `op`.
Tensor saved_value(UnaryOp op, const Tensor& x, double a, double b) {
  if (ops::unary_grad_from(op) != ops::UnaryGradFrom::Output) return x;
  return ops::unary(op, x, a, b);
}

}  // namespace

TEST_CASE("unary_backward: every op matches its analytic derivative in every dtype and layout") {
  for (const DerivCase& c : deriv_cases()) {
    for (DType dt : kFloatTypes) {
      for (Layout lg : kAllLayouts) {
        const Layout lx = lg == Layout::Contiguous ? Layout::Strided : Layout::Transposed;  // mix layouts
        CAPTURE(c.name);
        CAPTURE(dtype_name(dt));
        CAPTURE(layout_name(lg));
        const Shape shape{5, 7};
        const Tensor x = random_tensor(shape, dt, 11, lx, c.lo, c.hi);
        const Tensor g = random_tensor(shape, dt, 12, lg);
        const Tensor got = ops::unary_backward(c.op, g, saved_value(c.op, x, c.a, c.b), c.a, c.b);
        REQUIRE(got.dtype() == dt);
        REQUIRE(got.sizes() == shape);
        CHECK(got.is_contiguous());
        // The reference sees x and g exactly as stored (already rounded to dt).
        const std::vector<double> xv = values_of(x), gv = values_of(g);
        std::vector<double> expected(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) expected[i] = gv[i] * c.deriv(xv[i]);
        // f32 and half types see y rounded (Output ops) and compute in float.
        const double tol = dt == kFloat64 ? 1e-12 : 6 * default_rtol(dt);
        check_close(got, expected, tol, tol, c.name);
      }
    }
  }
}

TEST_CASE("unary_backward: conventions at the kinks and edges follow PyTorch") {
  const Tensor g = from_vector(std::vector<double>{2.0, 2.0, 2.0}, {3});
  auto run = [&](UnaryOp op, std::vector<double> v, double a = 0, double b = 0) {
    return values_of(ops::unary_backward(op, g, from_vector(v, {3}), a, b));
  };
  CHECK(run(UnaryOp::Relu, {0.0, 1.0, -1.0}) == std::vector<double>{0, 2, 0});  // relu'(0) = 0
  CHECK(run(UnaryOp::Abs, {0.0, 3.0, -3.0}) == std::vector<double>{0, 2, -2});  // abs'(0) = 0
  // clamp: the gradient passes at both bounds (inclusive), not outside, nor when lo > hi.
  CHECK(run(UnaryOp::Clamp, {-1.0, 1.0, 1.5}, -1.0, 1.0) == std::vector<double>{2, 2, 0});
  CHECK(run(UnaryOp::Clamp, {0.0, 1.0, 2.0}, 1.5, 0.5) == std::vector<double>{0, 0, 0});
  // pow(x, 0)' is exactly 0, also at x = 0 (no 0 * inf).
  CHECK(run(UnaryOp::Pow, {0.0, 2.0, -1.0}, 0.0) == std::vector<double>{0, 0, 0});
  // pow(x, 2)' = 2x, also for negative x.
  CHECK(run(UnaryOp::Pow, {-3.0, 0.0, 1.5}, 2.0) == std::vector<double>{-12, 0, 6});
  // NaN: relu passes the gradient (PyTorch's threshold_backward), abs propagates NaN.
  const double nan = std::nan("");
  CHECK(run(UnaryOp::Relu, {nan, 1, 1})[0] == 2.0);
  CHECK(std::isnan(run(UnaryOp::Abs, {nan, 1, 1})[0]));
  // Saturated sigmoid/tanh: exactly 0, no NaN.
  CHECK(run(UnaryOp::Sigmoid, {1.0, 0.0, 0.5}) == std::vector<double>{0, 0, 2 * 0.25});
  CHECK(run(UnaryOp::Tanh, {1.0, -1.0, 0.0}) == std::vector<double>{0, 0, 2});
  // silu and gelu far out: finite.
  for (double v : run(UnaryOp::Silu, {-200.0, 200.0, 0.0})) CHECK(std::isfinite(v));
  for (double v : run(UnaryOp::GeluTanh, {-200.0, 200.0, 0.0})) CHECK(std::isfinite(v));
}

TEST_CASE("unary_backward: neg and affine need no saved value; empty and 0-d tensors") {
  const Tensor g = random_tensor({4}, kFloat32, 3);
  check_close(
      ops::unary_backward(UnaryOp::Neg, g, Tensor()),
      [&] {
        std::vector<double> e = values_of(g);
        for (double& v : e) v = -v;
        return e;
      }(),
      0, 0, "neg");
  check_close(
      ops::unary_backward(UnaryOp::Affine, g, Tensor(), 2.5, 7.0),
      [&] {
        std::vector<double> e = values_of(g);
        for (double& v : e) v *= 2.5;
        return e;
      }(),
      1e-7, 0, "affine");
  const Tensor e = empty({0, 3}, kFloat16);
  CHECK(ops::unary_backward(UnaryOp::Gelu, e, e).sizes() == Shape{0, 3});
  const Tensor s = scalar_tensor(0.5, kFloat64);
  CHECK(ops::unary_backward(UnaryOp::Square, scalar_tensor(3.0, kFloat64), s).item<double>() == 3.0);
}

TEST_CASE("unary_backward: errors name the op, the shapes and the dtypes") {
  const Tensor g = random_tensor({2, 3}, kFloat32, 1);
  check_error(
      [&] {
        ops::unary_backward(UnaryOp::Gelu, g, random_tensor({3, 2}, kFloat32, 2));
      },
      {"gelu_backward", "[2, 3]", "[3, 2]"});
  check_error(
      [&] {
        ops::unary_backward(UnaryOp::Exp, g, random_tensor({2, 3}, kFloat64, 2));
      },
      {"exp_backward", "float32", "float64", "output"});
  check_error([&] { ops::unary_backward(UnaryOp::Log, g, Tensor()); }, {"log_backward", "input", "undefined"});
  check_error([&] { ops::unary_backward(UnaryOp::Relu, zeros({2}, kInt32), zeros({2}, kInt32)); },
              {"relu_backward", "floating", "int32"});
  check_error([&] { ops::unary_backward(UnaryOp::Sin, Tensor(), g); }, {"sin_backward", "undefined"});
}
