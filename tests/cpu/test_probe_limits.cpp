// Probes at the limits of the integer types (2026-12-04 findings): arguments whose arithmetic
// would overflow int64 (pad, chunk, one_hot), integer arange beyond 2^53, sub with a bool
// operand or a scalar of -2^63, an alpha outside the result's range, eye's m, and item<T>()
// of a value T cannot hold. Each expected value is PyTorch 1.13's (written out beside it) or
// an exact integer computed here.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "autograd/ops/shape_ops.h"  // pad
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/index.h"
#include "tensor/ops/join.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
}

TEST_CASE("probe limits: pad refuses paddings whose sizes overflow int64 instead of wrapping to a valid size") {
  const Tensor x = arange(0.0, 5.0, 1.0);
  // 5 + INT64_MIN + INT64_MAX wraps to 4: torch refuses all three.
  for (const std::vector<int64_t>& p :
       std::vector<std::vector<int64_t>>{{kMin, kMax}, {kMax, kMin}, {kMax, kMax}, {kMin, 0}, {0, kMax}})
    check_error([&] { frugal::pad(x, p); }, {"pad", "overflows int64"});
  // Ordinary crops and pads still work: (5 - 2 + 3) entries.
  const Tensor y = frugal::pad(x, {-2, 3}, "constant", 7.0);
  CHECK(y.tolist<float>() == std::vector<float>{2, 3, 4, 7, 7, 7});
}

TEST_CASE("probe limits: an integer arange beyond 2^53 is exact (computed in int64, as PyTorch)") {
  const double two53 = 9007199254740992.0;
  const Tensor a = arange(two53, two53 + 4, 1.0, TensorOptions(kInt64));
  const int64_t b = int64_t(1) << 53;
  CHECK(a.tolist<int64_t>() == std::vector<int64_t>{b, b + 1, b + 2, b + 3});  // torch: 992, 993, 994, 995
  const Tensor d = arange(-two53 * 4, -two53 * 4 + 9, 3.0, TensorOptions(kInt64));
  const int64_t s = -(int64_t(1) << 55);
  CHECK(d.tolist<int64_t>() == std::vector<int64_t>{s, s + 3, s + 6});
  // A fractional step keeps the double formula (truncated per element), as before.
  CHECK(arange(0.0, 2.0, 0.5, TensorOptions(kInt64)).tolist<int64_t>() == std::vector<int64_t>{0, 0, 1, 1});
}

TEST_CASE("probe limits: sub refuses a bool operand, as PyTorch (rsub and neg already did)") {
  const Tensor b = from_vector<bool>({true, false}, {2});
  const Tensor i = from_vector<int64_t>({1, 1}, {2});
  check_error([&] { ops::sub(b, 1.0); }, {"sub", "bool"});
  check_error([&] { ops::sub(i, b); }, {"sub", "bool"});
  check_error([&] { ops::sub(b, i); }, {"sub", "bool"});
  Tensor j = i.clone();
  check_error([&] { ops::sub_(j, b); }, {"sub_", "bool"});
  check_error([&] { ops::sub_(b.clone(), 1.0); }, {"sub_", "bool"});
  CHECK(ops::add(b, i).tolist<int64_t>() == std::vector<int64_t>{2, 1});  // add takes bool, as torch
}

TEST_CASE("probe limits: sub of the scalar -2^63 wraps as integer subtraction does (it fits int64)") {
  const Tensor x = from_vector<int64_t>({0, 5}, {2});
  // torch.tensor([0, 5]) - (-2**63) == [-2**63, -2**63 + 5] (x + 2^63 modulo 2^64)
  CHECK(ops::sub(x, -9223372036854775808.0).tolist<int64_t>() == std::vector<int64_t>{kMin, kMin + 5});
  CHECK(ops::sub(x, x, -9223372036854775808.0).tolist<int64_t>() == std::vector<int64_t>{0, kMin + 5});
  Tensor y = x.clone();
  ops::sub_(y, -9223372036854775808.0);
  CHECK(y.tolist<int64_t>() == std::vector<int64_t>{kMin, kMin + 5});
  // Floating results take the scalar as it is.
  CHECK(ops::sub(from_vector<double>({1.0}, {1}), 0.25).item<double>() == 0.75);
  // A scalar beyond int64 is refused, quoting the value the caller passed.
  check_error([&] { ops::sub(x, 1e19); }, {"sub", "1e+19", "does not fit in int64"});
}

TEST_CASE("probe limits: an integer alpha outside the result's dtype is refused, not wrapped") {
  const Tensor a = from_vector<int32_t>({1, 2}, {2});
  // torch.add(a, a, alpha=2**31): "value cannot be converted to type int without overflow"
  check_error([&] { ops::add(a, a, 2147483648.0); }, {"add", "alpha", "does not fit in int32"});
  check_error([&] { ops::sub(a, a, -2147483649.0); }, {"sub", "alpha", "does not fit in int32"});
  CHECK(ops::add(a, a, -2147483648.0).tolist<int32_t>() ==
        std::vector<int32_t>{std::numeric_limits<int32_t>::min() + 1, 2});
  // sub with alpha INT32_MIN: a - (-2^31) a, wrapped in int32 (a + 2^31 a).
  CHECK(ops::sub(a, a, -2147483648.0).tolist<int32_t>() ==
        std::vector<int32_t>{int32_t(uint32_t(1u + 2147483648u)), 2});
}

TEST_CASE("probe limits: chunk, eye and one_hot at the int64 limits") {
  const Tensor x = arange(0.0, 5.0, 1.0);
  CHECK(ops::chunk(x, kMax, 0).size() == 5);  // pieces of 1, as torch.zeros(5).chunk(2**62)
  CHECK(ops::chunk(x, 2, 0).size() == 2);
  check_error([&] { eye(3, -5); }, {"eye", "m must be >= 0", "-5"});
  CHECK(eye(2, -1).sizes() == Shape{2, 2});
  CHECK(eye(2, 3).sizes() == Shape{2, 3});
  check_error([&] { ops::one_hot(from_vector<int64_t>({kMax}, {1}), -1); }, {"one_hot", "num_classes", "int64"});
}

TEST_CASE("probe limits: item<T>() refuses a value T cannot hold (libtorch's checked_convert)") {
  check_error([&] { from_vector<int64_t>({(int64_t(1) << 32) + 5}, {1}).item<int32_t>(); },
              {"item", "4294967301", "int32", "overflow"});
  check_error([&] { scalar_tensor(1e300, TensorOptions(kFloat64)).item<float>(); }, {"item", "float32", "overflow"});
  check_error([&] { scalar_tensor(1e6, TensorOptions(kFloat32)).item<Half>(); }, {"item", "float16", "overflow"});
  check_error([&] { scalar_tensor(3e9, TensorOptions(kFloat64)).item<int32_t>(); }, {"item", "int32", "overflow"});
  check_error([&] { scalar_tensor(NAN, TensorOptions(kFloat32)).item<int64_t>(); }, {"item", "int64", "overflow"});
  CHECK(from_vector<int64_t>({-7}, {1}).item<int32_t>() == -7);
  CHECK(scalar_tensor(-2.5, TensorOptions(kFloat64)).item<int64_t>() == -2);  // truncated, as torch
  CHECK(std::isinf(scalar_tensor(INFINITY, TensorOptions(kFloat64)).item<float>()));
  CHECK(float(scalar_tensor(65504.0, TensorOptions(kFloat64)).item<Half>()) == 65504.0f);
}
