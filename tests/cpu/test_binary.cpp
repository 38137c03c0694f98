// Binary elementwise ops on the CPU against naive float64 loops written here:
// broadcasting, non-contiguous operands, type promotion, comparisons, where,
// masked_fill, in-place ops (results, version bumps, aliasing) and every error path; the
// differentiable ops (autograd/ops/binary.h) and the Tensor operators through gradcheck in
// float64 (broadcast and non-contiguous inputs), ties, and gradients of mixed dtypes.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/cpu/binary_reference.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

double small_atol(DType t) { return t == kFloat64 ? 1e-13 : t == kFloat32 ? 1e-6 : default_rtol(t) * 0.05; }

using RefFn = std::function<double(double, double)>;

std::vector<double> reference(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> out;
  for (double v : values_of(x)) out.push_back(f(v));
  return out;
}

double max_ref(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
double min_ref(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  RefFn ref;
  double b_lo = -2.0, b_hi = 2.0;  // range of b (a is in [0.25, 2) for pow, else [-2, 2))
};

std::vector<BinaryCase> arithmetic_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b); },
       [](double a, double b) { return a + b; }},
      {"add(alpha=2.5)", [](const Tensor& a, const Tensor& b) { return ops::add(a, b, 2.5); },
       [](double a, double b) { return a + 2.5 * b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return ops::sub(a, b); },
       [](double a, double b) { return a - b; }},
      {"sub(alpha=0.5)", [](const Tensor& a, const Tensor& b) { return ops::sub(a, b, 0.5); },
       [](double a, double b) { return a - 0.5 * b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); },
       [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return ops::div(a, b); }, [](double a, double b) { return a / b; },
       0.25, 2.0},
      {"maximum", [](const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }, max_ref},
      {"minimum", [](const Tensor& a, const Tensor& b) { return ops::minimum(a, b); }, min_ref},
      {"pow", [](const Tensor& a, const Tensor& b) { return ops::pow(a, b); },
       [](double a, double b) { return std::pow(a, b); }},
  };
}

struct ShapePair {
  Shape a, b, out;
};
const std::vector<ShapePair> kShapePairs = {
    {{4, 5}, {4, 5}, {4, 5}}, {{3, 1, 5}, {4, 5}, {3, 4, 5}}, {{2, 3}, {1}, {2, 3}}, {{4, 1}, {1, 6}, {4, 6}},
    {{6}, {3, 1}, {3, 6}},    {{}, {2, 3}, {2, 3}},           {{5, 4}, {}, {5, 4}},
};

}  // namespace

TEST_CASE("binary: arithmetic ops broadcast and match float64 loops in every dtype and layout") {
  uint64_t seed = 100;
  for (const BinaryCase& c : arithmetic_cases()) {
    const bool is_pow = c.name == "pow";
    for (DType dt : kFloatTypes) {
      for (const ShapePair& sp : kShapePairs) {
        for (Layout layout : kAllLayouts) {
          const std::string what = c.name + " " + dtype_name(dt) + " " + shape_str(sp.a) + " with " + shape_str(sp.b) +
                                   " " + layout_name(layout);
          const Tensor a = random_tensor(sp.a, {dt}, seed++, layout, is_pow ? 0.25 : -2.0, 2.0);
          const Tensor b = random_tensor(sp.b, {dt}, seed++, layout, c.b_lo, c.b_hi);
          const Tensor out = c.op(a, b);
          REQUIRE_MESSAGE(out.sizes() == sp.out, what);
          REQUIRE_MESSAGE(out.dtype() == dt, what);
          CHECK_MESSAGE(out.is_contiguous(), what);
          check_close(out, reference(a, b, sp.out, c.ref), default_rtol(dt), small_atol(dt), what);
        }
      }
    }
  }
}

TEST_CASE("binary: a large broadcast runs the parallel strided path") {
  const Tensor a = random_tensor({64, 1, 700}, {kFloat32}, 1, Layout::Strided);
  const Tensor b = random_tensor({90, 700}, {kFloat32}, 2, Layout::Transposed);
  const Tensor out = ops::mul(a, b);
  check_close(out, reference(a, b, {64, 90, 700}, [](double x, double y) { return x * y; }), 1e-6, 0, "mul large");
}

