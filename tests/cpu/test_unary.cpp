// Unary elementwise ops on the CPU against float64 formulas written here, for every
// floating dtype and layout, plus the integer ops, empty and 0-d tensors and errors;
// their derivative kernels (ops::unary_backward) against analytic derivatives, the
// conventions at the kinks; the differentiable ops (autograd/ops/unary.h) through
// gradcheck in float64, their nodes and what they save.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/activation.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::UnaryOp;

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
      {"tan", ops::tan, [](double x) { return std::tan(x); }, -1.2, 1.2},
      {"asin", ops::asin, [](double x) { return std::asin(x); }, -1.0, 1.0},
      {"acos", ops::acos, [](double x) { return std::acos(x); }, -1.0, 1.0},
      {"atan", ops::atan, [](double x) { return std::atan(x); }, -6.0, 6.0},
      {"sinh", ops::sinh, [](double x) { return std::sinh(x); }, -5.0, 5.0},
      {"cosh", ops::cosh, [](double x) { return std::cosh(x); }, -5.0, 5.0},
      {"asinh", ops::asinh, [](double x) { return std::asinh(x); }, -6.0, 6.0},
      {"acosh", ops::acosh, [](double x) { return std::acosh(x); }, 1.0, 6.0},
      {"atanh", ops::atanh, [](double x) { return std::atanh(x); }, -0.95, 0.95},
      {"erf", ops::erf, [](double x) { return std::erf(x); }},
      {"erfc", ops::erfc, [](double x) { return std::erfc(x); }, -1.0, 4.0},
      {"expm1", ops::expm1, [](double x) { return std::expm1(x); }},
      {"exp2", ops::exp2, [](double x) { return std::exp2(x); }, -6.0, 6.0},
      {"log2", ops::log2, [](double x) { return std::log2(x); }, 0.05, 9.0},
      {"log10", ops::log10, [](double x) { return std::log10(x); }, 0.05, 9.0},
      {"logsigmoid", ops::logsigmoid, [](double x) { return -std::log1p(std::exp(-x)); }, -20.0, 20.0},
      {"floor", ops::floor, [](double x) { return std::floor(x); }, -4.0, 4.0},
      {"ceil", ops::ceil, [](double x) { return std::ceil(x); }, -4.0, 4.0},
      {"trunc", ops::trunc, [](double x) { return std::trunc(x); }, -4.0, 4.0},
      {"round", ops::round, [](double x) { return std::nearbyint(x); }, -4.0, 4.0},
      {"sign", ops::sign, [](double x) { return double((x > 0) - (x < 0)); }},
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

TEST_CASE("unary: rounding, sign and the math functions at special values follow PyTorch") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // PyTorch 1.13's outputs for these inputs (torch.floor(x) & co. in float32).
  const std::vector<double> x{-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, nan, inf, -inf};
  auto each = [&](double (*f)(double)) {
    std::vector<double> y;
    for (double v : x) y.push_back(f(v));
    return y;
  };
  struct Expect {
    const char* name;
    Tensor (*op)(const Tensor&);
    std::vector<double> y;
  };
  const std::vector<Expect> expected{
      {"floor", ops::floor, {-3, -2, -1, -0.0, 0, 0, 1, 2, nan, inf, -inf}},
      {"ceil", ops::ceil, {-2, -1, -0.0, -0.0, 0, 1, 2, 3, nan, inf, -inf}},
      {"trunc", ops::trunc, {-2, -1, -0.0, -0.0, 0, 0, 1, 2, nan, inf, -inf}},
      {"round", ops::round, {-2, -2, -0.0, -0.0, 0, 0, 2, 2, nan, inf, -inf}},  // ties to even
      // PyTorch's sign(NaN) is 0; frugal keeps the NaN (Note [NaN stays NaN]).
      {"sign", ops::sign, {-1, -1, -1, 0, 0, 1, 1, 1, nan, 1, -1}},
      // The smooth ones as libm gives them in float64 (IEEE's values at -0, the infinities and
      // outside the domains, as PyTorch's).
      {"erf", ops::erf, each([](double v) { return std::erf(v); })},
      {"erfc", ops::erfc, each([](double v) { return std::erfc(v); })},
      {"expm1", ops::expm1, each([](double v) { return std::expm1(v); })},
      {"atan", ops::atan, each([](double v) { return std::atan(v); })},
      {"asin", ops::asin, each([](double v) { return std::asin(v); })},
      {"acosh", ops::acosh, each([](double v) { return std::acosh(v); })},
      {"atanh", ops::atanh, each([](double v) { return std::atanh(v); })},
      {"log2", ops::log2, each([](double v) { return std::log2(v); })},
      // torch: +0 at +inf, -inf at -inf, never log(0) or 1 - 1 in between.
      {"logsigmoid", ops::logsigmoid, each([](double v) { return v > 1e300 ? 0.0 : -std::log1p(std::exp(-v)); })},
  };
  for (DType dt : kFloatTypes) {
    const Tensor t = make_tensor(x, {11}, {dt});
    for (const Expect& e : expected) {
      const std::string what = std::string(e.name) + " " + dtype_name(dt);
      const Tensor y = e.op(t);
      check_close(y, e.y, default_rtol(dt), 0, what);
      const std::vector<double> got = values_of(y);
      for (size_t i = 0; i < got.size(); ++i)  // the sign of a zero too (-0.5 rounds to -0)
        if (e.y[i] == 0) CHECK_MESSAGE(std::signbit(got[i]) == std::signbit(e.y[i]), what, " at ", x[i]);
    }
  }
  // Far tails: logsigmoid is x below -30 and -e^-x above 30.
  check_close(ops::logsigmoid(make_tensor({-200.0, 200.0, 40.0}, {3}, {kFloat32})), {-200.0, 0.0, -std::exp(-40.0)},
              1e-6, 0, "logsigmoid tails");
  // Rounding in float32 beyond 2^23 (already integral) and at the largest float below 0.5.
  const float below_half = std::nextafter(0.5f, 0.0f);
  check_close(ops::round(make_tensor({double(below_half), 8388609.0, -8388609.0}, {3}, {kFloat32})),
              {0.0, 8388609.0, -8388609.0}, 0, 0, "round near 0.5 and past 2^23");
}

