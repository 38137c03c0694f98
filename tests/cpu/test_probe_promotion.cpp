// Probes for silent wrong answers in dtype promotion and elementwise semantics: which dtype a
// binary op between two tensors, a tensor and a C++ scalar, or a dimensioned and a 0-d tensor
// computes in (torch.result_type); which in-place results may be written back (torch.can_cast);
// true division, integer wrap-around, integer pow, comparisons, where/masked_fill, maximum/
// minimum across dtypes; the dtypes of reductions and unary math on integer and bool inputs;
// gradients of mixed-dtype ops. Every expected dtype comes from PyTorch's documented rules,
// written out here as tables (not from frugal's promote_types); every expected value from a
// float64 loop or a closed form. Where frugal refuses what PyTorch accepts, the probe checks
// that the refusal names the op and the dtypes (docs/design.md, "Errors").
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

// The seven dtypes that compute, in the order of the tables below.
constexpr DType kAll[] = {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kBool};
constexpr int kN = 7;

// torch.promote_types(a, b) for two dimensioned tensors (PyTorch docs, "Type promotion":
// bool < integral < floating; within a category the wider type; float16 with bfloat16 gives
// float32, a float16/bfloat16 with any integer keeps the float).
constexpr DType kPromote[kN][kN] = {
    //            f64       f32       f16        bf16       i64        i32        bool
    /* f64  */ {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
    /* f32  */ {kFloat64, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32},
    /* f16  */ {kFloat64, kFloat32, kFloat16, kFloat32, kFloat16, kFloat16, kFloat16},
    /* bf16 */ {kFloat64, kFloat32, kFloat32, kBFloat16, kBFloat16, kBFloat16, kBFloat16},
    /* i64  */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt64, kInt64},
    /* i32  */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kInt32},
    /* bool */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kBool},
};

// torch.result_type(a, b) for a dimensioned a (row) and a 0-d b (column): "If a zero-dimension
// tensor operand has a higher category than dimensioned operands, we promote to a type with
// sufficient size and category to hold all zero-dim tensor operands of that category"; a 0-d
// operand of the same or a lower category does not change the dimensioned operand's dtype.
constexpr DType kPromoteZeroDim[kN][kN] = {
    //            f64        f32        f16        bf16       i64        i32        bool
    /* f64  */ {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
    /* f32  */ {kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32, kFloat32},
    /* f16  */ {kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16, kFloat16},
    /* bf16 */ {kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16, kBFloat16},
    /* i64  */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt64, kInt64},
    /* i32  */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt32, kInt32},
    /* bool */ {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kBool},
};

bool is_float_dt(DType t) { return t == kFloat64 || t == kFloat32 || t == kFloat16 || t == kBFloat16; }

/// Values every one of the seven dtypes holds exactly: halves in [-2, 2] for floats, integers
/// in [-3, 3] for integers (0 excluded, so they can divide), 0/1 for bool.
std::vector<double> exact_values(DType dt, int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, -3.0, 3.0);
  for (double& x : v) {
    if (dt == kBool) x = x > 0 ? 1.0 : 0.0;
    else if (is_float_dt(dt)) x = std::round(x * 2.0) / 2.0;
    else x = std::round(x);
    if (dt != kBool && x == 0.0) x = 1.0;
  }
  return v;
}

/// out[i] = f(a[bi], b[bi]) over the broadcast of a (sa) and b (sb) to `out`, in float64.
template <typename F>
std::vector<double> broadcast_ref(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                                  const Shape& sb, const Shape& out, F&& f) {
  std::vector<double> r(size_t(numel_of(out)));
  for (int64_t i = 0; i < int64_t(r.size()); ++i) {
    const auto idx = unravel(i, out);
    r[size_t(i)] = f(a[size_t(broadcast_index(idx, sa))], b[size_t(broadcast_index(idx, sb))]);
  }
  return r;
}

/// Relative tolerance of one rounding to `t` (0 for exact integer and bool results).
double rtol_of(DType t) { return is_float_dt(t) ? default_rtol(t) : 0.0; }

/// [true, false, true]
Tensor mask3() { return from_vector(std::vector<bool>{true, false, true}, {3}); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Tensor with tensor: every pair of dtypes.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: add/mul/div/lt between every pair of dtypes give torch.result_type and float64 values") {
  uint64_t seed = 11;
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) {
      const DType da = kAll[i], db = kAll[j], want = kPromote[i][j];
      const std::string what = std::string(dtype_name(da)) + " with " + dtype_name(db);
      CAPTURE(what);
      // a: a transposed (3, 4) view broadcast against b: (4,) strided (every other element).
      const Shape sa{3, 4}, sb{4};
      const std::vector<double> va = exact_values(da, 12, seed++), vb = exact_values(db, 4, seed++);
      const Tensor a = make_tensor(va, sa, da, Layout::Transposed), b = make_tensor(vb, sb, db, Layout::Strided);
      // mul and lt are defined on every pair but bool * bool (frugal refuses bool arithmetic,
      // torch.mul computes logical and); sub too (torch refuses bool - bool).
      if (da == kBool && db == kBool) {
        check_error([&] { ops::add(a, b); }, {"add", "bool"});
        check_error([&] { ops::mul(a, b); }, {"mul", "bool"});
      } else {
        // torch refuses subtraction with a bool operand whatever the other's dtype.
        if (da == kBool || db == kBool) check_error([&] { ops::sub(a, b); }, {"sub", "bool"});
        const Tensor s = ops::add(a, b), p = ops::mul(a, b);
        const Tensor d = da == kBool || db == kBool ? ops::add(a, b, -1.0) : ops::sub(a, b);
        REQUIRE(s.dtype() == want);
        REQUIRE(p.dtype() == want);
        REQUIRE(d.dtype() == want);
        // The small values are exact in every dtype, so are their sums and products.
        check_close(s, broadcast_ref(va, sa, vb, sb, sa, [](double x, double y) { return x + y; }), 0, 0,
                    "add " + what);
        check_close(p, broadcast_ref(va, sa, vb, sb, sa, [](double x, double y) { return x * y; }), 0, 0,
                    "mul " + what);
        check_close(d, broadcast_ref(va, sa, vb, sb, sa, [](double x, double y) { return x - y; }), 0, 0,
                    "sub " + what);
      }
      // torch.div (true division): "always promotes integer inputs to the default scalar type".
      const DType want_div = is_float_dt(want) ? want : kFloat32;
      const Tensor q = ops::div(a, b);
      REQUIRE(q.dtype() == want_div);
      check_close(q, broadcast_ref(va, sa, vb, sb, sa, [](double x, double y) { return x / y; }), rtol_of(want_div), 0,
                  "div " + what);
      const Tensor c = ops::lt(a, b);
      REQUIRE(c.dtype() == kBool);
      check_close(c, broadcast_ref(va, sa, vb, sb, sa, [](double x, double y) { return double(x < y); }), 0, 0,
                  "lt " + what);
    }
    // uint8 is storage-only (Note [Storage-only uint8]): every op with it is refused by name.
    const Tensor u = empty({3}, kUInt8), t = ones({3}, kAll[i]);  // uint8 takes no fill either
    check_error([&] { ops::add(t, u); }, {"add", "uint8"});
    check_error([&] { ops::eq(u, t); }, {"eq", "uint8"});
    check_error([&] { ops::where(mask3(), t, u); }, {"where", "uint8"});
  }
}