TEST_CASE("binary: integer arithmetic is exact") {
  for (DType dt : {kInt32, kInt64}) {
    const Tensor a = make_tensor({-7, -1, 0, 3, 12, 5}, {2, 3}, {dt});
    const Tensor b = make_tensor({2, -3, 4}, {3}, {dt}, Layout::Strided);
    const std::string name = dtype_name(dt);
    REQUIRE(ops::add(a, b).dtype() == dt);
    check_close(ops::add(a, b), reference(a, b, {2, 3}, [](double x, double y) { return x + y; }), 0, 0, "add " + name);
    check_close(ops::add(a, b, 3), reference(a, b, {2, 3}, [](double x, double y) { return x + 3 * y; }), 0, 0,
                "add alpha=3 " + name);
    check_close(ops::sub(a, b), reference(a, b, {2, 3}, [](double x, double y) { return x - y; }), 0, 0, "sub " + name);
    check_close(ops::mul(a, b), reference(a, b, {2, 3}, [](double x, double y) { return x * y; }), 0, 0, "mul " + name);
    check_close(ops::maximum(a, b), reference(a, b, {2, 3}, max_ref), 0, 0, "maximum " + name);
    check_close(ops::minimum(a, b), reference(a, b, {2, 3}, min_ref), 0, 0, "minimum " + name);
    // True division of integers gives float32.
    const Tensor q = ops::div(a, b);
    CHECK(q.dtype() == kFloat32);
    check_close(q, reference(a, b, {2, 3}, [](double x, double y) { return x / y; }), 1e-6, 0, "div " + name);
  }
  // Integer pow: repeated squaring; negative exponents follow PyTorch (1, +-1, else 0).
  const Tensor base = make_tensor({2, 3, -2, 1, -1, -1, 5, 0}, {8}, {kInt64});
  const Tensor expo = make_tensor({10, 3, 3, -4, -3, -2, -1, 0}, {8}, {kInt64});
  check_close(ops::pow(base, expo), {1024, 27, -8, 1, -1, 1, 0, 1}, 0, 0, "int pow");
  // 0 / 0 and x / 0 in true division.
  const Tensor z = ops::div(make_tensor({0, 1, -1}, {3}, {kInt32}), make_tensor({0, 0, 0}, {3}, {kInt32}));
  check_close(z, {NAN, INFINITY, -INFINITY}, 0, 0, "int div by zero");
}

TEST_CASE("binary: NaN propagates through maximum and minimum") {
  const Tensor a = make_tensor({NAN, 1.0, 2.0}, {3}, {kFloat32});
  const Tensor b = make_tensor({1.0, NAN, 3.0}, {3}, {kFloat32});
  check_close(ops::maximum(a, b), {NAN, NAN, 3.0}, 0, 0, "maximum NaN");
  check_close(ops::minimum(a, b), {NAN, NAN, 2.0}, 0, 0, "minimum NaN");
}

TEST_CASE("binary: mixed dtypes promote as PyTorch and convert on the fly") {
  struct Mixed {
    DType a, b, out;
  };
  const Mixed cases[] = {
      {kFloat16, kFloat32, kFloat32}, {kFloat32, kFloat16, kFloat32}, {kFloat16, kBFloat16, kFloat32},
      {kInt32, kFloat16, kFloat16},   {kBFloat16, kInt64, kBFloat16}, {kFloat64, kFloat32, kFloat64},
      {kInt32, kInt64, kInt64},       {kBool, kInt32, kInt32},        {kBool, kFloat32, kFloat32},
  };
  uint64_t seed = 500;
  for (const Mixed& m : cases) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(m.a)) + " with " + dtype_name(m.b) + " " + layout_name(layout);
      // Small integers so that integer and bool operands hold exact values.
      auto make = [&](DType dt, const Shape& s) {
        std::vector<double> v = random_values(numel_of(s), seed++, -4.0, 4.0);
        for (double& x : v) x = dt == kBool ? double(x > 0) : is_floating(dt) ? x : std::round(x);
        return make_tensor(v, s, {dt}, layout);
      };
      const Tensor a = make(m.a, {3, 1, 5}), b = make(m.b, {4, 5});
      const Tensor sum = ops::add(a, b, 2);
      REQUIRE_MESSAGE(sum.dtype() == m.out, what);
      REQUIRE(sum.sizes() == Shape{3, 4, 5});
      // Each operand is first converted to the result dtype (exact here), then added.
      const double rtol = default_rtol(m.out);
      check_close(sum, reference(a, b, {3, 4, 5}, [](double x, double y) { return x + 2 * y; }), rtol, 0,
                  "add " + what);
      check_close(ops::mul(a, b), reference(a, b, {3, 4, 5}, [](double x, double y) { return x * y; }), rtol, 0,
                  "mul " + what);
      check_close(ops::lt(a, b), reference(a, b, {3, 4, 5}, [](double x, double y) { return double(x < y); }), 0, 0,
                  "lt " + what);
    }
  }
  // int32 + f16: the integer is rounded to half first, as if cast (2049 -> 2048).
  const Tensor big = make_tensor({2049}, {1}, {kInt32});
  check_close(ops::add(big, make_tensor({0.0}, {1}, {kFloat16})), {2048}, 0, 0, "int32 + f16 rounds the int to half");
}