TEST_CASE("unary: floor, ceil, trunc, round and sign on integers") {
  for (DType dt : {kInt32, kInt64}) {
    const std::vector<double> v{-7, -1, 0, 3, 12, -2147483648.0, 2147483647.0};
    const Tensor x = make_tensor(v, {7}, {dt}, Layout::Strided);
    for (auto op : {ops::floor, ops::ceil, ops::trunc, ops::round}) {
      const Tensor y = op(x);
      REQUIRE(y.dtype() == dt);
      check_close(y, v, 0, 0, std::string("identity on ") + dtype_name(dt));
      CHECK_FALSE(y.shares_storage(x));
    }
    check_close(ops::sign(x), {-1, -1, 0, 1, 1, -1, 1}, 0, 0, std::string("sign ") + dtype_name(dt));
  }
  check_error([] { ops::floor(make_tensor({1, 0}, {2}, {kBool})); }, {"floor", "floating or integer", "bool[2]"});
  check_error([] { ops::erf(make_tensor({1, 2}, {2}, {kInt64})); }, {"erf", "floating", "int64[2]"});
}

TEST_CASE("autograd ops: the rounding ops pass zeros and save nothing; the math functions' gradients") {
  for (auto op : {frugal::floor, frugal::ceil, frugal::trunc, frugal::round, frugal::sign}) {
    Tensor x = leaf({2, 3}, 21);
    const Tensor y = op(x);
    CHECK(y.grad_fn_name().find("Backward") != std::string::npos);
    sum(mul(y, 3.0)).backward();
    REQUIRE(x.grad().defined());
    check_close(x.grad(), std::vector<double>(6, 0.0), 0, 0, y.grad_fn_name());
  }
  CHECK(frugal::round(leaf({2}, 1)).grad_fn_name() == "RoundBackward");
  // A NaN or infinite upstream gradient stays out of the zeros (PyTorch's zeros_like).
  Tensor x = leaf({2}, 3);
  frugal::floor(x).backward(make_tensor({std::nan(""), std::numeric_limits<double>::infinity()}, {2}, {kFloat64}));
  check_close(x.grad(), {0, 0}, 0, 0, "floor of a NaN gradient");
  // Gradchecks of every function, and second order, are in the differentiable op table
  // (tests/op_table/grad_ops_elementwise.cpp); here the nodes' names and what they keep.
  CHECK(frugal::tan(leaf({2}, 4)).grad_fn_name() == "TanBackward");
  CHECK(logsigmoid(leaf({2}, 4)).grad_fn_name() == "LogSigmoidBackward");
  Tensor t = leaf({3}, 5);
  Tensor y = frugal::expm1(t);  // keeps y: changing it in place is caught
  ops::mul_(y, 2.0);
  check_error([&] { sum(y).backward(); }, {"Expm1Backward", "modified by an in-place"});
}

