// Probes for silent wrong answers on edge VALUES (the shapes and views were probed in
// test_probe_views.cpp): NaN and +-inf through activations, clamps, reductions, softmax
// and losses; precision of 16-bit sums; pow, sqrt and log at their edges; integer
// scalars, fills and float-to-integer casts outside the integer range; index errors;
// comparisons with NaN; arange counts. Every expectation is PyTorch's documented (or, for
// 1.13 on the CPU, observed) behaviour, or a float64 loop written here; where frugal
// deliberately differs from PyTorch the probe says so.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/index.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/pool.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/softmax.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// The gradient of sum(f(x)) with respect to x, through autograd.
template <typename F>
std::vector<double> grad_of(const std::vector<double>& xv, DType dt, F&& f) {
  Tensor x = make_tensor(xv, {int64_t(xv.size())}, dt);
  x.requires_grad_();
  frugal::sum(f(x)).backward();
  return values_of(x.grad());
}

/// signbit of every element (a float64 copy keeps the sign of zero).
std::vector<bool> signbits(const Tensor& t) {
  std::vector<bool> s;
  for (double v : values_of(t)) s.push_back(std::signbit(v));
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// NaN and infinities through elementwise ops.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: activations at -inf, +inf, NaN and large magnitudes match PyTorch") {
  // Values from torch 1.13 (CPU): torch.nn.functional.<f>(tensor([-inf, inf, nan, -1e30, 0.])).
  // gelu, gelu_tanh and silu give NaN at -inf there (x * 0 and -inf / inf in their formulas).
  const std::vector<double> xv{-kInf, kInf, kNaN, -1e30, 0.0, 1e30};
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = make_tensor(xv, {6}, dt);
    const double big = values_of(x)[5];  // 1e30 rounded to dt (inf in float16)
    check_close(ops::relu(x), {0, kInf, kNaN, 0, 0, big}, 0, 0, "relu");
    check_close(ops::sigmoid(x), {0, 1, kNaN, 0, 0.5, 1}, 0, 0, "sigmoid");
    check_close(ops::tanh(x), {-1, 1, kNaN, -1, 0, 1}, 0, 0, "tanh");
    check_close(ops::gelu(x), {kNaN, kInf, kNaN, dt == kFloat16 ? kNaN : 0, 0, big}, 0, 0, "gelu");
    check_close(ops::gelu_tanh(x), {kNaN, kInf, kNaN, dt == kFloat16 ? kNaN : 0, 0, big}, 0, 0, "gelu_tanh");
    check_close(ops::silu(x), {kNaN, kInf, kNaN, dt == kFloat16 ? kNaN : 0, 0, big}, 0, 0, "silu");
  }
  // Gradients (torch 1.13): sigmoid and tanh saturate to 0 at +-inf; NaN stays NaN.
  const std::vector<double> gx{-kInf, kInf, kNaN, 0.0};
  check_close(grad_of(gx, kFloat32, [](const Tensor& x) { return frugal::sigmoid(x); }), {0, 0, kNaN, 0.25}, 0, 0,
              "sigmoid'");
  check_close(grad_of(gx, kFloat32, [](const Tensor& x) { return frugal::tanh(x); }), {0, 0, kNaN, 1}, 0, 0, "tanh'");
  // relu' from its output: a NaN output passes the gradient (torch's threshold_backward).
  check_close(grad_of(gx, kFloat32, [](const Tensor& x) { return frugal::relu(x); }), {0, 1, 1, 0}, 0, 0, "relu'");
  check_close(grad_of(gx, kFloat32, [](const Tensor& x) { return frugal::gelu(x); }), {kNaN, kNaN, kNaN, 0.5}, 0, 0,
              "gelu'");
  check_close(grad_of(gx, kFloat32, [](const Tensor& x) { return frugal::silu(x); }), {kNaN, kNaN, kNaN, 0.5}, 0, 0,
              "silu'");
}

TEST_CASE("probe values: clamp with NaN input, NaN bounds and crossed bounds (PyTorch: a NaN bound gives NaN)") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = make_tensor({-kInf, -1.0, 0.5, 3.0, kInf, kNaN}, {6}, dt);
    check_close(ops::clamp(x, -0.5, 2.0), {-0.5, -0.5, 0.5, 2.0, 2.0, kNaN}, 0, 0, "clamp");
    check_close(ops::clamp(x, 5.0, 0.0), {0, 0, 0, 0, 0, kNaN}, 0, 0, "lo > hi gives hi");
    check_close(ops::clamp(x, -kInf, kInf), {-kInf, -1.0, 0.5, 3.0, kInf, kNaN}, 0, 0, "infinite bounds");
    // torch.clamp(t, min=nan, max=5.) and (min=0., max=nan): every element NaN.
    check_close(ops::clamp(x, kNaN, 5.0), std::vector<double>(6, kNaN), 0, 0, "NaN lo");
    check_close(ops::clamp(x, 0.0, kNaN), std::vector<double>(6, kNaN), 0, 0, "NaN hi");
  }
  // The gradient passes nowhere when a bound is NaN (torch: (x >= nan) & (x <= hi) is false).
  check_close(grad_of({1.0, 2.0, 3.0}, kFloat32, [](const Tensor& x) { return frugal::clamp(x, kNaN, 5.0); }),
              {0, 0, 0}, 0, 0, "clamp' with a NaN bound");
  check_close(grad_of({-1.0, 1.0, 3.0}, kFloat32, [](const Tensor& x) { return frugal::clamp(x, 0.0, 2.0); }),
              {0, 1, 0}, 0, 0, "clamp'");
}