TEST_CASE("binary: tensor-scalar ops and their result dtypes") {
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      const Tensor x = random_tensor({5, 6}, {dt}, 7, layout, 0.5, 2.0);
      const double rtol = default_rtol(dt), atol = small_atol(dt);
      CHECK(ops::add(x, 1.5).dtype() == dt);
      check_close(ops::add(x, 1.5), reference(x, [](double v) { return v + 1.5; }), rtol, atol, "add " + what);
      check_close(ops::sub(x, 0.75), reference(x, [](double v) { return v - 0.75; }), rtol, atol, "sub " + what);
      check_close(ops::mul(x, -3.0), reference(x, [](double v) { return v * -3.0; }), rtol, atol, "mul " + what);
      check_close(ops::div(x, 4.5), reference(x, [](double v) { return v / 4.5; }), rtol, atol, "div " + what);
    }
  }
  const Tensor i = make_tensor({1, -2, 3}, {3}, {kInt32});
  // A fractional scalar makes an integer tensor float32; an integral one keeps it integer.
  CHECK(ops::add(i, 0.5).dtype() == kFloat32);
  check_close(ops::add(i, 0.5), {1.5, -1.5, 3.5}, 0, 0, "int32 + 0.5");
  CHECK(ops::mul(i, 2.0).dtype() == kInt32);
  check_close(ops::mul(i, 2.0), {2, -4, 6}, 0, 0, "int32 * 2");
  CHECK(ops::sub(i, 1.0).dtype() == kInt32);
  check_close(ops::sub(i, 1.0), {0, -3, 2}, 0, 0, "int32 - 1");
  CHECK(ops::div(i, 2.0).dtype() == kFloat32);
  check_close(ops::div(i, 2.0), {0.5, -1, 1.5}, 0, 0, "int32 / 2 is true division");
  CHECK(ops::add(i, INFINITY).dtype() == kFloat32);
  // A bool tensor with an integral scalar gives int64, as in PyTorch.
  const Tensor bo = make_tensor({1, 0}, {2}, {kBool});
  CHECK(ops::add(bo, 1.0).dtype() == kInt64);
  check_close(ops::add(bo, 1.0), {2, 1}, 0, 0, "bool + 1");
  // f16 tensor with a scalar keeps f16 (the scalar never widens).
  CHECK(ops::mul(make_tensor({1}, {1}, {kFloat16}), 1e-3).dtype() == kFloat16);
}

TEST_CASE("binary: comparisons, tensor-tensor (broadcast) and tensor-scalar") {
  using Cmp = std::function<bool(double, double)>;
  struct CmpCase {
    const char* name;
    Tensor (*tt)(const Tensor&, const Tensor&);
    Tensor (*ts)(const Tensor&, double);
    Cmp ref;
  };
  const CmpCase cases[] = {
      {"eq", ops::eq, ops::eq, [](double a, double b) { return a == b; }},
      {"ne", ops::ne, ops::ne, [](double a, double b) { return a != b; }},
      {"lt", ops::lt, ops::lt, [](double a, double b) { return a < b; }},
      {"le", ops::le, ops::le, [](double a, double b) { return a <= b; }},
      {"gt", ops::gt, ops::gt, [](double a, double b) { return a > b; }},
      {"ge", ops::ge, ops::ge, [](double a, double b) { return a >= b; }},
  };
  uint64_t seed = 900;
  for (const CmpCase& c : cases) {
    for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
      for (Layout layout : kAllLayouts) {
        const std::string what = std::string(c.name) + " " + dtype_name(dt) + " " + layout_name(layout);
        // Values in {-1, -0.5, 0, 0.5, 1} (integers in {-2..2}) so that ties occur.
        auto make = [&](const Shape& s) {
          std::vector<double> v = random_values(numel_of(s), seed++, -2.5, 2.5);
          for (double& x : v) x = is_floating(dt) ? std::round(x) * 0.5 : std::round(x);
          return make_tensor(v, s, {dt}, layout);
        };
        const Tensor a = make({3, 1, 5}), b = make({4, 5});
        const Tensor r = c.tt(a, b);
        REQUIRE_MESSAGE(r.dtype() == kBool, what);
        check_close(r, reference(a, b, {3, 4, 5}, [&](double x, double y) { return double(c.ref(x, y)); }), 0, 0, what);
        const double s = is_floating(dt) ? 0.5 : 1.0;
        const Tensor rs = c.ts(a, s);
        REQUIRE_MESSAGE(rs.dtype() == kBool, what);
        check_close(rs, reference(a, [&](double x) { return double(c.ref(x, s)); }), 0, 0, what + " scalar");
      }
    }
  }
  // Mixed: int32 against float32 compares in float32; int tensor against a fractional scalar.
  const Tensor i = make_tensor({0, 1, 2}, {3}, {kInt32});
  check_close(ops::lt(i, make_tensor({0.5, 0.5, 2.5}, {3}, {kFloat32})), {1, 0, 1}, 0, 0, "int32 < f32");
  check_close(ops::gt(i, 0.5), {0, 1, 1}, 0, 0, "int32 > 0.5");
  // Bool tensors compare too.
  const Tensor bt = make_tensor({1, 0, 1}, {3}, {kBool});
  check_close(ops::eq(bt, make_tensor({1, 1, 0}, {3}, {kBool})), {1, 0, 0}, 0, 0, "bool == bool");
  check_close(ops::eq(bt, 1.0), {1, 0, 1}, 0, 0, "bool == 1");
  // A half holding half(0.1) equals the scalar 0.1 (the scalar is rounded to half first).
  check_close(ops::eq(make_tensor({0.1}, {1}, {kFloat16}), 0.1), {1}, 0, 0, "f16 == 0.1");
  // NaN compares unequal to everything.
  const Tensor nan = make_tensor({NAN}, {1}, {kFloat32});
  check_close(ops::eq(nan, nan), {0}, 0, 0, "NaN == NaN");
  check_close(ops::ne(nan, nan), {1}, 0, 0, "NaN != NaN");
}