// ---------------------------------------------------------------------------------------
// Tensor with C++ scalar: the wrapped-number rule.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: a C++ scalar lifts only the category, never the width (torch's wrapped numbers)") {
  // torch.result_type(tensor, 1.5) is the tensor's dtype for every floating tensor, the default
  // float (float32) for integer and bool tensors; an integer scalar keeps an integer tensor's
  // dtype and makes a bool tensor int64. frugal's scalar is a double: an integral value counts
  // as an integer (Note [Binary type promotion]).
  const std::vector<double> v{1.5, -2.0, 3.0};
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
    const Tensor x = make_tensor(v, {3}, dt, Layout::Strided);
    for (double s : {0.25, 3.0, 1e-3}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(s);
      CHECK(ops::add(x, s).dtype() == dt);
      CHECK(ops::mul(x, s).dtype() == dt);
      CHECK(ops::div(x, s).dtype() == dt);
      CHECK(ops::sub(x, s).dtype() == dt);
      check_close(ops::mul(x, s), {1.5 * s, -2.0 * s, 3.0 * s}, default_rtol(dt), 0, "mul");
    }
  }
  // float64 tensors keep the scalar's full precision: 1 + 1e-12 is not rounded through float32.
  CHECK(ops::add(ones({1}, kFloat64), 1e-12).item<double>() == 1.0 + 1e-12);
  // A float16 result overflows to inf in float16, as torch: half(60000) * 2.0 = inf.
  CHECK(std::isinf(ops::mul(full({1}, 60000.0, kFloat16), 2.0).item<double>()));
  // Integer and bool tensors: a fractional scalar gives float32 (not float64), an integral one
  // keeps the integer dtype; bool with an integer scalar gives int64.
  const Tensor i64 = from_vector(std::vector<int64_t>{7, -7, 16777217}, {3});
  const Tensor i32 = from_vector(std::vector<int32_t>{7, -7, 3}, {3});
  const Tensor b = from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK(ops::add(i64, 0.5).dtype() == kFloat32);
  // Computed in float32: 16777217 rounds to 16777216 before adding 0.5 (torch: the int64
  // operand is cast to the float32 result type), and 16777216.5 rounds back to 16777216.
  check_close(ops::add(i64, 0.5), {7.5, -6.5, 16777216.0}, 0, 0, "int64 + 0.5 in float32");
  CHECK(ops::add(i32, 2.0).dtype() == kInt32);
  CHECK(ops::add(i32, 2.0).tolist<int32_t>() == std::vector<int32_t>{9, -5, 5});
  CHECK(ops::add(b, 2.0).dtype() == kInt64);
  CHECK(ops::add(b, 2.0).tolist<int64_t>() == std::vector<int64_t>{3, 2, 3});
  CHECK(ops::mul(b, 0.5).dtype() == kFloat32);
  check_close(ops::mul(b, 0.5), {0.5, 0.0, 0.5}, 0, 0, "bool * 0.5");
  // torch.div of integers is true division whatever the scalar: 7 / 2 = 3.5 in float32.
  CHECK(ops::div(i32, 2.0).dtype() == kFloat32);
  check_close(ops::div(i32, 2.0), {3.5, -3.5, 1.5}, 0, 0, "int32 / 2");
  CHECK(ops::div(b, 2.0).dtype() == kFloat32);
  check_close(ops::div(b, 2.0), {0.5, 0.0, 0.5}, 0, 0, "bool / 2");
  // Non-finite scalars are floating: int tensor + inf is float32 inf, int tensor * NaN is NaN.
  CHECK(ops::add(i32, INFINITY).dtype() == kFloat32);
  check_close(ops::mul(i32, NAN), {NAN, NAN, NAN}, 0, 0, "int32 * NaN");
  // The autograd front end and the C++ operators give the same dtypes.
  CHECK((full({2}, 1.0, kFloat16) * 0.1).dtype() == kFloat16);
  CHECK((i32 + 0.5).dtype() == kFloat32);
  CHECK((2.0 * b).dtype() == kInt64);
}