TEST_CASE("probe values: maximum/minimum, amax/amin, max/argmax/argmin with NaN and infinities") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor a = make_tensor({kNaN, 1.0, -kInf, kInf, 2.0}, {5}, dt);
    const Tensor b = make_tensor({1.0, kNaN, kInf, -kInf, 2.0}, {5}, dt);
    check_close(ops::maximum(a, b), {kNaN, kNaN, kInf, kInf, 2.0}, 0, 0, "maximum");
    check_close(ops::minimum(a, b), {kNaN, kNaN, -kInf, -kInf, 2.0}, 0, 0, "minimum");
    // torch.max(tensor([1, nan, 3, nan]), 0): (nan, 1): the first NaN.
    const Tensor x = make_tensor({1.0, kNaN, 3.0, kNaN, -kInf, kInf}, {6}, dt);
    const ops::ValuesIndices mx = ops::max(x, 0), mn = ops::min(x, 0);
    CHECK(std::isnan(mx.values.item<double>()));
    CHECK(mx.indices.item<int64_t>() == 1);
    CHECK(std::isnan(mn.values.item<double>()));
    CHECK(mn.indices.item<int64_t>() == 1);
    CHECK(ops::argmax(x, 0).item<int64_t>() == 1);
    CHECK(ops::argmin(x, 0).item<int64_t>() == 1);
    // All -inf / all +inf / all NaN: the value itself and index 0.
    const Tensor rows = make_tensor({-kInf, -kInf, -kInf, kInf, kInf, kInf, kNaN, kNaN, kNaN}, {3, 3}, dt);
    check_close(ops::amax(rows, {1}), {-kInf, kInf, kNaN}, 0, 0, "amax rows");
    check_close(ops::amin(rows, {1}), {-kInf, kInf, kNaN}, 0, 0, "amin rows");
    CHECK(ops::argmax(rows, 1).tolist<int64_t>() == std::vector<int64_t>{0, 0, 0});
    CHECK(ops::argmin(rows, 1).tolist<int64_t>() == std::vector<int64_t>{0, 0, 0});
  }
  // Integers have no NaN; the extremes of the type are values like any other.
  const Tensor i = from_vector(std::vector<int64_t>{INT64_MIN, 5, INT64_MAX, INT64_MAX}, {4});
  CHECK(ops::amax(i).item<int64_t>() == INT64_MAX);
  CHECK(ops::amin(i).item<int64_t>() == INT64_MIN);
  CHECK(ops::argmax(i, 0).item<int64_t>() == 2);
}

TEST_CASE("probe values: amax/amin gradients flow to the NaN that won, as max(dim) does") {
  // max(x, dim) routes the gradient to the index of the first NaN; amax's gradient, shared
  // among the elements equal to the result, must not vanish because NaN != NaN.
  // (torch 1.13 gives NaN to every element of such a row; either way the NaN is not lost.)
  const std::vector<double> xv{1.0, kNaN, 2.0, 3.0, 3.0, 0.0};
  Tensor x = make_tensor(xv, {2, 3}, kFloat32);
  x.requires_grad_();
  frugal::sum(frugal::amax(x, {1})).backward();
  const std::vector<double> g = values_of(x.grad());
  CHECK(g[0] == 0.0);
  CHECK((std::isnan(g[1]) || g[1] == 1.0));
  CHECK(g[2] == 0.0);
  check_close({g[3], g[4], g[5]}, {0.5, 0.5, 0.0}, 0, 0, "ties share the gradient");
}

TEST_CASE("probe values: comparisons with NaN are false except ne, for tensors and scalars of every dtype") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor a = make_tensor({kNaN, kNaN, 1.0, kInf}, {4}, dt);
    const Tensor b = make_tensor({kNaN, 1.0, kNaN, kInf}, {4}, dt);
    CHECK(ops::eq(a, b).tolist<bool>() == std::vector<bool>{false, false, false, true});
    CHECK(ops::ne(a, b).tolist<bool>() == std::vector<bool>{true, true, true, false});
    for (const Tensor& r : {ops::lt(a, b), ops::gt(a, b)})
      CHECK(r.tolist<bool>() == std::vector<bool>{false, false, false, false});
    for (const Tensor& r : {ops::le(a, b), ops::ge(a, b)})  // inf <= inf
      CHECK(r.tolist<bool>() == std::vector<bool>{false, false, false, true});
    for (const Tensor& r : {ops::eq(a, kNaN), ops::lt(a, kNaN), ops::le(a, kNaN), ops::gt(a, kNaN), ops::ge(a, kNaN)})
      CHECK(r.tolist<bool>() == std::vector<bool>{false, false, false, false});
    CHECK(ops::ne(a, kNaN).tolist<bool>() == std::vector<bool>{true, true, true, true});
  }
  // An integer tensor against a NaN scalar compares as floats: all false but ne.
  const Tensor i = from_vector(std::vector<int32_t>{0, 1}, {2});
  CHECK(ops::eq(i, kNaN).tolist<bool>() == std::vector<bool>{false, false});
  CHECK(ops::ne(i, kNaN).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::lt(i, kInf).tolist<bool>() == std::vector<bool>{true, true});
  // logical_not(NaN) is false (NaN is truthy), as PyTorch.
  CHECK(ops::logical_not(make_tensor({kNaN, 0.0}, {2}, kFloat32)).tolist<bool>() == std::vector<bool>{false, true});
}