TEST_CASE("binary: logical_not, logical_and, logical_or") {
  const Tensor a = make_tensor({1, 0, 1, 0}, {4, 1}, {kBool});
  const Tensor b = make_tensor({1, 0, 1}, {3}, {kBool}, Layout::Strided);
  const Tensor n = ops::logical_not(a);
  CHECK(n.dtype() == kBool);
  check_close(n, {0, 1, 0, 1}, 0, 0, "logical_not");
  const Tensor land = ops::logical_and(a, b), lor = ops::logical_or(a, b);
  CHECK(land.dtype() == kBool);
  CHECK(land.sizes() == Shape{4, 3});
  check_close(land, reference(a, b, {4, 3}, [](double x, double y) { return double(x && y); }), 0, 0, "logical_and");
  check_close(lor, reference(a, b, {4, 3}, [](double x, double y) { return double(x || y); }), 0, 0, "logical_or");
  // Other dtypes count as x != 0.
  const Tensor f = make_tensor({0.0, 2.5, -1.0}, {3}, {kFloat32});
  const Tensor i = make_tensor({3, 0, 0}, {3}, {kInt64});
  check_close(ops::logical_not(f), {1, 0, 0}, 0, 0, "logical_not f32");
  check_close(ops::logical_and(f, i), {0, 0, 0}, 0, 0, "logical_and f32 int64");
  check_close(ops::logical_or(f, i), {1, 1, 1}, 0, 0, "logical_or f32 int64");
}

TEST_CASE("binary: where copies the chosen operand's bytes: NaN payloads, -0, every dtype and layout") {
  // The CPU selects by a blend of bits (tensor/cpu/binary.cpp); each output must be the
  // bytes of a or b as the condition says, whatever they hold.
  uint64_t seed = 1250;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool})
    for (Layout layout : kAllLayouts) {
      CAPTURE(name_of(dt, layout));
      const int64_t n = 37;
      std::vector<double> cv = random_values(n, seed++);
      for (double& x : cv) x = double(x > 0);
      auto make = [&](double special) {
        std::vector<double> v = random_values(n, seed++, -3.0, 3.0);
        for (int64_t i = 0; i < n; ++i) {
          double& x = v[size_t(i)];
          if (dt == kBool) x = double(x > 0);
          else if (!is_floating(dt)) x = std::round(x);
          else if (i % 5 == 0) x = special;
        }
        return make_tensor(v, {n}, {dt}, layout);
      };
      const Tensor cond = make_tensor(cv, {n}, {kBool}, layout);
      const Tensor a = make(std::numeric_limits<double>::quiet_NaN()), b = make(-0.0);
      const std::vector<uint8_t> out = bytes_of(ops::where(cond, a, b).contiguous());
      const std::vector<uint8_t> ab = bytes_of(a.contiguous()), bb = bytes_of(b.contiguous());
      const size_t size = element_size(dt);
      std::vector<uint8_t> want;
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<uint8_t>& from = cv[size_t(i)] != 0 ? ab : bb;
        want.insert(want.end(), from.begin() + i * int64_t(size), from.begin() + (i + 1) * int64_t(size));
      }
      CHECK(out == want);
    }
}

