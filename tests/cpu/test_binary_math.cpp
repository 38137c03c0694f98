// atan2, hypot, logaddexp, remainder, fmod and the rounded divisions (tensor/ops/binary.h,
// autograd/ops/binary_math.h) on the CPU: float64 loops written here in every dtype, shape pair
// and layout, the special values against PyTorch 1.13's printed outputs, integer division
// against exact long-integer loops (every sign, the minimum integer by -1), the errors, and the
// gradients through gradcheck and gradgradcheck in float64.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary_math.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/cpu/binary_reference.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

using Op = std::function<Tensor(const Tensor&, const Tensor&)>;
using RefFn = std::function<double(double, double)>;
using TensorTensorOp = Tensor (*)(const Tensor&, const Tensor&);  // picks one overload

// The references: the definitions, in float64 (the rounded ones from floor/trunc of the quotient).
double remainder_ref(double a, double b) { return a - b * std::floor(a / b); }
double fmod_ref(double a, double b) { return a - b * std::trunc(a / b); }
double logaddexp_ref(double a, double b) { return std::log(std::exp(a) + std::exp(b)); }

struct MathCase {
  std::string name;
  Op op;
  RefFn ref;
  bool divides;  // b kept away from 0 and a / b away from integers (the steps)
};

std::vector<MathCase> float_cases() {
  return {
      {"atan2", [](const Tensor& a, const Tensor& b) { return ops::atan2(a, b); },
       [](double a, double b) { return std::atan2(a, b); }, false},
      {"hypot", [](const Tensor& a, const Tensor& b) { return ops::hypot(a, b); },
       [](double a, double b) { return std::sqrt(a * a + b * b); }, false},
      {"logaddexp", [](const Tensor& a, const Tensor& b) { return ops::logaddexp(a, b); }, logaddexp_ref, false},
      {"remainder", [](const Tensor& a, const Tensor& b) { return ops::remainder(a, b); }, remainder_ref, true},
      {"fmod", [](const Tensor& a, const Tensor& b) { return ops::fmod(a, b); }, fmod_ref, true},
      {"floor_divide", [](const Tensor& a, const Tensor& b) { return ops::floor_divide(a, b); },
       [](double a, double b) { return std::floor(a / b); }, true},
      {"div(trunc)", [](const Tensor& a, const Tensor& b) { return ops::div(a, b, "trunc"); },
       [](double a, double b) { return std::trunc(a / b); }, true},
  };
}

struct ShapePair {
  Shape a, b, out;
};
const std::vector<ShapePair> kShapePairs = {
    {{4, 5}, {4, 5}, {4, 5}}, {{3, 1, 5}, {4, 5}, {3, 4, 5}}, {{2, 3}, {1}, {2, 3}}, {{4, 1}, {1, 6}, {4, 6}},
    {{}, {2, 3}, {2, 3}},     {{5, 4}, {}, {5, 4}},           {{0, 3}, {3}, {0, 3}}, {{7}, {7}, {7}},
};

/// Divisors with |b| in [0.5, 2], either sign.
std::vector<double> divisors(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, -1.5, 1.5);
  for (double& x : v) x = x < 0 ? x - 0.5 : x + 0.5;
  return v;
}

/// Whether some a / b of the broadcast lies within `margin` of an integer (a step of the
/// division-like ops, where a rounded operand may land on either side).
bool near_step(const Tensor& a, const Tensor& b, const Shape& shape, double margin) {
  for (double q : reference(a, b, shape, [](double x, double y) { return x / y; }))
    if (std::fabs(q - std::round(q)) < margin) return true;
  return false;
}

}  // namespace