TEST_CASE("probe values: where and masked_fill carry NaN and infinities through untouched") {
  const Tensor c = from_vector(std::vector<bool>{true, false, true, false}, {4});
  const Tensor a = make_tensor({kNaN, kNaN, -kInf, 1.0}, {4}, kFloat32);
  const Tensor b = make_tensor({2.0, kInf, kNaN, -0.0}, {4}, kFloat32);
  const Tensor w = ops::where(c, a, b);
  check_close(w, {kNaN, kInf, -kInf, 0.0}, 0, 0, "where");
  CHECK(signbits(w)[3]);  // -0 kept
  check_close(ops::masked_fill(b, c, kNaN), {kNaN, kInf, kNaN, 0.0}, 0, 0, "masked_fill NaN");
  check_close(
      ops::masked_fill(make_tensor({1, 2}, {2}, kFloat16), from_vector(std::vector<bool>{true, false}, {2}), -kInf),
      {-kInf, 2}, 0, 0, "masked_fill -inf in half");
}

// ---------------------------------------------------------------------------------------
// pow, sqrt, log, exp at their edges.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: pow, sqrt, rsqrt, log, exp and reciprocal at zeros, negatives and infinities") {
  const std::vector<double> xv{0.0, -2.0, -0.0, -kInf, -8.0, kInf, kNaN};
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = make_tensor(xv, {7}, dt);
    // torch.pow(x, e) for these x (torch 1.13, CPU); 0^0 = NaN^0 = 1.
    check_close(ops::pow(x, 0.0), {1, 1, 1, 1, 1, 1, 1}, 0, 0, "x^0");
    check_close(ops::pow(x, 3.0), {0, -8, -0.0, -kInf, -512, kInf, kNaN}, 0, 0, "x^3");
    check_close(ops::pow(x, 2.0), {0, 4, 0, kInf, 64, kInf, kNaN}, 0, 0, "x^2");
    check_close(ops::pow(x, -1.0), {kInf, -0.5, -kInf, -0.0, -0.125, 0, kNaN}, 0, 0, "x^-1");
    check_close(ops::pow(x, -2.0), {kInf, 0.25, kInf, 0, 0.015625, 0, kNaN}, 1e-7, 0, "x^-2");
    check_close(ops::pow(x, 1.0 / 3.0), {0, kNaN, 0, kInf, kNaN, kInf, kNaN}, 0, 0, "x^(1/3)");
    // PyTorch computes x^0.5 as sqrt(x) and x^-0.5 as rsqrt(x): sqrt(-inf) is NaN (IEEE
    // pow(-inf, 0.5) would be +inf) and sqrt(-0) is -0.
    const Tensor h = ops::pow(x, 0.5);
    check_close(h, {0, kNaN, -0.0, kNaN, kNaN, kInf, kNaN}, 0, 0, "x^0.5");
    CHECK(signbits(h)[2]);
    check_close(ops::pow(x, -0.5), {kInf, kNaN, -kInf, kNaN, kNaN, 0, kNaN}, 0, 0, "x^-0.5");
    const Tensor s = ops::sqrt(x);
    check_close(s, {0, kNaN, -0.0, kNaN, kNaN, kInf, kNaN}, 0, 0, "sqrt");
    CHECK(signbits(s)[2]);  // sqrt(-0) = -0
    check_close(ops::rsqrt(x), {kInf, kNaN, -kInf, kNaN, kNaN, 0, kNaN}, 0, 0, "rsqrt");
    check_close(ops::log(x), {-kInf, kNaN, -kInf, kNaN, kNaN, kInf, kNaN}, 0, 0, "log");
    check_close(ops::reciprocal(x), {kInf, -0.5, -kInf, -0.0, -0.125, 0, kNaN}, 0, 0, "reciprocal");
    check_close(ops::exp(make_tensor({100.0, 1000.0, -1000.0, -kInf}, {4}, dt)),
                {dt == kFloat32 ? kInf : std::exp(100.0), kInf, 0, 0}, 1e-6, 0, "exp overflow");
  }
  // Integer true division by zero is float division: inf, NaN, -inf (torch.div), not a trap.
  const Tensor num = from_vector(std::vector<int32_t>{1, 0, -1}, {3});
  check_close(ops::div(num, zeros({3}, kInt32)), {kInf, kNaN, -kInf}, 0, 0, "int / 0");
  check_close(ops::div(num, 0.0), {kInf, kNaN, -kInf}, 0, 0, "int / 0.0");
  // Tensor-tensor pow: floats follow IEEE pow (1^NaN = 1, NaN^0 = 1); integers are exact,
  // and a negative exponent gives 0 except for bases +-1 (torch's powi).
  const Tensor fb = make_tensor({0.0, 1.0, kNaN, -2.0, -2.0}, {5}, kFloat32);
  const Tensor fe = make_tensor({0.0, kNaN, 0.0, 3.0, 0.5}, {5}, kFloat32);
  check_close(ops::pow(fb, fe), {1, 1, 1, -8, kNaN}, 0, 0, "float pow");
  const Tensor ib = from_vector(std::vector<int32_t>{2, 1, -1, 0, 3}, {5});
  const Tensor ie = from_vector(std::vector<int32_t>{-1, -1, -3, 0, 19}, {5});
  CHECK(ops::pow(ib, ie).tolist<int32_t>() == std::vector<int32_t>{0, 1, -1, 1, 1162261467});
}