TEST_CASE("binary: where broadcasts three ways and promotes a and b") {
  uint64_t seed = 1300;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      std::vector<double> cv = random_values(15, seed++);
      for (double& x : cv) x = double(x > 0);
      const Tensor cond = make_tensor(cv, {3, 1, 5}, {kBool}, layout);
      auto make = [&](const Shape& s) {
        std::vector<double> v = random_values(numel_of(s), seed++, -3.0, 3.0);
        for (double& x : v) x = dt == kBool ? double(x > 0) : is_floating(dt) ? x : std::round(x);
        return make_tensor(v, s, {dt}, layout);
      };
      const Tensor a = make({4, 5}), b = make({5});
      const Tensor out = ops::where(cond, a, b);
      REQUIRE_MESSAGE(out.dtype() == dt, what);
      REQUIRE(out.sizes() == Shape{3, 4, 5});
      const std::vector<double> vc = values_of(cond), va = values_of(a), vb = values_of(b);
      std::vector<double> expected;
      for (int64_t i = 0; i < 60; ++i) {
        const auto idx = unravel(i, {3, 4, 5});
        expected.push_back(vc[broadcast_index(idx, {3, 1, 5})] != 0 ? va[broadcast_index(idx, {4, 5})]
                                                                    : vb[broadcast_index(idx, {5})]);
      }
      check_close(out, expected, 0, 0, "where " + what);
    }
  }
  const Tensor cond = make_tensor({1, 0}, {2}, {kBool});
  const Tensor w = ops::where(cond, make_tensor({1.5, 2.5}, {2}, {kFloat16}), make_tensor({7, 8}, {2}, {kFloat32}));
  CHECK(w.dtype() == kFloat32);
  check_close(w, {1.5, 8}, 0, 0, "where f16/f32");
  const Tensor wi = ops::where(cond, make_tensor({1, 2}, {2}, {kInt32}), make_tensor({0.25}, {1}, {kFloat64}));
  CHECK(wi.dtype() == kFloat64);
  check_close(wi, {1, 0.25}, 0, 0, "where int32/f64");
}

TEST_CASE("binary: masked_fill and masked_fill_") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      const Tensor x = make_tensor(random_values(12, 3, -5, 5), {3, 4}, {dt}, layout);
      const Tensor mask = make_tensor({1, 0, 0, 1}, {4}, {kBool});
      const std::vector<double> before = values_of(x);
      std::vector<double> expected = before;
      for (int64_t i = 0; i < 12; ++i)
        if (i % 4 == 0 || i % 4 == 3) expected[size_t(i)] = -7.0;
      const Tensor out = ops::masked_fill(x, mask, -7.0);
      CHECK(out.dtype() == dt);
      check_close(out, expected, 0, 0, "masked_fill " + what);
      CHECK(values_of(x) == before);
      const uint64_t v0 = x.version();
      const Tensor& same = ops::masked_fill_(x, mask, -7.0);
      CHECK(same.shares_storage(x));
      CHECK(x.version() == v0 + 1);
      check_close(x, expected, 0, 0, "masked_fill_ " + what);
    }
  }
  // Out-of-place masked_fill broadcasts x and mask together; -inf fill (attention masks).
  const Tensor x = make_tensor({1, 2, 3}, {3}, {kFloat32});
  const Tensor mask = make_tensor({0, 1}, {2, 1}, {kBool});
  const Tensor out = ops::masked_fill(x, mask, -INFINITY);
  REQUIRE(out.sizes() == Shape{2, 3});
  check_close(out, {1, 2, 3, -INFINITY, -INFINITY, -INFINITY}, 0, 0, "masked_fill broadcast");
  check_close(ops::masked_fill(make_tensor({1, 0}, {2}, {kBool}), make_tensor({1, 1}, {2}, {kBool}), 0.0), {0, 0}, 0, 0,
              "masked_fill bool");
}

TEST_CASE("binary: in-place ops write into the first argument and bump its version") {
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout);
      const double rtol = default_rtol(dt), atol = small_atol(dt);
      const Tensor b = random_tensor({5}, {dt}, 11, Layout::Contiguous, 0.5, 2.0);
      struct InPlace {
        const char* name;
        std::function<void(const Tensor&)> op;
        RefFn ref;
      };
      const InPlace cases[] = {
          {"add_", [&](const Tensor& a) { ops::add_(a, b, 2.0); }, [](double x, double y) { return x + 2 * y; }},
          {"sub_", [&](const Tensor& a) { ops::sub_(a, b); }, [](double x, double y) { return x - y; }},
          {"mul_", [&](const Tensor& a) { ops::mul_(a, b); }, [](double x, double y) { return x * y; }},
          {"div_", [&](const Tensor& a) { ops::div_(a, b); }, [](double x, double y) { return x / y; }},
          {"add_ scalar", [&](const Tensor& a) { ops::add_(a, 1.25); }, [](double x, double) { return x + 1.25; }},
          {"sub_ scalar", [&](const Tensor& a) { ops::sub_(a, 1.25); }, [](double x, double) { return x - 1.25; }},
          {"mul_ scalar", [&](const Tensor& a) { ops::mul_(a, -0.5); }, [](double x, double) { return x * -0.5; }},
          {"div_ scalar", [&](const Tensor& a) { ops::div_(a, 3.0); }, [](double x, double) { return x / 3.0; }},
      };
      for (const InPlace& c : cases) {
        const Tensor a = random_tensor({4, 5}, {dt}, 12, layout);
        const std::vector<double> expected = reference(a, b, {4, 5}, c.ref);
        const uint64_t v0 = a.version();
        c.op(a);
        CHECK_MESSAGE(a.version() == v0 + 1, c.name, " ", what);
        CHECK(a.dtype() == dt);
        check_close(a, expected, rtol, atol, std::string(c.name) + " " + what);
      }
    }
  }
  // The returned reference is the first argument.
  const Tensor a = ones({3});
  CHECK(&ops::add_(a, 1.0) == &a);
  // A lower-precision output keeps its dtype: f16 += f32 computes in f32, stores f16.
  const Tensor h = make_tensor({1, 2, 3}, {3}, {kFloat16});
  ops::add_(h, make_tensor({0.25, 0.5, 1e-4}, {3}, {kFloat32}));
  CHECK(h.dtype() == kFloat16);
  check_close(h, {1.25, 2.5, 3.0}, 1e-3, 0, "f16 += f32");
  // int += int keeps int; float += int is fine.
  const Tensor i = make_tensor({1, 2}, {2}, {kInt64});
  ops::mul_(i, make_tensor({3, -4}, {2}, {kInt32}));
  check_close(i, {3, -8}, 0, 0, "int64 *= int32");
  const Tensor f = make_tensor({1, 2}, {2}, {kFloat32});
  ops::add_(f, make_tensor({3, 4}, {2}, {kInt32}));
  check_close(f, {4, 6}, 0, 0, "f32 += int32");
}