TEST_CASE("probe promotion: scalar on the left (rsub, rdiv) of integer tensors, as torch.rsub and true division") {
  // torch: 0.5 - x for an int32 x is torch.rsub(x, 0.5): result_type float32, computed as
  // float(0.5) - float(x). At INT32_MIN the exact answer 2147483648.5 rounds to 2^31 in float32.
  const Tensor x = from_vector(std::vector<int32_t>{INT32_MIN, 5, -3, INT32_MAX}, {2, 2}).t();  // a view
  // x^T = [[INT32_MIN, -3], [5, INT32_MAX]]
  const std::vector<double> xs{double(INT32_MIN), -3.0, 5.0, double(INT32_MAX)};
  std::vector<double> want;
  for (double v : xs) want.push_back(double(float(0.5 - v)));  // one rounding of the exact difference
  const Tensor r = 0.5 - x;
  CHECK(r.dtype() == kFloat32);
  check_close(r, want, 0, 0, "0.5 - int32");
  check_close(frugal::rsub(x.to(kInt64), 0.5), want, 0, 0, "0.5 - int64");
  // An integral scalar keeps integer arithmetic, which wraps: 2 - INT32_MIN = INT32_MIN + 2.
  const Tensor ri = 2.0 - x;
  CHECK(ri.dtype() == kInt32);
  CHECK(ri.tolist<int32_t>() == std::vector<int32_t>{INT32_MIN + 2, 5, -3, INT32_MIN + 3});
  // s / x is true division in float32: 1 / 0 = inf, -1 / 0 = -inf, 0 / 0 = NaN.
  const Tensor z = from_vector(std::vector<int32_t>{0, 4, -8}, {3});
  const Tensor q = 2.0 / z;
  CHECK(q.dtype() == kFloat32);
  check_close(q, {INFINITY, 0.5, -0.25}, 0, 0, "2 / int32");
  check_close(-1.0 / z, {-INFINITY, -0.25, 0.125}, 0, 0, "-1 / int32");
  check_close(0.0 / z, {NAN, 0.0, -0.0}, 0, 0, "0 / int32");
  check_close(1.0 / from_vector(std::vector<bool>{true, false}, {2}), {1.0, INFINITY}, 0, 0, "1 / bool");
  // torch refuses subtraction with a bool tensor ("Subtraction, the `-` operator, with a bool
  // tensor is not supported").
  check_error([&] { 1.0 - from_vector(std::vector<bool>{true}, {1}); }, {"rsub", "bool"});
}

// ---------------------------------------------------------------------------------------
// 0-d tensors with dimensioned tensors.
// ---------------------------------------------------------------------------------------

TEST_CASE(
    "probe promotion: a 0-d tensor of the same or a lower category does not raise the dtype (torch.result_type)") {
  uint64_t seed = 300;
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) {
      const DType da = kAll[i], db = kAll[j];
      const std::string what = std::string(dtype_name(da)) + "[2, 3] with 0-d " + dtype_name(db);
      CAPTURE(what);
      const std::vector<double> va = exact_values(da, 6, seed++), vb = exact_values(db, 1, seed++);
      const Tensor a = make_tensor(va, {2, 3}, da, Layout::Transposed), b = make_tensor(vb, {}, db);
      if (da == kBool && db == kBool) continue;  // bool arithmetic is refused (probed above)
      const DType want = kPromoteZeroDim[i][j];
      // Both orders: the rule does not depend on which side the 0-d tensor is.
      const Tensor s = ops::add(a, b), p = ops::mul(b, a);
      CHECK(s.dtype() == want);
      CHECK(p.dtype() == want);
      check_close(s, broadcast_ref(va, {2, 3}, vb, {}, {2, 3}, [](double x, double y) { return x + y; }), 0, 0,
                  "add " + what);
      check_close(p, broadcast_ref(va, {2, 3}, vb, {}, {2, 3}, [](double x, double y) { return x * y; }), 0, 0,
                  "mul " + what);
      CHECK(ops::where(mask3().view({1, 3}), a, b).dtype() == want);  // torch.where uses result_type too
      CHECK(ops::where(mask3().view({1, 3}), b, a).dtype() == want);
      const DType want_div = is_float_dt(want) ? want : kFloat32;
      CHECK(ops::div(a, b).dtype() == want_div);
      // Two 0-d tensors: both "dimensionless", so the plain promote_types applies.
      CHECK(ops::add(make_tensor({1.0}, {}, da), b).dtype() == kPromote[i][j]);
      // A size-0 tensor has a dim, so it counts as dimensioned.
      CHECK(ops::add(zeros({0}, da), b).dtype() == want);
    }
  }
  // The values are those of the result dtype: int32 + 0-d int64 wraps in int32 (torch:
  // tensor([2147483647], int32) + tensor(1) is tensor([-2147483648], int32)).
  const Tensor imax = from_vector(std::vector<int32_t>{INT32_MAX, -5}, {2});
  CHECK(ops::add(imax, scalar_tensor(1.0, kInt64)).tolist<int32_t>() == std::vector<int32_t>{INT32_MIN, -4});
  // float16 holding half(0.1) equals a 0-d float32 0.1: compared in float16, where 0.1 rounds to
  // the same half (in float32 they differ: 0.0999755859375 != 0.100000001490116).
  const Tensor h = full({3}, 0.1, kFloat16);
  CHECK(ops::eq(h, scalar_tensor(0.1, kFloat32)).tolist<bool>() == std::vector<bool>{true, true, true});
  // Scaling a float16 activation by a float32 0-d factor (a norm, a learned temperature) keeps
  // float16, as torch does; the product is float16(2 * 1.5) exactly.
  CHECK(ops::mul(full({4}, 1.5, kFloat16), scalar_tensor(2.0, kFloat32)).dtype() == kFloat16);
  // In place: the 0-d operand does not decide castability either way: int32 += 0-d int64 wraps;
  // int32 += 0-d float32 is refused (torch.can_cast(float32, int32) is False).
  Tensor acc = imax.clone();
  ops::add_(acc, scalar_tensor(1.0, kInt64));
  CHECK(acc.tolist<int32_t>() == std::vector<int32_t>{INT32_MIN, -4});
  check_error([&] { ops::add_(imax.clone(), scalar_tensor(1.0, kFloat32)); }, {"add_", "float32", "int32"});
}