TEST_CASE("probe values: pow(x, 0.5) and pow(x, -0.5) gradients as PyTorch's sqrt/rsqrt-based pow_backward") {
  // pow_backward = g * e * x^(e - 1), with x^(e-1) computed by the same pow: at x = -0,
  // 0.5 * (-0)^-0.5 = 0.5 * rsqrt(-0) = -inf in torch 1.13.
  check_close(grad_of({-0.0, 4.0}, kFloat32, [](const Tensor& x) { return frugal::pow(x, 0.5); }), {-kInf, 0.25}, 0, 0,
              "d/dx x^0.5");
  check_close(grad_of({4.0}, kFloat32, [](const Tensor& x) { return frugal::pow(x, 1.5); }), {3.0}, 1e-6, 0,
              "d/dx x^1.5");
}

// ---------------------------------------------------------------------------------------
// Integer ranges: scalars, fills and casts.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: integer scalars beyond an int32 tensor wrap as in PyTorch; beyond int64 they throw") {
  // torch 1.13: tensor([1, 2], int32) + 3000000000 -> int32 [-1294967295, -1294967294]: the
  // scalar is converted to int32 with wrap-around, consistent with int32 arithmetic wrapping.
  const Tensor i32 = from_vector(std::vector<int32_t>{1, 2}, {2});
  CHECK(ops::add(i32, 3e9).dtype() == kInt32);
  CHECK(ops::add(i32, 3e9).tolist<int32_t>() == std::vector<int32_t>{-1294967295, -1294967294});
  CHECK(ops::sub(i32, 3e9).tolist<int32_t>() == std::vector<int32_t>{1294967297, 1294967298});
  CHECK(ops::mul(i32, 3e9).tolist<int32_t>() == std::vector<int32_t>{-1294967296, 1705032704});
  CHECK(ops::add(i32, -3e9).tolist<int32_t>() == std::vector<int32_t>{1294967297, 1294967298});
  Tensor inplace = i32.clone();
  ops::add_(inplace, 3e9);
  CHECK(inplace.tolist<int32_t>() == std::vector<int32_t>{-1294967295, -1294967294});
  // alpha multiplies a tensor, so it must fit the result's dtype (torch: "value cannot be
  // converted to type int without overflow"); an alpha that fits still wraps the sum.
  CHECK_THROWS(ops::add(i32, from_vector(std::vector<int32_t>{1, 1}, {2}), 3e9));
  CHECK(ops::add(i32, from_vector(std::vector<int32_t>{1, 1}, {2}), 2147483647.0).tolist<int32_t>() ==
        std::vector<int32_t>{-2147483648, -2147483647});
  // Comparisons with an out-of-range integer give the exact answer (torch 1.13 wraps the
  // scalar and says 1 < 3000000000 is false: frugal does not copy that).
  CHECK(ops::lt(i32, 3e9).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::gt(i32, -3e9).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::eq(i32, 4294967297.0).tolist<bool>() == std::vector<bool>{false, false});  // 2^32 + 1 wraps to 1
  CHECK(ops::ne(i32, 4294967297.0).tolist<bool>() == std::vector<bool>{true, true});
  const Tensor i64 = from_vector(std::vector<int64_t>{INT64_MAX, INT64_MIN}, {2});
  CHECK(ops::lt(i64, 1e19).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::le(i64, 9223372036854775808.0).tolist<bool>() == std::vector<bool>{true, true});  // 2^63 > INT64_MAX
  CHECK(ops::eq(i64, 9223372036854775808.0).tolist<bool>() == std::vector<bool>{false, false});
  CHECK(ops::ge(i64, -1e19).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::gt(i64, -9223372036854775808.0).tolist<bool>() == std::vector<bool>{true, false});  // -2^63 fits
  // An integer scalar outside int64 cannot be an integer operand (torch: "Overflow when unpacking long").
  check_error([&] { ops::add(i64, 1e19); }, {"add", "1e+19", "int64"});
  check_error([&] { ops::mul(i32, -1e20); }, {"mul", "int32"});
  check_error([&] { ops::add_(i64.clone(), 1e19); }, {"add_", "int64"});
  check_error([&] { ops::add(i64, i64, 1e19); }, {"add", "alpha"});
  // Bool tensors promote to int64 with an integer scalar (PyTorch): 3e9 fits.
  CHECK(ops::add(from_vector(std::vector<bool>{true}, {1}), 3e9).tolist<int64_t>() == std::vector<int64_t>{3000000001});
}