TEST_CASE("binary: in-place ops are correct when the output aliases an input") {
  const Tensor a = random_tensor({6, 7}, {kFloat32}, 21, Layout::Transposed);
  const std::vector<double> va = values_of(a);
  ops::add_(a, a);  // a += a
  std::vector<double> twice;
  for (double v : va) twice.push_back(2 * v);
  check_close(a, twice, 1e-6, 0, "a += a");
  ops::mul_(a, a);  // a *= a
  std::vector<double> sq;
  for (double v : va) sq.push_back(4 * v * v);
  check_close(a, sq, 1e-6, 0, "a *= a");
  // A different view of the same storage: a += a.t() must read the original values.
  const Tensor m = random_tensor({5, 5}, {kFloat32}, 22);
  const std::vector<double> vm = values_of(m);
  std::vector<double> expected(25);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 5; ++c) expected[r * 5 + c] = vm[r * 5 + c] + vm[c * 5 + r];
  ops::add_(m, m.t());
  check_close(m, expected, 1e-6, 0, "m += m.t()");
  // A row of m broadcast into m itself.
  const Tensor n = random_tensor({4, 3}, {kFloat64}, 23);
  const std::vector<double> vn = values_of(n);
  std::vector<double> e2(12);
  for (int i = 0; i < 12; ++i) e2[i] = vn[i] * vn[i % 3];
  ops::mul_(n, n.select(0, 0));
  check_close(n, e2, 1e-12, 0, "n *= n[0]");
}

TEST_CASE("binary: empty and 0-d tensors") {
  for (DType dt : kFloatTypes) {
    const Tensor e = ops::add(empty({0, 3}, {dt}), random_tensor({3}, {dt}, 1));
    CHECK(e.sizes() == Shape{0, 3});
    CHECK(e.dtype() == dt);
    const Tensor s1 = scalar_tensor(1.5, {dt}), s2 = scalar_tensor(-0.5, {dt});
    const Tensor s = ops::mul(s1, s2);
    CHECK(s.dim() == 0);
    check_close(s, {-0.75}, 0, 0, "0-d * 0-d");
    const Tensor bc = ops::add(s1, ones({2, 2}, {dt}));
    CHECK(bc.sizes() == Shape{2, 2});
    check_close(bc, {2.5, 2.5, 2.5, 2.5}, 0, 0, "0-d + (2, 2)");
  }
  const Tensor e = empty({2, 0}, {kFloat32});
  const uint64_t v0 = e.version();
  ops::add_(e, 1.0);
  CHECK(e.version() == v0 + 1);
  CHECK(ops::eq(e, 0.0).sizes() == Shape{2, 0});
  CHECK(ops::where(empty({0}, {kBool}), empty({0}), empty({0})).numel() == 0);
  CHECK(ops::masked_fill(empty({0, 2}), empty({2}, {kBool}), 1.0).sizes() == Shape{0, 2});
}