TEST_CASE("binary math: every op against float64 loops in every dtype, shape pair and layout") {
  uint64_t seed = 3100;
  for (const MathCase& c : float_cases()) {
    for (DType dt : kFloatTypes) {
      for (const ShapePair& sp : kShapePairs) {
        for (Layout layout : kAllLayouts) {
          const std::string what = c.name + " " + dtype_name(dt) + " " + shape_str(sp.a) + " with " + shape_str(sp.b) +
                                   " " + layout_name(layout);
          Tensor a = random_tensor(sp.a, {dt}, seed++, layout, -6.0, 6.0);
          Tensor b = c.divides ? make_tensor(divisors(numel_of(sp.b), seed++), sp.b, {dt}, layout)
                               : random_tensor(sp.b, {dt}, seed++, layout, -3.0, 3.0);
          // 16-bit operands may put a / b on a step where float64's quotient of the rounded
          // values is exact: draw again (the steps themselves are checked below).
          for (int retry = 0; c.divides && near_step(a, b, sp.out, 0.02) && retry < 50; ++retry)
            a = random_tensor(sp.a, {dt}, seed++, layout, -6.0, 6.0);
          const Tensor out = c.op(a, b);
          REQUIRE_MESSAGE(out.sizes() == sp.out, what);
          REQUIRE_MESSAGE(out.dtype() == dt, what);
          // A result of magnitude < 1 (remainders, angles) is as precise as the operands' ulp.
          const double atol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-6 : default_rtol(dt) * 4;
          check_close(out, reference(a, b, sp.out, c.ref), default_rtol(dt), atol, what);
        }
      }
    }
  }
}

TEST_CASE("binary math: special values match PyTorch 1.13 (signed zeros, infinities, NaN)") {
  auto run = [](const Op& op, const std::vector<double>& a, const std::vector<double>& b,
                const std::vector<double>& expected, const std::string& what) {
    for (DType dt : {kFloat32, kFloat64}) {
      const int64_t n = int64_t(a.size());
      const Tensor out = op(make_tensor(a, {n}, {dt}), make_tensor(b, {n}, {dt}));
      const std::vector<double> got = values_of(out);
      for (int64_t i = 0; i < n; ++i) {
        const double e = expected[size_t(i)], g = got[size_t(i)];
        const std::string at = what + " " + dtype_name(dt) + " at (" + std::to_string(a[size_t(i)]) + ", " +
                               std::to_string(b[size_t(i)]) + "): got " + std::to_string(g);
        if (std::isnan(e)) {
          CHECK_MESSAGE(std::isnan(g), at);
        } else {
          CHECK_MESSAGE((std::isinf(e) ? g == e : std::fabs(g - e) <= 1e-6 * std::fabs(e)), at);
          CHECK_MESSAGE(std::signbit(g) == std::signbit(e), at);
        }
      }
    }
  };
  // torch.atan2 of these pairs, as printed by PyTorch 1.13.
  const double pi = 3.141592653589793;
  run(ops::atan2, {0.0, -0.0, 0.0, -0.0, 1.0, -1.0, kInf, -kInf, kInf, -kInf, kNaN, 1.0, kInf, -kInf},
      {0.0, 0.0, -0.0, -0.0, kInf, -kInf, kInf, kInf, -kInf, -kInf, 1.0, kNaN, 1.0, 1.0},
      {0.0, -0.0, pi, -pi, 0.0, -pi, pi / 4, -pi / 4, 3 * pi / 4, -3 * pi / 4, kNaN, kNaN, pi / 2, -pi / 2}, "atan2");
  run(ops::hypot, {kInf, kNaN, -kInf, 0.0, -0.0}, {kNaN, kInf, 2.0, -0.0, 0.0}, {kInf, kInf, kInf, 0.0, 0.0}, "hypot");
  run(ops::logaddexp, {kInf, -kInf, kInf, -kInf, kNaN, 1.0, 80.0, -80.0, 0.0},
      {kInf, -kInf, -kInf, 3.0, 1.0, kNaN, 80.0, -80.0, 0.0},
      {kInf, -kInf, kInf, 3.0, kNaN, kNaN, 80.0 + std::log(2.0), -80.0 + std::log(2.0), std::log(2.0)}, "logaddexp");
  const std::vector<double> x = {5, -5, 5, -5, -0.0, 0.0, 5, -5, kInf, 1, 0, 3, -3, 7.5, -7.5, -2, 2};
  const std::vector<double> y = {3, 3, -3, -3, 2, -2, kInf, kInf, 2, 0, 0, -kInf, -kInf, 2, 2, 2, -2};
  run(TensorTensorOp(ops::remainder), x, y,
      {2, 1, -1, -2, -0.0, 0.0, 5, kInf, kNaN, kNaN, kNaN, -kInf, -3, 1.5, 0.5, -0.0, 0.0}, "remainder");
  run(TensorTensorOp(ops::fmod), x, y, {2, -2, 2, -2, -0.0, 0.0, 5, -5, kNaN, kNaN, kNaN, 3, -3, 1.5, -1.5, -0.0, 0.0},
      "fmod");
  const std::vector<double> floors = {1, -2, -2, 1, -0.0, -0.0, 0, -1, kNaN, kInf, kNaN, -1, 0, 3, -4, -1, -1};
  run(TensorTensorOp(ops::floor_divide), x, y, floors, "floor_divide");
  run([](const Tensor& a, const Tensor& b) { return ops::div(a, b, "floor"); }, x, y, floors, "div(floor)");
  run([](const Tensor& a, const Tensor& b) { return ops::div(a, b, "trunc"); }, x, y,
      {1, -1, -1, 1, -0.0, -0.0, 0, -0.0, kInf, kInf, kNaN, -0.0, 0, 3, -3, -1, -1}, "div(trunc)");
}