TEST_CASE("probe values: fill_, full and masked_fill of integer tensors with NaN, inf or out-of-range values throw") {
  // torch.full((2,), nan, dtype=int32): "value cannot be converted to type int without overflow".
  for (double v : {kNaN, kInf, -kInf, 3e9, -2147483649.0}) {
    CAPTURE(v);
    check_error([&] { full({2}, v, kInt32); }, {"fill_", "int32", "overflow"});
    check_error([&] { ops::fill_(zeros({2}, kInt32), v); }, {"fill_", "int32"});
    check_error(
        [&] {
          ops::masked_fill(zeros({2}, kInt32), from_vector(std::vector<bool>{true, false}, {2}), v);
        },
        {"masked_fill", "int32"});
    check_error(
        [&] {
          ops::masked_fill_(zeros({2}, kInt32), from_vector(std::vector<bool>{true, false}, {2}), v);
        },
        {"masked_fill_", "int32"});
  }
  check_error([&] { full({1}, 9223372036854775808.0, kInt64); }, {"fill_", "int64"});
  // The extremes themselves fit; a fraction truncates toward zero (torch: masked_fill 2.5 -> 2).
  CHECK(full({1}, 2147483647.0, kInt32).item<int32_t>() == INT32_MAX);
  CHECK(full({1}, -2147483648.0, kInt32).item<int32_t>() == INT32_MIN);
  CHECK(full({1}, -9223372036854775808.0, kInt64).item<int64_t>() == INT64_MIN);
  CHECK(full({1}, -2.7, kInt64).item<int64_t>() == -2);
  CHECK(ops::masked_fill(zeros({2}, kInt32), from_vector(std::vector<bool>{true, false}, {2}), 2.5).tolist<int32_t>() ==
        std::vector<int32_t>{2, 0});
  // Floating and bool fills take any value (bool: != 0; a float that overflows is inf).
  CHECK(std::isnan(full({1}, kNaN, kFloat16).item<double>()));
  CHECK(full({1}, kNaN, kBool).item<bool>());
  CHECK(std::isinf(full({1}, 1e5, kFloat16).item<double>()));
  // The empty tensor still checks its value: the mistake is in the call, not the data.
  check_error([&] { full({0}, kNaN, kInt64); }, {"fill_"});
}

TEST_CASE("probe values: float to integer casts of NaN, inf and out-of-range values saturate, NaN to 0") {
  // Note [Float to integer conversion]: C++ leaves these undefined; frugal saturates on both
  // backends (CUDA's cvt.rzi does so in hardware). torch 1.13 on the CPU gives INT_MIN for all
  // of them (x86's "integer indefinite"), on CUDA it saturates.
  const std::vector<double> xv{kNaN, kInf, -kInf, 3e9, -3e9, 2.7, -2.7, 2147483647.0, -2147483648.0};
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = make_tensor(xv, {9}, dt);
    const std::vector<int32_t> i = x.to(kInt32).tolist<int32_t>();
    CHECK(i[0] == 0);
    CHECK(i[1] == INT32_MAX);
    CHECK(i[2] == INT32_MIN);
    if (dt != kFloat16) {  // 3e9 is inf in float16: the same result
      CHECK(i[3] == INT32_MAX);
      CHECK(i[4] == INT32_MIN);
    }
    CHECK(i[5] == 2);
    CHECK(i[6] == -2);
    const std::vector<int64_t> l = x.to(kInt64).tolist<int64_t>();
    CHECK(l[0] == 0);
    CHECK(l[1] == INT64_MAX);
    CHECK(l[2] == INT64_MIN);
    CHECK(l[5] == 2);
  }
  const Tensor big = make_tensor({1e19, -1e19, 9223372036854775808.0, -9223372036854775808.0}, {4}, kFloat64);
  CHECK(big.to(kInt64).tolist<int64_t>() == std::vector<int64_t>{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN});
  const Tensor f = make_tensor({2147483647.0, 2147483520.0}, {2}, kFloat32);  // float(2^31 - 1) is 2^31
  CHECK(f.to(kInt32).tolist<int32_t>() == std::vector<int32_t>{INT32_MAX, 2147483520});
  CHECK(make_tensor({kNaN, -0.0}, {2}, kFloat32).to(kBool).tolist<bool>() == std::vector<bool>{true, false});
  // float -> bfloat16 rounds half to even, saturates to inf past its range, keeps NaN (torch's .bfloat16()).
  check_close(make_tensor({1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 3.4028234663852886e38, kNaN}, {4}, kFloat32).to(kBFloat16),
              {1.0, 1.015625, kInf, kNaN}, 0, 0, "bfloat16 rounding");
}

// ---------------------------------------------------------------------------------------
// Reductions: precision and empty / one-element edge cases.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: float16/bfloat16 sums and means of long rows accumulate wider than the input") {
  // A float16 accumulator stalls at 2048 (2048 + 1 rounds to 2048); PyTorch accumulates in float.
  for (int64_t n : {int64_t(3000), int64_t(4097), int64_t(60000)}) {
    CAPTURE(n);
    const Tensor h = ones({n}, kFloat16);
    const double expected = double(float(Half(float(n))));  // n rounded once to float16
    CHECK(ops::sum(h).item<double>() == expected);
    CHECK(ops::mean(h).item<double>() == 1.0);
    CHECK(ops::sum(ones({2, n}, kFloat16), {1}).tolist<double>() == std::vector<double>{expected, expected});
    CHECK(ops::sum(ones({n, 2}, kFloat16), {0}).tolist<double>() == std::vector<double>{expected, expected});
  }
  // 100000 ones: the sum 1e5 is above float16's largest finite value: inf, as torch. The mean is
  // 1 (torch 1.13 returns NaN here, a float16 inf times a float16 1/N that underflowed to 0).
  CHECK(std::isinf(ops::sum(ones({100000}, kFloat16)).item<double>()));
  CHECK(ops::mean(ones({100000}, kFloat16)).item<double>() == 1.0);
  CHECK(ops::sum(ones({100000}, kBFloat16)).item<double>() == 99840.0);  // bf16(1e5), as torch
  CHECK(ops::mean(ones({100000}, kBFloat16)).item<double>() == 1.0);
  // var of a long float16 row of two values: computed wide, exact 0.25 (population).
  std::vector<double> alt(20000);
  for (size_t k = 0; k < alt.size(); ++k) alt[k] = k % 2 ? 1000.5 : 1000.0;
  CHECK(ops::var(make_tensor(alt, {20000}, kFloat16), {}, 0).item<double>() == doctest::Approx(0.0625).epsilon(1e-3));
  // float32 sums of 2^24 + many small terms keep the small ones (double accumulation).
  std::vector<double> v(1001, 1.0);
  v[0] = 16777216.0;
  CHECK(ops::sum(make_tensor(v, {1001}, kFloat32)).item<double>() == 16778216.0);
}