TEST_CASE("binary: errors name the op, the shapes and the dtypes") {
  const Tensor a = zeros({2, 3}), b = zeros({4, 3});
  check_error([&] { ops::add(a, b); }, {"add", "[2, 3]", "[4, 3]"});
  check_error([&] { ops::mul(zeros({3, 2}), zeros({3})); }, {"mul", "[3, 2]", "[3]"});
  check_error([&] { ops::eq(a, b); }, {"eq", "[2, 3]", "[4, 3]"});
  check_error([&] { ops::where(zeros({2}, {kBool}), zeros({3}), zeros({2})); }, {"where", "[2]", "[3]"});
  // In place into a smaller shape.
  check_error([&] { ops::add_(zeros({3}), zeros({2, 3})); }, {"add_", "[2, 3]", "[3]"});
  check_error([&] { ops::mul_(zeros({1, 3}), zeros({4, 3})); }, {"mul_", "[4, 3]", "[1, 3]"});
  check_error(
      [&] {
        ops::masked_fill_(zeros({3}), zeros({2, 3}, {kBool}), 1.0);
      },
      {"masked_fill_", "bool[2, 3]", "float32[3]"});
  // In place with a result dtype the output cannot hold.
  check_error([&] { ops::add_(zeros({3}, {kInt32}), zeros({3})); }, {"add_", "float32", "int32[3] cpu"});
  check_error([&] { ops::div_(zeros({3}, {kInt64}), zeros({3}, {kInt64})); }, {"div_", "float32", "int64[3] cpu"});
  check_error([&] { ops::add_(zeros({3}, {kInt32}), 0.5); }, {"add_", "float32", "int32[3]"});
  check_error([&] { ops::mul_(zeros({3}, {kBool}), zeros({3}, {kInt32})); }, {"mul_", "int32", "bool[3]"});
  // In place into an expanded view (several elements share memory).
  check_error([&] { ops::add_(zeros({1, 3}).expand({4, 3}), zeros({4, 3})); }, {"add_", "expanded", "[4, 3]"});
  // Arithmetic on bool.
  const Tensor t = zeros({2}, {kBool});
  check_error([&] { ops::add(t, t); }, {"add", "bool", "logical_or"});
  check_error([&] { ops::sub(t, t); }, {"sub", "bool"});
  check_error([&] { ops::mul(t, t); }, {"mul", "bool"});
  check_error([&] { ops::maximum(t, t); }, {"maximum", "bool"});
  check_error([&] { ops::pow(t, t); }, {"pow", "bool"});
  // Non-integral alpha with an integer result.
  const Tensor i = zeros({2}, {kInt32});
  check_error([&] { ops::add(i, i, 0.5); }, {"add", "alpha", "int32"});
  // Conditions and masks must be bool.
  check_error([&] { ops::where(zeros({2}), zeros({2}), zeros({2})); }, {"where", "bool", "float32[2] cpu"});
  check_error([&] { ops::masked_fill(zeros({2}), zeros({2}), 1.0); }, {"masked_fill", "mask", "bool"});
  check_error([&] { ops::add(Tensor(), zeros({2})); }, {"add", "undefined"});
}

// ---- the differentiable ops: autograd/ops/binary.h and the operators -------------------

TEST_CASE("autograd ops: where picks by a broadcast condition") {
  // Its gradients, and those of the scalar forms, rsub, rdiv and masked_fill: the
  // differentiable op table (tests/cpu/test_grad_table.cpp).
  Tensor x = leaf({3, 4}, 40), p = leaf({3, 4}, 41, 0.5, 2.0);
  const Tensor cond = ops::gt(random_tensor({3, 1}, kFloat64, 42), 0.0);  // broadcasts against (3, 4)
  Tensor w = where(cond, x, p);
  const std::vector<double> wv = values_of(w), xv = values_of(x), pv = values_of(p), cv = values_of(cond);
  for (int i = 0; i < 12; ++i) CHECK(wv[size_t(i)] == (cv[size_t(i / 4)] ? xv[size_t(i)] : pv[size_t(i)]));
}

TEST_CASE("autograd ops: maximum and minimum split the gradient on ties, as PyTorch") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}), b = from_vector(std::vector<double>{1, 0, 5}, {3});
  a.requires_grad_();
  b.requires_grad_();
  sum(maximum(a, b)).backward();
  CHECK(values_of(a.grad()) == std::vector<double>{0.5, 1, 0});
  CHECK(values_of(b.grad()) == std::vector<double>{0.5, 0, 1});
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  sum(minimum(a, b)).backward();
  CHECK(values_of(a.grad()) == std::vector<double>{0.5, 0, 1});
  CHECK(values_of(b.grad()) == std::vector<double>{0.5, 1, 0});
}