// ---- the derivative kernels: ops::unary_backward ------------------------------------

namespace {

struct DerivCase {
  std::string name;
  UnaryOp op;
  double a = 0, b = 0;
  std::function<double(double)> deriv;  // f'(x), written independently of unary_math.h
  double lo = -3.0, hi = 3.0;
};

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
      {"tan", UnaryOp::Tan, 0, 0, [](double x) { return 1.0 / (std::cos(x) * std::cos(x)); }, -1.2, 1.2},
      {"asin", UnaryOp::Asin, 0, 0, [](double x) { return 1.0 / std::sqrt(1 - x * x); }, -0.9, 0.9},
      {"acos", UnaryOp::Acos, 0, 0, [](double x) { return -1.0 / std::sqrt(1 - x * x); }, -0.9, 0.9},
      {"atan", UnaryOp::Atan, 0, 0, [](double x) { return 1.0 / (1 + x * x); }, -5.0, 5.0},
      {"sinh", UnaryOp::Sinh, 0, 0, [](double x) { return std::cosh(x); }},
      {"cosh", UnaryOp::Cosh, 0, 0, [](double x) { return std::sinh(x); }},
      {"asinh", UnaryOp::Asinh, 0, 0, [](double x) { return 1.0 / std::sqrt(x * x + 1); }, -5.0, 5.0},
      {"acosh", UnaryOp::Acosh, 0, 0, [](double x) { return 1.0 / std::sqrt(x * x - 1); }, 1.3, 5.0},
      {"atanh", UnaryOp::Atanh, 0, 0, [](double x) { return 1.0 / (1 - x * x); }, -0.8, 0.8},
      {"erf", UnaryOp::Erf, 0, 0, [pi](double x) { return 2.0 / std::sqrt(pi) * std::exp(-x * x); }},
      {"erfc", UnaryOp::Erfc, 0, 0, [pi](double x) { return -2.0 / std::sqrt(pi) * std::exp(-x * x); }},
      {"expm1", UnaryOp::Expm1, 0, 0, [](double x) { return std::exp(x); }, -1.5, 3.0},
      {"exp2", UnaryOp::Exp2, 0, 0, [](double x) { return std::exp2(x) * std::log(2.0); }},
      {"log2", UnaryOp::Log2, 0, 0, [](double x) { return 1.0 / (x * std::log(2.0)); }, 0.1, 4.0},
      {"log10", UnaryOp::Log10, 0, 0, [](double x) { return 1.0 / (x * std::log(10.0)); }, 0.1, 4.0},
      {"logsigmoid", UnaryOp::LogSigmoid, 0, 0, [](double x) { return 1.0 / (1 + std::exp(x)); }, -8.0, 8.0},
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

// ---- the differentiable ops: autograd/ops/unary.h --------------------------------------

// Their gradchecks: the differentiable op table (tests/cpu/test_grad_table.cpp).

TEST_CASE("autograd ops: unary nodes are named, keep x or y, and work on 0-d and empty tensors") {
  Tensor x = leaf({3}, 4);
  CHECK(gelu(x).grad_fn_name() == "GeluBackward");
  CHECK(gelu_tanh(x).grad_fn_name() == "GeluTanhBackward");
  CHECK(frugal::pow(x, 2.0).grad_fn_name() == "PowBackward");
  CHECK(relu(x).grad_fn_name() == "ReluBackward");
  // exp keeps its output: changing it in place is caught in backward.
  Tensor y = frugal::exp(x);
  ops::mul_(y, 2.0);
  check_error([&] { sum(y).backward(); }, {"ExpBackward", "modified by an in-place"});
  // ... while gelu keeps its input, so its output may change.
  Tensor z = gelu(x);
  ops::mul_(z, 2.0);
  sum(z).backward();
  CHECK(x.grad().defined());
  Tensor s = leaf({}, 5);
  check_gradcheck([](const TensorList& in) { return silu(in[0]); }, {s});
  Tensor e = zeros({0, 2}, kFloat64);
  e.requires_grad_();
  Tensor ye = sigmoid(e);
  ye.backward(zeros({0, 2}, kFloat64));
  CHECK(e.grad().sizes() == Shape{0, 2});
  // Without grad mode or inputs that require grad nothing is recorded.
  CHECK_FALSE(relu(x.detach()).requires_grad());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(relu(x).requires_grad());
  }
  // Integer tensors pass through the ops that take them.
  CHECK(values_of(frugal::abs(from_vector(std::vector<int64_t>{-3, 2}, {2}))) == std::vector<double>{3, 2});
}