TEST_CASE("probe promotion: gradients of mixed-dtype and 0-d operands come back in each input's dtype") {
  // torch: the gradient of an input has that input's dtype, whatever the op computed in.
  // out = x (f32, [2, 3]) * s (f64, 0-d): torch.result_type is float32; d/dx = s, d/ds = sum(x).
  const std::vector<double> xv{0.5, -1.0, 2.0, 1.5, -0.25, 3.0};
  Tensor x = make_tensor(xv, {2, 3}, kFloat32);
  Tensor s = scalar_tensor(1.5, kFloat64);
  x.requires_grad_();
  s.requires_grad_();
  const Tensor out = frugal::mul(x, s);
  CHECK(out.dtype() == kFloat32);
  frugal::sum(out).backward();
  CHECK(x.grad().dtype() == kFloat32);
  CHECK(s.grad().dtype() == kFloat64);
  check_close(x.grad(), std::vector<double>(6, 1.5), 0, 0, "d/dx x * s");
  double sx = 0;
  for (double v : xv) sx += v;
  check_close(s.grad(), {sx}, 1e-7, 0, "d/ds x * s");

  // out = a (f16, [3]) * b (f32, [2, 3]) + c (bf16, 0-d): the dimensioned f32 wins, so float32;
  // a's gradient sums b over the broadcast dim, in float16; c's is the element count, in bf16.
  const std::vector<double> av{0.5, -1.5, 2.0}, bv{1.0, 2.0, -0.5, 0.25, -1.0, 4.0};
  Tensor a = make_tensor(av, {3}, kFloat16), b = make_tensor(bv, {2, 3}, kFloat32, Layout::Transposed);
  Tensor c = scalar_tensor(0.75, kBFloat16);
  for (Tensor* t : {&a, &b, &c}) t->requires_grad_();
  const Tensor y = frugal::add(frugal::mul(a, b), c);
  CHECK(y.dtype() == kFloat32);
  frugal::sum(y).backward();
  CHECK(a.grad().dtype() == kFloat16);
  CHECK(b.grad().dtype() == kFloat32);
  CHECK(c.grad().dtype() == kBFloat16);
  check_close(a.grad(), {bv[0] + bv[3], bv[1] + bv[4], bv[2] + bv[5]}, 0, 0, "d/da");
  check_close(b.grad(), {av[0], av[1], av[2], av[0], av[1], av[2]}, 0, 0, "d/db");
  check_close(c.grad(), {6.0}, 0, 0, "d/dc");

  // where(cond, f16 leaf, f32 leaf) is float32 (both dimensioned); gradients f16 and f32.
  Tensor p = make_tensor({1.0, 2.0, 3.0}, {3}, kFloat16), q = make_tensor({4.0, 5.0, 6.0}, {3}, kFloat32);
  p.requires_grad_();
  q.requires_grad_();
  const Tensor w = frugal::where(mask3(), p, q);
  CHECK(w.dtype() == kFloat32);
  frugal::sum(frugal::mul(w, 3.0)).backward();
  CHECK(p.grad().dtype() == kFloat16);
  check_close(p.grad(), {3.0, 0.0, 3.0}, 0, 0, "where d/dp");
  check_close(q.grad(), {0.0, 3.0, 0.0}, 0, 0, "where d/dq");

  // x (f32) / i (int64, no grad): float32, d/dx = 1 / i.
  Tensor xd = make_tensor({1.0, 2.0, 3.0}, {3}, kFloat32);
  xd.requires_grad_();
  const Tensor iv = from_vector(std::vector<int64_t>{2, -4, 8}, {3});
  const Tensor qd = frugal::div(xd, iv);
  CHECK(qd.dtype() == kFloat32);
  frugal::sum(qd).backward();
  check_close(xd.grad(), {0.5, -0.25, 0.125}, 0, 0, "d/dx x / int");
}

// ---------------------------------------------------------------------------------------
// In place: torch.can_cast.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: in-place ops write only results that torch.can_cast to self, and wrap in self's dtype") {
  // torch.can_cast(from, to) is False for floating -> integral and for anything but bool -> bool;
  // an in-place op whose result type cannot be cast to self raises ("result type Float can't be
  // cast to the desired output type Int").
  const Tensor mask = from_vector(std::vector<bool>{true, false, true}, {3});
  for (DType self_t : kAll) {
    for (DType other_t : kAll) {
      CAPTURE(dtype_name(self_t));
      CAPTURE(dtype_name(other_t));
      const int i = int(std::find(std::begin(kAll), std::end(kAll), self_t) - std::begin(kAll));
      const int j = int(std::find(std::begin(kAll), std::end(kAll), other_t) - std::begin(kAll));
      const DType res = kPromote[i][j];
      const bool castable = !(is_float_dt(res) && !is_float_dt(self_t)) && !(res != kBool && self_t == kBool);
      const Tensor self = make_tensor({1.0, 0.0, 1.0}, {3}, self_t), other = make_tensor({1.0, 1.0, 0.0}, {3}, other_t);
      if (res == kBool) {
        check_error([&] { ops::add_(self.clone(), other); }, {"add_", "bool"});
      } else if (castable) {
        Tensor t = self.clone();
        ops::add_(t, other);
        CHECK(t.dtype() == self_t);
        check_close(t, {2.0, 1.0, 1.0}, 0, 0, "add_");
      } else {
        check_error([&] { ops::add_(self.clone(), other); }, {"add_", dtype_name(res), dtype_name(self_t)});
        check_error([&] { ops::mul_(self.clone(), other); }, {"mul_", dtype_name(self_t)});
      }
      // div_ is true division: its result is floating, so only a floating self takes it.
      const DType div_res = is_float_dt(res) ? res : kFloat32;
      if (is_float_dt(self_t)) {
        Tensor t = make_tensor({3.0, -1.0, 2.0}, {3}, self_t);
        ops::div_(t, make_tensor({2.0, 1.0, 1.0}, {3}, other_t));  // a bool divisor is all true: 1
        check_close(t, {other_t == kBool ? 3.0 : 1.5, -1.0, 2.0}, 0, 0, "div_");
      } else {
        check_error(
            [&] {
              ops::div_(self.clone(), make_tensor({2.0, 1.0, 1.0}, {3}, other_t));
            },
            {"div_", dtype_name(div_res), dtype_name(self_t)});
      }
    }
  }
  // Scalars: int32 += 0.5 is refused (float32 result), int32 /= 2 too (true division).
  const Tensor i32 = from_vector(std::vector<int32_t>{INT32_MAX, 3}, {2});
  check_error([&] { ops::add_(i32.clone(), 0.5); }, {"add_", "float32", "int32"});
  check_error([&] { ops::div_(i32.clone(), 2.0); }, {"div_", "float32", "int32"});
  check_error([&] { ops::add_(mask.clone(), 1.0); }, {"add_", "bool"});
  // int32 += int64 computes in int64 and writes back wrapped to int32 (torch: the int64 result
  // INT32_MAX + 1 cast to int32 is INT32_MIN).
  Tensor w = i32.clone();
  ops::add_(w, from_vector(std::vector<int64_t>{1, int64_t(1) << 32}, {2}));
  CHECK(w.tolist<int32_t>() == std::vector<int32_t>{INT32_MIN, 3});
  // float16 += float32 rounds once, from the float32 sum: 2048 + 1.0009765625 = 2049.0009765625
  // rounds to 2050 in float16 (through a float16 cast of the operand first it would be 2048 + 1
  // = 2049, a tie, rounded to 2048).
  Tensor h = full({1}, 2048.0, kFloat16);
  ops::add_(h, full({1}, 1.0009765625, kFloat32));
  CHECK(h.item<double>() == 2050.0);
}

