// Unary elementwise ops on the CPU against float64 formulas written here, for every
// floating dtype and layout, plus the integer ops, empty and 0-d tensors and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// Absolute tolerance for results near zero (cancellation in gelu, silu, sin...).
double small_atol(DType t) { return t == kFloat64 ? 1e-13 : t == kFloat32 ? 1e-6 : default_rtol(t) * 0.05; }

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo = -3.0, hi = 3.0;  // input range
};

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", ops::neg, [](double x) { return -x; }},
      {"exp", ops::exp, [](double x) { return std::exp(x); }},
      {"log", ops::log, [](double x) { return std::log(x); }, 0.05, 5.0},
      {"sqrt", ops::sqrt, [](double x) { return std::sqrt(x); }, 0.0, 5.0},
      {"rsqrt", ops::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, 0.05, 5.0},
      {"tanh", ops::tanh, [](double x) { return std::tanh(x); }},
      {"sigmoid", ops::sigmoid, sigmoid_ref, -8.0, 8.0},
      {"relu", ops::relu, [](double x) { return x > 0 ? x : 0.0; }},
      {"gelu", ops::gelu, gelu_ref},
      {"gelu_tanh", ops::gelu_tanh, gelu_tanh_ref},
      {"silu", ops::silu, [](double x) { return x * sigmoid_ref(x); }},
      {"abs", ops::abs, [](double x) { return std::fabs(x); }},
      {"square", ops::square, [](double x) { return x * x; }},
      {"reciprocal", ops::reciprocal, [](double x) { return 1.0 / x; }, 0.1, 4.0},
      {"reciprocal(neg)", ops::reciprocal, [](double x) { return 1.0 / x; }, -4.0, -0.1},
      {"sin", ops::sin, [](double x) { return std::sin(x); }, -6.0, 6.0},
      {"cos", ops::cos, [](double x) { return std::cos(x); }, -6.0, 6.0},
      {"pow(3)", [](const Tensor& x) { return ops::pow(x, 3.0); }, [](double x) { return x * x * x; }},
      {"pow(2)", [](const Tensor& x) { return ops::pow(x, 2.0); }, [](double x) { return x * x; }},
      {"pow(0.5)", [](const Tensor& x) { return ops::pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, 0.0, 4.0},
      {"pow(-1.5)", [](const Tensor& x) { return ops::pow(x, -1.5); }, [](double x) { return std::pow(x, -1.5); }, 0.2,
       4.0},
      {"affine", [](const Tensor& x) { return ops::affine(x, 1.5, -0.25); }, [](double x) { return x * 1.5 - 0.25; }},
      {"clamp", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.75); },
       [](double x) { return std::min(std::max(x, -0.5), 0.75); }},
      {"clamp(lo>hi)", [](const Tensor& x) { return ops::clamp(x, 1.0, -1.0); }, [](double) { return -1.0; }},
  };
}

}  // namespace

TEST_CASE("unary: every op matches its float64 formula in every dtype and layout") {
  const Shape shape{6, 9};
  uint64_t seed = 1;
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      for (Layout layout : kAllLayouts) {
        const std::string what = c.name + " " + dtype_name(dt) + " " + layout_name(layout);
        const Tensor x = random_tensor(shape, {dt}, seed++, layout, c.lo, c.hi);
        const Tensor y = c.op(x);
        REQUIRE_MESSAGE(y.dtype() == dt, what);
        REQUIRE_MESSAGE(y.sizes() == shape, what);
        CHECK_MESSAGE(y.is_contiguous(), what);
        std::vector<double> expected;
        for (double v : values_of(x)) expected.push_back(c.ref(v));  // from the stored (rounded) inputs
        check_close(y, expected, default_rtol(dt), small_atol(dt), what);
      }
    }
  }
}

TEST_CASE("unary: large inputs exercise the parallel path") {
  const Tensor x = random_tensor({300, 500}, {kFloat32}, 7, Layout::Transposed);
  std::vector<double> expected;
  for (double v : values_of(x)) expected.push_back(gelu_ref(v));
  check_close(ops::gelu(x), expected, 1e-5, 1e-6, "gelu 300x500 transposed");
}