TEST_CASE("autograd ops: mixed dtypes give each input its gradient in its own dtype") {
  // f32 (4) + f16 (3, 1) -> f32 (3, 4); g = ones.
  Tensor a = random_tensor({4}, kFloat32, 50), b = random_tensor({3, 1}, kFloat16, 51);
  a.requires_grad_();
  b.requires_grad_();
  Tensor y = add(a, b, 2.0);
  REQUIRE(y.dtype() == kFloat32);
  y.backward(ones({3, 4}));
  REQUIRE(a.grad().dtype() == kFloat32);
  REQUIRE(b.grad().dtype() == kFloat16);
  CHECK(values_of(a.grad()) == std::vector<double>(4, 3.0));
  CHECK(values_of(b.grad()) == std::vector<double>(3, 8.0));
  // mul: grad_a = sum over rows of b, grad_b = sum over columns of a (in f16).
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  mul(a, b).backward(ones({3, 4}));
  REQUIRE(a.grad().dtype() == kFloat32);
  REQUIRE(b.grad().dtype() == kFloat16);
  const std::vector<double> av = values_of(a), bv = values_of(b);
  check_close(a.grad(), std::vector<double>(4, bv[0] + bv[1] + bv[2]), 1e-6, 1e-6, "mul grad a");
  check_close(b.grad(), std::vector<double>(3, av[0] + av[1] + av[2] + av[3]), 2e-3, 2e-3, "mul grad b");
  // div with an f64 numerator that does not require grad and an f32 denominator that does.
  Tensor d = random_tensor({3}, kFloat32, 52, Layout::Contiguous, 1.0, 2.0);
  d.requires_grad_();
  Tensor n = random_tensor({3}, kFloat64, 53);
  Tensor q = div(n, d);
  REQUIRE(q.dtype() == kFloat64);
  sum(q).backward();
  REQUIRE(d.grad().dtype() == kFloat32);
  const std::vector<double> dv = values_of(d), nv = values_of(n);
  check_close(d.grad(), {-nv[0] / (dv[0] * dv[0]), -nv[1] / (dv[1] * dv[1]), -nv[2] / (dv[2] * dv[2])}, 1e-6, 1e-6,
              "div grad");
  // A root gradient in another dtype than its tensor is converted on the way.
  Tensor h = random_tensor({2}, kFloat16, 54);
  h.requires_grad_();
  gelu(h).backward(ones({2}, kFloat32));
  CHECK(h.grad().dtype() == kFloat16);
}

TEST_CASE("autograd ops: operators equal the named functions, values and gradients") {
  Tensor a = leaf({3, 4}, 60), b = leaf({4}, 61, 0.5, 2.0);
  auto same = [](const Tensor& x, const Tensor& y) { CHECK(values_of(x) == values_of(y)); };
  same(a + b, add(a, b));
  same(a - b, sub(a, b));
  same(a * b, mul(a, b));
  same(a / b, div(a, b));
  same(-a, neg(a));
  same(a + 2.0, add(a, 2.0));
  same(2.0 + a, add(a, 2.0));
  same(a - 2.0, sub(a, 2.0));
  same(a * 3.0, mul(a, 3.0));
  same(3.0 * a, mul(a, 3.0));
  same(a / 4.0, div(a, 4.0));
  same(2.0 - a, rsub(a, 2.0));
  same(3.0 / b, rdiv(b, 3.0));
  CHECK((a + b).grad_fn_name() == "AddBackward");
  CHECK((a - 1.0).grad_fn_name() == "SubBackward");
  CHECK((2.0 * a).grad_fn_name() == "MulBackward");
  CHECK((1.0 / b).grad_fn_name() == "ReciprocalBackward");
  // Values against a naive loop.
  const std::vector<double> av = values_of(a), bv = values_of(b), rv = values_of(2.0 - a), qv = values_of(3.0 / b);
  for (size_t i = 0; i < av.size(); ++i) CHECK(rv[i] == doctest::Approx(2.0 - av[i]));
  for (size_t i = 0; i < bv.size(); ++i) CHECK(qv[i] == doctest::Approx(3.0 / bv[i]));
  // A whole expression through the operators.
  check_gradcheck(
      [](const TensorList& in) {
        const Tensor& x = in[0];
        const Tensor& y = in[1];
        return (x - 1.5) * y / (2.0 + x * x) - 0.5 * y + 1.0 / y - (-x) / 3.0 + (1.0 - y) * 2.0;
      },
      {a, b});
  // Integer operands keep PyTorch's promotion: int - 0.5 is float, 2 / int is float.
  const Tensor i = from_vector(std::vector<int32_t>{1, 2}, {2});
  CHECK((0.5 - i).dtype() == kFloat32);
  CHECK(values_of(2.0 / i) == std::vector<double>{2.0, 1.0});
  CHECK((3.0 - i).dtype() == kInt32);
}

TEST_CASE("autograd ops: comparisons and logical ops are re-exported, not differentiable") {
  Tensor a = leaf({4}, 70), b = leaf({4}, 71);
  Tensor m = gt(a, b);
  CHECK(m.dtype() == kBool);
  CHECK_FALSE(m.requires_grad());
  CHECK(values_of(logical_or(eq(a, a), lt(a, 0.0))) == std::vector<double>(4, 1.0));
  CHECK(values_of(logical_not(ne(a, a))) == std::vector<double>(4, 1.0));
  CHECK(values_of(logical_and(ge(a, b), le(a, b))) == values_of(eq(a, b)));
}