TEST_CASE("probe values: integer sums beyond int32 are exact in int64; bool sums count") {
  const Tensor i = full({3000}, 2147483647.0, kInt32);
  const Tensor s = ops::sum(i);
  CHECK(s.dtype() == kInt64);
  CHECK(s.item<int64_t>() == int64_t(3000) * INT32_MAX);
  CHECK(ops::sum(full({4, 1000}, -2147483648.0, kInt32), {1}).tolist<int64_t>() ==
        std::vector<int64_t>(4, int64_t(1000) * INT32_MIN));
  CHECK(ops::sum(ones({70000}, kBool)).item<int64_t>() == 70000);
  // Past int64 the sum wraps around, as torch.tensor([2**63 - 1, 1]).sum() (no signed overflow).
  CHECK(ops::sum(from_vector(std::vector<int64_t>{INT64_MAX, 1}, {2})).item<int64_t>() == INT64_MIN);
  std::vector<int64_t> many(4096, INT64_MAX);  // long enough for the lanes and threads to combine
  CHECK(ops::sum(from_vector(many, {4096})).item<int64_t>() == int64_t(uint64_t(INT64_MAX) * 4096u));
  // Integer neg and abs wrap at the minimum, as PyTorch.
  CHECK(ops::neg(full({1}, -2147483648.0, kInt32)).item<int32_t>() == INT32_MIN);
  CHECK(ops::abs(from_vector(std::vector<int64_t>{INT64_MIN}, {1})).item<int64_t>() == INT64_MIN);
}

TEST_CASE("probe values: empty and one-element reductions: sum 0, mean NaN, var NaN/inf/0 as PyTorch") {
  CHECK(ops::sum(zeros({0})).item<double>() == 0.0);
  CHECK(ops::sum(zeros({0}, kInt32)).item<int64_t>() == 0);
  CHECK(ops::sum(zeros({0}, kInt32)).dtype() == kInt64);
  CHECK(std::isnan(ops::mean(zeros({0})).item<double>()));
  CHECK(std::isnan(ops::mean(zeros({0}, kFloat16)).item<double>()));
  check_close(ops::sum(zeros({2, 0}), {1}), {0, 0}, 0, 0, "sum of empty rows");
  check_close(ops::mean(zeros({2, 0}), {1}), {kNaN, kNaN}, 0, 0, "mean of empty rows");
  CHECK(ops::sum(zeros({0, 3}), {1}).numel() == 0);
  check_error([&] { ops::amax(zeros({0})); }, {"amax", "zero-size"});
  check_error([&] { ops::argmax(zeros({2, 0}), 1); }, {"argmax", "size 0"});
  // torch.var(tensor([3.])) = nan (0/0); correction 0 gives 0; correction 2 on one element is
  // nan (0 / max(0, -1)); on two distinct elements inf.
  CHECK(std::isnan(ops::var(full({1}, 3.0)).item<double>()));
  CHECK(ops::var(full({1}, 3.0), {}, 0).item<double>() == 0.0);
  CHECK(std::isnan(ops::var(full({1}, 3.0), {}, 2).item<double>()));
  CHECK(std::isinf(ops::var(make_tensor({3, 4}, {2}, kFloat32), {}, 2).item<double>()));
  CHECK(std::isnan(ops::var(zeros({0})).item<double>()));
  // var of a constant row is exactly 0, however large the constant.
  CHECK(ops::var(full({1000}, 1e6)).item<double>() == 0.0);
  // inf in a variance: NaN (inf - inf), as torch.
  CHECK(std::isnan(ops::var(make_tensor({kInf, 1.0}, {2}, kFloat32)).item<double>()));
  CHECK(ops::sum(make_tensor({kInf, 1.0}, {2}, kFloat32)).item<double>() == kInf);
  CHECK(std::isnan(ops::sum(make_tensor({kInf, -kInf}, {2}, kFloat32)).item<double>()));
}

// ---------------------------------------------------------------------------------------
// softmax, cross entropy, layer norm, pooling.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: softmax and log_softmax of rows with +inf, all -inf, huge logits, in every float dtype") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(std::string(dtype_name(dt)));
    // torch 1.13: softmax([inf, 1]) = [nan, nan]; softmax([-inf, -inf]) = [nan, nan].
    const Tensor x = make_tensor({kInf, 1.0, -kInf, -kInf, 6e4, 6e4 - 1.0, -6e4, 0.0}, {4, 2}, dt);
    for (int64_t dim : {int64_t(1), int64_t(0)}) {
      const Tensor xx = dim == 1 ? x : x.t().contiguous();
      const std::vector<double> y = values_of(ops::softmax(xx, dim));
      const std::vector<double> ly = values_of(ops::log_softmax(xx, dim));
      const auto at = [&](const std::vector<double>& v, int64_t r, int64_t c) {
        return v[size_t(dim == 1 ? r * 2 + c : c * 4 + r)];
      };
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t c = 0; c < 2; ++c) {
          CHECK(std::isnan(at(y, r, c)));
          CHECK(std::isnan(at(ly, r, c)));
        }
      // Huge logits: only differences matter. Row 2 holds (6e4, 6e4 - 1) in float32/64; in
      // 16-bit the second rounds to 6e4 (spacing 32) or stays (bfloat16: 59904, 59904).
      const double x0 = double(values_of(x)[4]), x1 = double(values_of(x)[5]);
      const double p0 = 1.0 / (1.0 + std::exp(x1 - x0));
      check_close({at(y, 2, 0), at(y, 2, 1)}, {p0, 1.0 - p0}, default_rtol(dt), 0, "softmax huge");
      check_close({at(ly, 2, 0), at(ly, 2, 1)}, {std::log(p0), std::log1p(-p0)}, default_rtol(dt), 1e-6,
                  "log_softmax huge");
      // (-6e4, 0): exp(-6e4) underflows; log_softmax stays finite (-6e4), not -inf.
      check_close({at(y, 3, 0), at(y, 3, 1)}, {0, 1}, 0, 0, "softmax far apart");
      check_close({at(ly, 3, 0), at(ly, 3, 1)}, {double(values_of(x)[6]), 0}, default_rtol(dt), 0,
                  "log_softmax far apart");
    }
  }
}