// ---------------------------------------------------------------------------------------
// Integer semantics: division, wrap-around, pow.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: integer overflow wraps as two's complement in int32 and int64, mixed widths in the wider") {
  const std::vector<int32_t> a32{INT32_MAX, INT32_MIN, 65536, -46341, 7};
  const std::vector<int32_t> b32{1, -1, 65536, 46341, -9};
  const Tensor a = from_vector(a32, {5}), b = from_vector(b32, {5});
  auto wrap32 = [](int64_t v) { return int32_t(uint32_t(uint64_t(v))); };  // modular (C++20)
  std::vector<int32_t> sum, diff, prod;
  for (size_t k = 0; k < a32.size(); ++k) {
    sum.push_back(wrap32(int64_t(a32[k]) + b32[k]));
    diff.push_back(wrap32(int64_t(a32[k]) - b32[k]));
    prod.push_back(wrap32(int64_t(a32[k]) * b32[k]));
  }
  CHECK(ops::add(a, b).tolist<int32_t>() == sum);
  CHECK(ops::sub(a, b).tolist<int32_t>() == diff);
  CHECK(ops::mul(a, b).tolist<int32_t>() == prod);
  CHECK(ops::add(a, b, 3.0).tolist<int32_t>() == [&] {
    std::vector<int32_t> r;
    for (size_t k = 0; k < a32.size(); ++k) r.push_back(wrap32(int64_t(a32[k]) + 3 * int64_t(b32[k])));
    return r;
  }());
  // int32 with int64 computes in int64: no wrap at 2^31.
  const Tensor b64 = b.to(kInt64);
  std::vector<int64_t> sum64, prod64;
  for (size_t k = 0; k < a32.size(); ++k) {
    sum64.push_back(int64_t(a32[k]) + b32[k]);
    prod64.push_back(int64_t(a32[k]) * b32[k]);
  }
  CHECK(ops::add(a, b64).tolist<int64_t>() == sum64);
  CHECK(ops::mul(b64, a).tolist<int64_t>() == prod64);
  // int64 wraps at 2^63, also through a transposed view.
  const Tensor big = from_vector(std::vector<int64_t>{INT64_MAX, INT64_MIN, int64_t(1) << 62, 3}, {2, 2}).t();
  // big^T = [[INT64_MAX, 2^62], [INT64_MIN, 3]]
  const Tensor two = from_vector(std::vector<int64_t>{2, 2}, {2});
  CHECK(ops::add(big, 1.0).tolist<int64_t>() ==
        std::vector<int64_t>{INT64_MIN, (int64_t(1) << 62) + 1, INT64_MIN + 1, 4});
  CHECK(ops::mul(big, two).tolist<int64_t>() == std::vector<int64_t>{-2, INT64_MIN, 0, 6});
  CHECK(ops::sub(big, two).tolist<int64_t>() ==
        std::vector<int64_t>{INT64_MAX - 2, (int64_t(1) << 62) - 2, INT64_MAX - 1, 1});
  // Integer maximum/minimum are exact beyond 2^53 (no detour through double).
  const Tensor near = from_vector(std::vector<int64_t>{(int64_t(1) << 53) + 1, -(int64_t(1) << 53) - 1}, {2});
  const Tensor other = from_vector(std::vector<int64_t>{int64_t(1) << 53, -(int64_t(1) << 53)}, {2});
  CHECK(ops::maximum(near, other).tolist<int64_t>() ==
        std::vector<int64_t>{(int64_t(1) << 53) + 1, -(int64_t(1) << 53)});
  CHECK(ops::minimum(other, near).tolist<int64_t>() == std::vector<int64_t>{int64_t(1) << 53, -(int64_t(1) << 53) - 1});
  // True division of large int64 values rounds each operand to float32 first (torch: integer
  // inputs are promoted to float32, then divided): (2^40 + 1) / 1 is float32(2^40 + 1) = 2^40.
  const Tensor q = ops::div(from_vector(std::vector<int64_t>{(int64_t(1) << 40) + 1, 7, -7, 0}, {4}),
                            from_vector(std::vector<int64_t>{1, 2, 2, 0}, {4}));
  CHECK(q.dtype() == kFloat32);
  check_close(q, {double(float((int64_t(1) << 40) + 1)), 3.5, -3.5, NAN}, 0, 0, "int64 / int64");
}