TEST_CASE("binary math: integer division is exact for every sign, the minimum integer by -1 wraps") {
  // Exact references in long integers: floor and truncation quotients and remainders.
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  for (DType dt : {kInt32, kInt64}) {
    std::vector<double> av, bv, rem, mod, fl, tr;
    for (int64_t a = -9; a <= 9; ++a) {
      for (int64_t b = -4; b <= 4; ++b) {
        if (b == 0) continue;
        av.push_back(double(a));
        bv.push_back(double(b));
        fl.push_back(double(floor_div(a, b)));
        tr.push_back(double(a / b));
        rem.push_back(double(a - b * floor_div(a, b)));
        mod.push_back(double(a % b));
      }
    }
    const int64_t n = int64_t(av.size());
    for (Layout layout : kAllLayouts) {
      const std::string what = name_of(dt, layout);
      const Tensor a = make_tensor(av, {n}, {dt}, layout), b = make_tensor(bv, {n}, {dt}, layout);
      REQUIRE(ops::remainder(a, b).dtype() == dt);
      check_close(ops::remainder(a, b), rem, 0, 0, "remainder " + what);
      check_close(ops::fmod(a, b), mod, 0, 0, "fmod " + what);
      check_close(ops::floor_divide(a, b), fl, 0, 0, "floor_divide " + what);
      check_close(ops::div(a, b, "trunc"), tr, 0, 0, "div(trunc) " + what);
      check_close(ops::div(a, b, "floor"), fl, 0, 0, "div(floor) " + what);
    }
    // Tensor-scalar: an integral scalar keeps the integer dtype.
    const Tensor a = make_tensor(av, {n}, {dt});
    CHECK(ops::remainder(a, -3.0).dtype() == dt);
    std::vector<double> r, q, m;
    for (double v : av) {
      r.push_back(double(int64_t(v) - (-3) * floor_div(int64_t(v), -3)));
      q.push_back(double(floor_div(int64_t(v), 4)));
      m.push_back(double(int64_t(v) % 4));
    }
    check_close(ops::remainder(a, -3.0), r, 0, 0, "remainder scalar " + std::string(dtype_name(dt)));
    check_close(ops::floor_divide(a, 4.0), q, 0, 0, "floor_divide scalar " + std::string(dtype_name(dt)));
    check_close(ops::fmod(a, 4.0), m, 0, 0, "fmod scalar " + std::string(dtype_name(dt)));
  }
  // The minimum integer by -1: the quotient wraps to itself (C++ would trap; PyTorch 1.13's CPU
  // kernel dies of SIGFPE), the remainder is 0.
  const double min32 = -2147483648.0, min64 = -9223372036854775808.0;
  const Tensor m32 = make_tensor({min32, min32, 7}, {3}, {kInt32}), m64 = make_tensor({min64, min64, 7}, {3}, {kInt64});
  for (const Tensor& m : {m32, m64}) {
    const double lo = m.dtype() == kInt32 ? min32 : min64;
    const Tensor d = make_tensor({-1, 1, -1}, {3}, {m.dtype()});
    check_close(ops::floor_divide(m, d), {lo, lo, -7}, 0, 0, "min / -1 floor");
    check_close(ops::div(m, d, "trunc"), {lo, lo, -7}, 0, 0, "min / -1 trunc");
    check_close(ops::remainder(m, d), {0, 0, 0}, 0, 0, "min % -1");
    check_close(ops::fmod(m, d), {0, 0, 0}, 0, 0, "fmod(min, -1)");
    check_close(ops::floor_divide(m, -1.0), {lo, lo, -7}, 0, 0, "min / scalar -1");
  }
}