TEST_CASE("probe values: cross_entropy with every target ignored, label smoothing, and non-finite logits") {
  const Tensor logits = random_tensor({3, 4}, kFloat32, 7);
  const Tensor ignored = from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  for (double eps : {0.0, 0.1}) {
    CAPTURE(eps);
    // torch 1.13: cross_entropy(..., all -100) = nan for mean (0 / 0), with or without smoothing.
    CHECK(std::isnan(ops::cross_entropy(logits, ignored, {.label_smoothing = eps}).loss.item<double>()));
    CHECK(ops::cross_entropy(logits, ignored, {.label_smoothing = eps, .reduction = Reduction::Sum})
              .loss.item<double>() == 0.0);
    check_close(ops::cross_entropy(logits, ignored, {.label_smoothing = eps, .reduction = Reduction::None}).loss,
                {0, 0, 0}, 0, 0, "none: zeros");
    // Its gradient is zero, not NaN: no row contributes.
    Tensor lg = logits.clone();
    lg.requires_grad_();
    frugal::cross_entropy(lg, ignored, {.label_smoothing = eps}).backward();
    check_close(lg.grad(), std::vector<double>(12, 0.0), 0, 0, "all-ignored gradient");
  }
  // Rows of non-finite logits: a +inf logit or an all -inf row makes that row's loss NaN
  // (log_softmax is NaN there, as torch), and an ignored row stays 0 whatever its logits.
  const Tensor bad = make_tensor({kInf, 0, 0, -kInf, -kInf, -kInf, kNaN, 0, 0, kNaN, kInf, -kInf}, {4, 3}, kFloat32);
  const Tensor t = from_vector(std::vector<int64_t>{1, 0, 2, -100}, {4});
  check_close(ops::cross_entropy(bad, t, {.reduction = Reduction::None}).loss, {kNaN, kNaN, kNaN, 0}, 0, 0,
              "non-finite rows");
  // Smoothing with a masked (-inf) class: torch's e/C * sum(-log_softmax) is +inf.
  const Tensor masked = make_tensor({0.0, 1.0, -kInf}, {1, 3}, kFloat32);
  const Tensor t0 = from_vector(std::vector<int64_t>{1}, {1});
  CHECK(ops::cross_entropy(masked, t0, {.label_smoothing = 0.1}).loss.item<double>() == kInf);
  CHECK(ops::cross_entropy(masked, t0).loss.item<double>() == doctest::Approx(std::log1p(std::exp(-1.0))));
  // Huge logits in float16: the loss is computed from differences, not exp(6e4).
  const Tensor huge = make_tensor({6e4, 6e4 - 32.0}, {1, 2}, kFloat16);
  CHECK(ops::cross_entropy(huge, from_vector(std::vector<int64_t>{1}, {1})).loss.item<double>() ==
        doctest::Approx(32.0).epsilon(1e-3));
}

TEST_CASE("probe values: layer_norm of a constant row is exactly the bias, also for a large constant") {
  // torch 1.13 (CPU, float32) gives 0.082 for a row of 1e4s (cancellation in its variance);
  // the exact answer is 0 (x - mean = 0), which the two-pass double statistics give.
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = full({3, 64}, 1e4, dt);
    const Tensor bias = make_tensor(random_values(64, 3), {64}, dt);
    const Tensor weight = make_tensor(random_values(64, 4), {64}, dt);
    const ops::LayerNormResult r = ops::layer_norm(x, {64}, weight, bias);
    std::vector<double> expected;
    for (int i = 0; i < 3; ++i)
      for (double b : values_of(bias)) expected.push_back(b);
    check_close(r.out, expected, 0, 0, "constant row");
    check_close(r.rstd, std::vector<double>(3, 1.0 / std::sqrt(1e-5)), 1e-6, 0, "rstd = 1/sqrt(eps)");
    // One element per row: also a constant row.
    check_close(ops::layer_norm(full({2, 1}, -7.0, dt), {1}).out, {0, 0}, 0, 0, "N = 1");
  }
  // A row holding inf: NaN (inf - inf), as torch.
  const std::vector<double> y = values_of(ops::layer_norm(make_tensor({kInf, 1, 2, 3}, {1, 4}, kFloat32), {4}).out);
  for (double v : y) CHECK(std::isnan(v));
}