TEST_CASE("unary: special values") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const Tensor x = make_tensor({-inf, -1.0, 0.0, 1.0, inf, nan}, {6}, {kFloat32});
  check_close(ops::relu(x), {0, 0, 0, 1, inf, nan}, 0, 0, "relu keeps NaN");
  check_close(ops::clamp(x, -0.5, 0.5), {-0.5, -0.5, 0, 0.5, 0.5, nan}, 0, 0, "clamp keeps NaN");
  check_close(ops::sigmoid(x), {0, sigmoid_ref(-1), 0.5, sigmoid_ref(1), 1, nan}, 1e-6, 0, "sigmoid saturates");
  check_close(ops::exp(x), {0, std::exp(-1.0), 1, std::exp(1.0), inf, nan}, 1e-6, 0, "exp");
  check_close(ops::log(make_tensor({0.0, -1.0}, {2}, {kFloat32})), {-inf, nan}, 0, 0, "log(0), log(-1)");
  check_close(ops::reciprocal(make_tensor({0.0}, {1}, {kFloat16})), {inf}, 0, 0, "1/0 in half");
}

TEST_CASE("unary: neg, abs, relu and square on integers are exact") {
  for (DType dt : {kInt32, kInt64}) {
    const std::vector<double> v{-7, -1, 0, 3, 12, -40000, 46340};
    const Tensor x = make_tensor(v, {7}, {dt});
    std::vector<double> neg, abs, relu, square;
    for (double a : v) {
      neg.push_back(-a);
      abs.push_back(std::fabs(a));
      relu.push_back(a > 0 ? a : 0);
      square.push_back(a * a);
    }
    const std::string name = dtype_name(dt);
    REQUIRE(ops::neg(x).dtype() == dt);
    check_close(ops::neg(x), neg, 0, 0, "neg " + name);
    check_close(ops::abs(x), abs, 0, 0, "abs " + name);
    check_close(ops::relu(x), relu, 0, 0, "relu " + name);
    check_close(ops::square(x), square, 0, 0, "square " + name);
  }
  // Integer overflow wraps around (two's complement), as in PyTorch.
  const Tensor big = make_tensor({65536.0, -2147483648.0}, {2}, {kInt32});
  check_close(ops::square(big), {0, 0}, 0, 0, "square wraps in int32");
  check_close(ops::neg(big), {-65536.0, -2147483648.0}, 0, 0, "neg of INT32_MIN wraps");
  // Non-contiguous integer input.
  const Tensor xt = make_tensor({1, -2, 3, -4, 5, -6}, {2, 3}, {kInt64}, Layout::Transposed);
  check_close(ops::abs(xt), {1, 2, 3, 4, 5, 6}, 0, 0, "abs int64 transposed");
}

TEST_CASE("unary: empty and 0-d tensors") {
  for (DType dt : kFloatTypes) {
    const Tensor e = empty({0, 4}, {dt});
    const Tensor y = ops::gelu(e);
    CHECK(y.sizes() == Shape{0, 4});
    CHECK(y.dtype() == dt);
    const Tensor s = scalar_tensor(0.7, {dt});
    const Tensor t = ops::tanh(s);
    CHECK(t.dim() == 0);
    check_close(t, {std::tanh(values_of(s)[0])}, default_rtol(dt), 0, std::string("tanh 0-d ") + dtype_name(dt));
    const Tensor a = ops::affine(s, 2.0, 1.0);
    check_close(a, {values_of(s)[0] * 2.0 + 1.0}, default_rtol(dt), 0, "affine 0-d");
  }
  CHECK(ops::neg(empty({3, 0}, {kInt32})).sizes() == Shape{3, 0});
}

TEST_CASE("unary: the input is untouched and the output is fresh") {
  const Tensor x = random_tensor({4, 5}, {kFloat32}, 3);
  const std::vector<double> before = values_of(x);
  const uint64_t version = x.version();
  const Tensor y = ops::exp(x);
  CHECK(values_of(x) == before);
  CHECK(x.version() == version);
  CHECK_FALSE(y.shares_storage(x));
}

TEST_CASE("unary: errors name the op and the tensor") {
  const Tensor i = make_tensor({1, 2}, {2}, {kInt32});
  check_error([&] { ops::exp(i); }, {"exp", "floating", "int32[2] cpu"});
  check_error([&] { ops::gelu(i); }, {"gelu", "int32"});
  check_error([&] { ops::pow(i, 2.0); }, {"pow", "int32"});
  check_error([&] { ops::clamp(i, 0, 1); }, {"clamp", "int32"});
  check_error([&] { ops::affine(i, 2, 1); }, {"affine", "int32"});
  const Tensor b = make_tensor({1, 0}, {2}, {kBool});
  check_error([&] { ops::neg(b); }, {"neg", "floating or integer", "bool[2] cpu"});
  check_error([&] { ops::abs(b); }, {"abs", "bool"});
  check_error([&] { ops::sqrt(Tensor()); }, {"sqrt", "undefined"});
}