TEST_CASE("binary math: result dtypes follow PyTorch's promotion") {
  const Tensor i32 = make_tensor({1, -2, 3}, {3}, {kInt32}), i64 = make_tensor({4, 5, -6}, {3}, {kInt64});
  const Tensor h = make_tensor({1, 2, 3}, {3}, {kFloat16}), f = make_tensor({1, 2, 3}, {3}, {kFloat32});
  CHECK(ops::atan2(i32, i64).dtype() == kFloat32);  // integer inputs compute in float32, as torch.atan2
  CHECK(ops::hypot(i32, i32).dtype() == kFloat32);
  CHECK(ops::logaddexp(i64, i64).dtype() == kFloat32);
  CHECK(ops::atan2(h, f).dtype() == kFloat32);
  CHECK(ops::atan2(h, i32).dtype() == kFloat16);
  CHECK(ops::remainder(i32, i64).dtype() == kInt64);
  CHECK(ops::remainder(i32, h).dtype() == kFloat16);
  CHECK(ops::floor_divide(i64, 2.0).dtype() == kInt64);
  CHECK(ops::remainder(i64, 2.5).dtype() == kFloat32);  // a fractional scalar lifts the category
  check_close(ops::remainder(make_tensor({5, -5}, {2}, {kInt64}), 2.5), {0, 0}, 0, 0, "int64 % 2.5");
  check_close(ops::fmod(make_tensor({5, -5}, {2}, {kInt64}), 1.5), {0.5, -0.5}, 0, 0, "fmod(int64, 1.5)");
  check_close(ops::atan2(i32, i64), {std::atan2(1.0, 4.0), std::atan2(-2.0, 5.0), std::atan2(3.0, -6.0)}, 1e-6, 0,
              "atan2 of integers");
  // Mixed floats convert on the fly: float16 with float32 in float32.
  const Tensor a16 = make_tensor({5.5, -5.5, 7.25}, {3}, {kFloat16}), b32 = make_tensor({2, 2, -3}, {3}, {kFloat32});
  check_close(ops::remainder(a16, b32), {1.5, 0.5, -1.75}, 0, 0, "remainder f16 with f32");
  check_close(ops::div(a16, b32, "floor"), {2, -3, -3}, 0, 0, "floor f16 with f32");
}

TEST_CASE("binary math: bad input gets a clear error") {
  const Tensor i = make_tensor({1, 2, 3}, {3}, {kInt64}), z = make_tensor({1, 0, 2}, {3}, {kInt64});
  check_error([&] { ops::remainder(i, z); }, {"remainder", "integer division by zero", "int64[3]", "1 zero"});
  check_error([&] { ops::fmod(i, make_tensor({0, 0, 2}, {3}, {kInt32})); }, {"fmod", "by zero", "2 zeros"});
  check_error([&] { ops::floor_divide(i, 0.0); }, {"floor_divide", "by zero", "scalar 0"});
  check_error([&] { ops::div(i, z, "trunc"); }, {"div", "by zero"});
  check_error([&] { ops::div(i, make_tensor({false}, {1}, {kBool}), "floor"); }, {"div", "by zero"});
  check_error([&] { ops::remainder(make_tensor({1}, {1}, {kInt32}), 3e9); }, {"remainder", "3e+09", "int32"});
  check_error([&] { ops::div(i, i, "round"); }, {"div", "rounding_mode", "\"trunc\"", "\"floor\"", "\"round\""});
  check_error([&] { ops::remainder(make_tensor({1}, {1}, {kBool}), make_tensor({1}, {1}, {kBool})); },
              {"remainder", "bool"});
  check_error([&] { ops::atan2(i, make_tensor({1, 2}, {2}, {kFloat32})); }, {"atan2", "[3]", "[2]"});
  check_error([&] { ops::hypot(Tensor(), i); }, {"hypot", "undefined"});
  // Floats divide by zero as IEEE does; an empty integer division divides nothing.
  check_close(ops::remainder(make_tensor({1}, {1}, {kFloat32}), 0.0), {kNaN}, 0, 0, "float % 0");
  CHECK(ops::remainder(empty({0, 3}, {kInt64}), z).sizes() == Shape{0, 3});
}