TEST_CASE("probe promotion: integer pow (tensor exponents) is exact, wraps, and follows torch's negative exponents") {
  // torch.pow(int tensor, int tensor): repeated squaring in the integer type, wrapping; for a
  // negative exponent ATen's powi gives 1 for base 1, +-1 for base -1 and 0 otherwise (only a
  // negative *scalar* exponent is refused: "Integers to negative integer powers are not allowed").
  const std::vector<int64_t> base{2, 3, -3, 1, -1, -1, 0, 5, 0, 7};
  const std::vector<int64_t> expo{10, 40, 41, -5, -4, -3, 0, -1, 3, 2};
  auto ref = [](int64_t b, int64_t e, bool narrow) -> int64_t {
    if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1;
    for (int64_t k = 0; k < e; ++k) r *= uint64_t(b);  // modular multiplication, then the width's wrap
    return narrow ? int64_t(int32_t(uint32_t(r))) : int64_t(r);
  };
  std::vector<int64_t> want64, want32;
  for (size_t k = 0; k < base.size(); ++k) {
    want64.push_back(ref(base[k], expo[k], false));
    want32.push_back(ref(base[k], expo[k], true));
  }
  const Tensor b64 = from_vector(base, {10}), e64 = from_vector(expo, {10});
  CHECK(ops::pow(b64, e64).dtype() == kInt64);
  CHECK(ops::pow(b64, e64).tolist<int64_t>() == want64);
  const Tensor b32 = b64.to(kInt32), e32 = e64.to(kInt32);
  CHECK(ops::pow(b32, e32).dtype() == kInt32);
  CHECK(ops::pow(b32, e32).to(kInt64).tolist<int64_t>() == want32);
  // int32 base with int64 exponent computes in int64.
  CHECK(ops::pow(b32, e64).dtype() == kInt64);
  CHECK(ops::pow(b32, e64).tolist<int64_t>() == want64);
  // An integer base with a floating exponent is floating: 2 ^ -1 = 0.5, (-8) ^ (1/3) = NaN.
  const Tensor fe = from_vector(std::vector<double>{-1.0, 1.0 / 3.0, 0.5}, {3}, kFloat32);
  const Tensor fp = ops::pow(from_vector(std::vector<int32_t>{2, -8, 9}, {3}), fe);
  CHECK(fp.dtype() == kFloat32);
  check_close(fp, {0.5, NAN, 3.0}, 1e-6, 0, "int ^ float");
  // Bool operands are refused as arithmetic; the unary pow (a double exponent) takes floats only.
  const Tensor bt = from_vector(std::vector<bool>{true, false}, {2});
  check_error([&] { ops::pow(bt, bt); }, {"pow", "bool"});
  check_error([&] { ops::pow(b32, -1.0); }, {"pow", "int32"});
  check_error([&] { ops::pow(b64, 2.0); }, {"pow", "int64"});
}

// ---------------------------------------------------------------------------------------
// Comparisons, where, masked_fill, maximum/minimum across dtypes.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: comparisons compute in the promoted dtype, not in float64") {
  // torch.eq/lt/... compute in torch.result_type of the operands. int64 with float32 compares
  // in float32: 16777217 rounds to 16777216 and equals it; int64 with float64 compares in
  // float64: 2^53 + 1 rounds to 2^53; int32 with float16 compares in float16: 2049 -> 2048.
  const int64_t p24 = int64_t(1) << 24, p53 = int64_t(1) << 53;
  CHECK(ops::eq(from_vector(std::vector<int64_t>{p24 + 1, p24 + 3}, {2}), full({2}, double(p24), kFloat32))
            .tolist<bool>() == std::vector<bool>{true, false});
  CHECK(ops::eq(from_vector(std::vector<int64_t>{p53 + 1}, {1}), full({1}, double(p53), kFloat64)).tolist<bool>() ==
        std::vector<bool>{true});
  CHECK(ops::lt(full({1}, double(p24), kFloat32), from_vector(std::vector<int64_t>{p24 + 1}, {1})).tolist<bool>() ==
        std::vector<bool>{false});
  CHECK(ops::eq(from_vector(std::vector<int32_t>{2049, 2051}, {2}), full({2}, 2048.0, kFloat16)).tolist<bool>() ==
        std::vector<bool>{true, false});
  // int32 with int64 compares exactly: INT32_MAX + 1 is not INT32_MIN.
  CHECK(ops::eq(from_vector(std::vector<int32_t>{INT32_MIN}, {1}), from_vector(std::vector<int64_t>{p24 * 128}, {1}))
            .tolist<bool>() == std::vector<bool>{false});
  // float16 with bfloat16 compares in float32: half(0.1) != bfloat16(0.1).
  CHECK(ops::ne(full({1}, 0.1, kFloat16), full({1}, 0.1, kBFloat16)).tolist<bool>() == std::vector<bool>{true});
  // bool with a number compares as 0/1: true == 1, true < 1.5, false > -0.5.
  const Tensor b = from_vector(std::vector<bool>{true, false}, {2});
  CHECK(ops::eq(b, from_vector(std::vector<int64_t>{1, 1}, {2})).tolist<bool>() == std::vector<bool>{true, false});
  CHECK(ops::lt(b, 1.5).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::gt(b, -0.5).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::ge(b, full({2}, 0.5, kFloat16)).tolist<bool>() == std::vector<bool>{true, false});
  // Size-0 and broadcast: (0, 3) against (3,) gives a (0, 3) bool tensor.
  const Tensor e = ops::le(zeros({0, 3}, kInt32), ones({3}, kFloat16));
  CHECK(e.dtype() == kBool);
  CHECK(e.sizes() == Shape{0, 3});
  // logical_and/or/not accept every dtype as x != 0 (NaN is true, -0.0 is false).
  const Tensor f = from_vector(std::vector<double>{NAN, -0.0, 2.0}, {3}, kFloat16);
  CHECK(ops::logical_not(f).tolist<bool>() == std::vector<bool>{false, true, false});
  CHECK(ops::logical_and(f, from_vector(std::vector<int64_t>{5, 5, 0}, {3})).tolist<bool>() ==
        std::vector<bool>{true, false, false});
}