TEST_CASE("probe values: max_pool2d windows of NaN and -inf, avg_pool2d of infinities") {
  // torch 1.13: max_pool2d lets NaN win; -inf windows give -inf.
  const Tensor x = make_tensor({kNaN, 1, -kInf, -kInf, 2, kNaN, -kInf, -kInf}, {1, 1, 2, 4}, kFloat32);
  const ops::MaxPool2dResult r = ops::max_pool2d(x, 2);
  const std::vector<double> v = values_of(r.out);
  CHECK(std::isnan(v[0]));
  CHECK((std::isinf(v[1]) && v[1] < 0));
  // torch 1.13: indices [5, 2]: every NaN replaces the running maximum, so the LAST NaN of
  // the window is recorded (unlike argmax's first); an all -inf window records its first cell.
  CHECK(r.indices.tolist<int64_t>() == std::vector<int64_t>{5, 2});
  const Tensor a = make_tensor({kInf, 1, kInf, 1, -kInf, 1, 1, 1}, {1, 1, 2, 4}, kFloat32);
  const std::vector<double> av = values_of(ops::avg_pool2d(a, 2));
  CHECK(std::isnan(av[0]));  // inf + -inf
  CHECK(av[1] == kInf);
}

// ---------------------------------------------------------------------------------------
// Indexing and factories.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe values: index ops name the op and the bad index for negative and out-of-range values") {
  const Tensor x = random_tensor({3, 4}, kFloat32, 1);
  const Tensor neg = from_vector(std::vector<int64_t>{0, -1}, {2});
  const Tensor big = from_vector(std::vector<int32_t>{3, 0}, {2});
  check_error([&] { ops::index_select(x, 0, neg); }, {"index_select", "-1", "[0, 3)"});
  check_error([&] { ops::index_select(x, 0, big); }, {"index_select", "3", "[0, 3)"});
  check_error([&] { ops::gather(x, 1, from_vector(std::vector<int64_t>{4, 0, 0}, {3, 1})); }, {"gather", "4"});
  check_error([&] { ops::gather(x, 1, from_vector(std::vector<int64_t>{0, -4, 0}, {3, 1})); }, {"gather", "-4"});
  check_error([&] { ops::embedding(x, neg); }, {"embedding", "-1"});
  check_error([&] { ops::one_hot(neg, 3); }, {"one_hot", "-1"});
  check_error([&] { ops::one_hot(from_vector(std::vector<int64_t>{3}, {1}), 3); }, {"one_hot", "3"});
  check_error([&] { ops::scatter_add(zeros({3}), 0, from_vector(std::vector<int64_t>{5}, {1}), ones({1})); },
              {"scatter_add", "5"});
  check_error([&] { ops::index_add(zeros({3}), 0, from_vector(std::vector<int64_t>{-1}, {1}), ones({1})); },
              {"index_add", "-1"});
  check_error(
      [&] {
        ops::cross_entropy(x, from_vector(std::vector<int64_t>{0, 4, -1}, {3}));
      },
      {"cross_entropy", "target 4"});
  // Duplicates accumulate, and a float16 accumulation does not stall at 2048.
  const Tensor idx = zeros({3000}, kInt64);
  CHECK(ops::scatter_add(zeros({2}, kFloat16), 0, idx, ones({3000}, kFloat16)).tolist<double>() ==
        std::vector<double>{3000.0, 0.0});
  CHECK(ops::index_add(zeros({2}, kFloat16), 0, idx, ones({3000}, kFloat16)).tolist<double>() ==
        std::vector<double>{3000.0, 0.0});
  CHECK(ops::embedding_backward(ones({3000, 1}, kFloat16), idx, 2).tolist<double>() ==
        std::vector<double>{3000.0, 0.0});
  // NaN and inf pass through a gather untouched.
  const Tensor nx = make_tensor({kNaN, kInf, -kInf}, {3}, kFloat32);
  check_close(ops::index_select(nx, 0, from_vector(std::vector<int64_t>{2, 0, 1}, {3})), {-kInf, kNaN, kInf}, 0, 0,
              "index_select of non-finite values");
}

TEST_CASE("probe values: arange counts at non-integer steps; inconsistent step signs throw; empty eye and zeros") {
  // torch.arange(0, 1, 0.1).numel() = 10, arange(0, 0.3, 0.1) = 3 (0.3 / 0.1 = 2.9999999999999996).
  CHECK(arange(0.0, 1.0, 0.1).numel() == 10);
  CHECK(arange(0.0, 0.3, 0.1).numel() == 3);
  check_close(arange(1.0, 2.5, 0.5), {1.0, 1.5, 2.0}, 0, 0, "arange 0.5 steps");
  check_close(arange(5.0, 0.0, -2.0), {5, 3, 1}, 0, 0, "negative step");
  CHECK(arange(3.0, 3.0, 1.0).numel() == 0);
  // torch: "upper bound and larger bound inconsistent with step sign".
  check_error([&] { arange(0.0, 5.0, -1.0); }, {"arange", "step"});
  check_error([&] { arange(5.0, 0.0, 1.0); }, {"arange", "step"});
  // Values an integer dtype cannot hold are an error, not undefined behaviour.
  check_error([&] { arange(0.0, 2e19, 1e19, kInt64); }, {"arange", "int64"});
  check_error([&] { arange(0.0, 4e9, 1.5e9, kInt32); }, {"arange", "int32"});
  CHECK(eye(0).sizes() == Shape{0, 0});
  CHECK(eye(0, 3).sizes() == Shape{0, 3});
  CHECK(zeros({0}).numel() == 0);
  CHECK(zeros({2, 0, 3}, kInt64).numel() == 0);
}