TEST_CASE("binary math: the differentiable ops pass gradcheck (broadcast, non-contiguous) and gradgradcheck") {
  // a / b kept in (k + 0.2, k + 0.8) for the division-like ops: their steps are no derivatives.
  auto away_from_steps = [](const Tensor& b, uint64_t seed) {
    std::vector<double> q = random_values(b.numel(), seed, -3.0, 3.0), bv = values_of(b);
    for (size_t i = 0; i < q.size(); ++i) q[i] = (std::floor(q[i]) + 0.2 + 0.6 * (q[i] - std::floor(q[i]))) * bv[i];
    Tensor a = make_tensor(q, b.sizes(), {kFloat64});
    a.requires_grad_();
    return a;
  };
  struct GradCase {
    const char* name;
    Op op;
    bool divides;
  };
  const GradCase cases[] = {
      {"atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); }, false},
      {"hypot", [](const Tensor& a, const Tensor& b) { return hypot(a, b); }, false},
      {"logaddexp", [](const Tensor& a, const Tensor& b) { return logaddexp(a, b); }, false},
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, true},
      {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, true},
      {"operator%", [](const Tensor& a, const Tensor& b) { return a % b; }, true},
  };
  uint64_t seed = 4100;
  for (const GradCase& c : cases) {
    INFO(c.name);
    Tensor b = make_tensor(divisors(12, seed++), {3, 4}, {kFloat64});
    b.requires_grad_();
    const Tensor a = c.divides ? away_from_steps(b, seed++) : leaf({3, 4}, seed++);
    // The same, with a broadcast against b's transpose (non-contiguous) and a row.
    const auto f = [&](const TensorList& in) { return c.op(in[0], in[1]); };
    check_gradcheck(f, {a, b});
    check_gradcheck([&](const TensorList& in) { return c.op(in[0].transpose(0, 1), in[1].transpose(0, 1)); }, {a, b});
    Tensor row = make_tensor(divisors(4, seed++), {4}, {kFloat64});
    row.requires_grad_();
    if (!c.divides) check_gradcheck(f, {a, row});
    const autograd::GradcheckResult gg = autograd::gradgradcheck(f, {a, b});
    CHECK_MESSAGE(gg.ok, gg.report);
  }
  // Tensor-scalar: remainder and fmod pass the gradient through.
  const Tensor x = away_from_steps(make_tensor(std::vector<double>(6, 1.5), {2, 3}, {kFloat64}), 77);
  check_gradcheck([](const TensorList& in) { return remainder(in[0], 1.5); }, {x});
  check_gradcheck([](const TensorList& in) { return fmod(in[0], -1.5); }, {x});
  check_gradcheck([](const TensorList& in) { return in[0] % 1.5; }, {x});
}

TEST_CASE("binary math: gradient values, the rounded divisions' zeros, 16-bit gradients in float32") {
  Tensor a = make_tensor({3.0, -5.5}, {2}, {kFloat64}), b = make_tensor({4.0, 2.0}, {2}, {kFloat64});
  a.requires_grad_();
  b.requires_grad_();
  sum(atan2(a, b)).backward();
  check_close(a.grad(), {4.0 / 25, 2.0 / 34.25}, 1e-14, 0, "d atan2 / da");
  check_close(b.grad(), {-3.0 / 25, 5.5 / 34.25}, 1e-14, 0, "d atan2 / db");
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  sum(remainder(a, b)).backward();
  check_close(a.grad(), {1, 1}, 0, 0, "d remainder / da");
  check_close(b.grad(), {-0.0, 3.0}, 0, 0, "d remainder / db = -floor(a / b)");
  for (const char* mode : {"floor", "trunc"}) {
    a.set_grad(Tensor());
    b.set_grad(Tensor());
    Tensor q = div(a, b, mode);
    CHECK(q.requires_grad());
    sum(q).backward();
    check_close(a.grad(), {0, 0}, 0, 0, std::string("d div(") + mode + ") / da");
    check_close(b.grad(), {0, 0}, 0, 0, std::string("d div(") + mode + ") / db");
  }
  // float16: a^2 + b^2 = 180000 overflows float16, not the float32 the formula computes in.
  Tensor h = make_tensor({300.0}, {1}, {kFloat16}), w = make_tensor({-300.0}, {1}, {kFloat16});
  h.requires_grad_();
  w.requires_grad_();
  sum(atan2(h, w)).backward();
  REQUIRE(h.grad().dtype() == kFloat16);
  check_close(h.grad(), {-300.0 / 180000}, 1e-3, 0, "float16 d atan2 / da");
  check_close(w.grad(), {-300.0 / 180000}, 1e-3, 0, "float16 d atan2 / db");
}