TEST_CASE("probe promotion: where promotes a and b (torch.where), masked_fill keeps x's dtype (torch.masked_fill)") {
  const Tensor cond = from_vector(std::vector<bool>{true, false, true, false, true, false}, {2, 3});
  const Tensor i32 = from_vector(std::vector<int32_t>{1, 2, 3}, {3});
  const Tensor h = from_vector(std::vector<double>{0.5, -1.5, 2.5, 3.5, -0.5, 1.0}, {3, 2}, kFloat16).t();  // (2, 3)
  // h = [[0.5, 2.5, -0.5], [-1.5, 3.5, 1.0]]
  const Tensor w = ops::where(cond, i32, h);
  CHECK(w.dtype() == kFloat16);
  check_close(w, {1.0, 2.5, 3.0, -1.5, 2.0, 1.0}, 0, 0, "where int32 / float16");
  const Tensor bf = full({1}, 0.1, kBFloat16);
  const Tensor w2 = ops::where(cond, h, bf);  // float16 with bfloat16: float32
  CHECK(w2.dtype() == kFloat32);
  check_close(
      w2, {0.5, double(float(BFloat16(0.1f))), -0.5, double(float(BFloat16(0.1f))), 3.5, double(float(BFloat16(0.1f)))},
      0, 0, "where float16 / bfloat16");
  const Tensor bo = from_vector(std::vector<bool>{false, true, true}, {3});
  CHECK(ops::where(cond, bo, bo).dtype() == kBool);
  const Tensor w3 = ops::where(cond, bo, from_vector(std::vector<int64_t>{7, 8, 9}, {3}));
  CHECK(w3.dtype() == kInt64);
  CHECK(w3.tolist<int64_t>() == std::vector<int64_t>{0, 8, 1, 7, 1, 9});
  // Size-0 operands broadcast to a size-0 result of the promoted dtype.
  CHECK(ops::where(zeros({0, 1}, kBool), i32, h.slice(0, 0, 1)).sizes() == Shape{0, 3});
  CHECK(ops::where(zeros({0, 1}, kBool), i32, h.slice(0, 0, 1)).dtype() == kFloat16);
  // masked_fill: the value takes x's dtype. int32 truncates toward zero (Note [Integer fill
  // values]); bool takes value != 0; float16 rounds the value to the nearest half.
  const Tensor m = from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK(ops::masked_fill(i32, m, 2.7).dtype() == kInt32);
  CHECK(ops::masked_fill(i32, m, 2.7).tolist<int32_t>() == std::vector<int32_t>{2, 2, 2});
  CHECK(ops::masked_fill(i32, m, -2.7).tolist<int32_t>() == std::vector<int32_t>{-2, 2, -2});
  CHECK(ops::masked_fill(bo, m, 0.5).tolist<bool>() == std::vector<bool>{true, true, true});
  CHECK(ops::masked_fill(bo, m, 0.0).tolist<bool>() == std::vector<bool>{false, true, false});
  const Tensor hf = ops::masked_fill(h, m, 0.1);
  CHECK(hf.dtype() == kFloat16);
  const double h01 = double(float(Half(0.1f)));
  check_close(hf, {h01, 2.5, h01, h01, 3.5, h01}, 0, 0, "masked_fill float16");
  // masked_fill with a mask that broadcasts x up: the result has the broadcast shape, x's dtype.
  const Tensor up = ops::masked_fill(i32, cond, -1.0);
  CHECK(up.sizes() == Shape{2, 3});
  CHECK(up.tolist<int32_t>() == std::vector<int32_t>{-1, 2, -1, 1, -1, 3});
}

TEST_CASE("probe promotion: maximum/minimum across dtypes promote like add; clamp keeps the dtype or refuses") {
  // torch.maximum/minimum use torch.result_type; NaN propagates in the promoted dtype.
  const Tensor i32 = from_vector(std::vector<int32_t>{-3, 2049, 4}, {3});
  const Tensor h = from_vector(std::vector<double>{-2.5, 2040.0, NAN}, {3}, kFloat16);
  const Tensor mx = ops::maximum(i32, h), mn = ops::minimum(h, i32);
  CHECK(mx.dtype() == kFloat16);
  CHECK(mn.dtype() == kFloat16);
  check_close(mx, {-2.5, 2048.0, NAN}, 0, 0, "maximum int32 float16");  // 2049 is 2048 in float16
  check_close(mn, {-3.0, 2040.0, NAN}, 0, 0, "minimum float16 int32");
  const Tensor b = from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK(ops::maximum(b, i32).dtype() == kInt32);
  CHECK(ops::maximum(b, i32).tolist<int32_t>() == std::vector<int32_t>{1, 2049, 4});
  CHECK(ops::minimum(i32, from_vector(std::vector<int64_t>{-4, 5, 6}, {3})).tolist<int64_t>() ==
        std::vector<int64_t>{-4, 5, 4});
  check_close(ops::maximum(full({3}, 1.0, kFloat32), h), {1.0, 2040.0, NAN}, 0, 0, "maximum float32 float16");
  CHECK(ops::maximum(full({3}, 1.0, kFloat32), h).dtype() == kFloat32);
  // bool with bool: torch computes logical or/and; frugal refuses bool arithmetic by name.
  check_error([&] { ops::maximum(b, b); }, {"maximum", "bool"});
  // clamp keeps a floating dtype (the bounds are rounded to it with the result), and refuses
  // integer and bool tensors by name (torch.clamp takes them; a refusal, not a wrong answer).
  const Tensor c = ops::clamp(from_vector(std::vector<double>{0.0, 0.5, 1.0}, {3}, kBFloat16), 0.1, 0.7);
  CHECK(c.dtype() == kBFloat16);
  check_close(c, {double(float(BFloat16(0.1f))), 0.5, double(float(BFloat16(0.7f)))}, 0, 0, "clamp bfloat16");
  check_error([&] { ops::clamp(i32, 0.0, 1.0); }, {"clamp", "int32"});
  check_error([&] { ops::clamp(b, 0.0, 1.0); }, {"clamp", "bool"});
}

// ---------------------------------------------------------------------------------------
// Reductions and unary math on integer and bool inputs.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe promotion: reduction dtypes of integer and bool inputs (sum int64, mean refused, amax kept)") {
  // torch.sum: "If dtype is not given, integral and bool inputs are upcast to int64"; torch.mean
  // of an integer tensor raises ("mean(): could not infer output dtype"); amax/amin/max keep the
  // dtype; argmax gives int64.
  const Tensor i32 = from_vector(std::vector<int32_t>{INT32_MAX, 5, INT32_MAX, -7, 1, 2}, {3, 2}).t();  // (2, 3) view
  // i32 = [[INT32_MAX, INT32_MAX, 1], [5, -7, 2]]
  CHECK(ops::sum(i32).dtype() == kInt64);
  CHECK(ops::sum(i32, {1}).tolist<int64_t>() == std::vector<int64_t>{2 * int64_t(INT32_MAX) + 1, 0});
  CHECK(ops::sum(i32, {0}, true).sizes() == Shape{1, 3});
  CHECK(ops::sum(i32, {0}, true).tolist<int64_t>() ==
        std::vector<int64_t>{int64_t(INT32_MAX) + 5, int64_t(INT32_MAX) - 7, 3});
  const Tensor b = from_vector(std::vector<bool>{true, false, true, true, true, false}, {2, 3});
  CHECK(ops::sum(b, {0}).dtype() == kInt64);
  CHECK(ops::sum(b, {0}).tolist<int64_t>() == std::vector<int64_t>{2, 1, 1});
  CHECK(ops::sum(zeros({0, 4}, kInt32), {0}).tolist<int64_t>() == std::vector<int64_t>{0, 0, 0, 0});
  CHECK(ops::sum(zeros({0}, kBool)).dtype() == kInt64);
  // The autograd front end gives the same dtype (and no gradient for an integer result).
  CHECK(frugal::sum(i32).dtype() == kInt64);
  CHECK(frugal::sum(i32).item<int64_t>() == 2 * int64_t(INT32_MAX) + 1);
  // Floating inputs keep their dtype.
  for (DType dt : {kFloat16, kBFloat16, kFloat32, kFloat64}) CHECK(ops::sum(ones({3}, dt)).dtype() == dt);
  // mean and var of integers and bools are refused by name.
  for (const Tensor& t : {i32, i32.to(kInt64), b}) {
    check_error([&] { ops::mean(t); }, {"mean", dtype_name(t.dtype())});
    check_error([&] { frugal::mean(t, {0}); }, {"mean", dtype_name(t.dtype())});
    check_error([&] { ops::var(t); }, {"var", dtype_name(t.dtype())});
  }
  // amax/amin/max keep int32 (exact), argmax is int64.
  CHECK(ops::amax(i32, {1}).dtype() == kInt32);
  CHECK(ops::amax(i32, {1}).tolist<int32_t>() == std::vector<int32_t>{INT32_MAX, 5});
  CHECK(ops::amin(i32, {0}).tolist<int32_t>() == std::vector<int32_t>{5, -7, 1});
  const auto mv = ops::max(i32, 1);
  CHECK(mv.values.dtype() == kInt32);
  CHECK(mv.indices.dtype() == kInt64);
  CHECK(mv.indices.tolist<int64_t>() == std::vector<int64_t>{0, 0});  // first occurrence of a tie
  CHECK(ops::argmin(i32, 1).tolist<int64_t>() == std::vector<int64_t>{2, 1});
  // int64 extremes beyond 2^53 stay exact in amax.
  const int64_t p53 = int64_t(1) << 53;
  CHECK(ops::amax(from_vector(std::vector<int64_t>{p53, p53 + 1, p53 - 1}, {3})).item<int64_t>() == p53 + 1);
}

TEST_CASE("probe promotion: unary math on integer and bool tensors: exact integer ops or a refusal naming the op") {
  // torch.sqrt/exp/... of an integer tensor give float32 ("int_to_float" unary ufuncs); frugal
  // takes floating tensors only for them and must refuse by name, never compute in the integer.
  const Tensor i32 = from_vector(std::vector<int32_t>{4, -9, 0}, {3});
  const Tensor i64 = i32.to(kInt64);
  const Tensor b = from_vector(std::vector<bool>{true, false, true}, {3});
  using UnaryFn = Tensor (*)(const Tensor&);
  const std::pair<const char*, UnaryFn> floating_only[] = {
      {"exp", ops::exp},     {"log", ops::log},   {"sqrt", ops::sqrt},
      {"rsqrt", ops::rsqrt}, {"tanh", ops::tanh}, {"sigmoid", ops::sigmoid},
      {"gelu", ops::gelu},   {"silu", ops::silu}, {"reciprocal", ops::reciprocal},
      {"sin", ops::sin},     {"cos", ops::cos},
  };
  for (const auto& [name, fn] : floating_only) {
    for (const Tensor& t : {i32, i64, b}) {
      CAPTURE(name);
      check_error([&] { fn(t); }, {name, dtype_name(t.dtype())});
    }
  }
  check_error([&] { frugal::sqrt(i32); }, {"sqrt", "int32"});
  check_error([&] { frugal::exp(b); }, {"exp", "bool"});
  // neg, abs, relu and square keep the integer dtype and wrap (torch: same dtype).
  const Tensor edge = from_vector(std::vector<int32_t>{INT32_MIN, -46341, 46341, 3}, {4});
  CHECK(ops::neg(edge).tolist<int32_t>() == std::vector<int32_t>{INT32_MIN, 46341, -46341, -3});
  CHECK(ops::abs(edge).tolist<int32_t>() == std::vector<int32_t>{INT32_MIN, 46341, 46341, 3});
  CHECK(ops::relu(edge).tolist<int32_t>() == std::vector<int32_t>{0, 0, 46341, 3});
  const int32_t sq = int32_t(uint32_t(uint64_t(46341) * 46341u));  // 2147488281 wraps
  CHECK(ops::square(edge).tolist<int32_t>() == std::vector<int32_t>{0, sq, sq, 9});
  // torch refuses negation of bool ("Negation, the `-` operator, on a bool tensor is not
  // supported"); frugal refuses neg/abs/relu/square of bool by name.
  check_error([&] { ops::neg(b); }, {"neg", "bool"});
  check_error([&] { -b; }, {"neg", "bool"});
  check_error([&] { ops::square(b); }, {"square", "bool"});
  check_error([&] { ops::affine(i32, 2.0, 1.0); }, {"affine", "int32"});
}
