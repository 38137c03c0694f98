// Tensor core: dtypes, half conversions, views, factories, printing, sizes, errors. copy_ is
// tested in test_copy.cpp, the Philox generator and the random fills in test_random.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/threads.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/matmul.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("dtype: promotion follows PyTorch") {
  CHECK(promote_types(kFloat16, kBFloat16) == kFloat32);
  CHECK(promote_types(kFloat16, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kInt32, kInt64) == kInt64);
  CHECK(promote_types(kInt64, kFloat16) == kFloat16);
  CHECK(promote_types(kBool, kInt32) == kInt32);
  CHECK(promote_types(kBool, kBFloat16) == kBFloat16);
  CHECK(promote_with_scalar(kInt32, true) == kFloat32);
  CHECK(promote_with_scalar(kFloat16, true) == kFloat16);
  CHECK(promote_with_scalar(kInt32, false) == kInt32);
  CHECK(parse_dtype("bf16") == kBFloat16);
  check_error([] { parse_dtype("float8"); }, {"parse_dtype", "float8"});
  CHECK(element_size(kBFloat16) == 2);
  CHECK(std::string(dtype_name(kInt64)) == "int64");
}

// Reference binary16 decoding in double, written from the IEEE 754 definition.
static double half_reference(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

TEST_CASE("half: all 65536 bit patterns decode exactly and round-trip") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const Half h = Half::from_bits(uint16_t(b));
    const double ref = half_reference(uint16_t(b));
    const float f = h;
    if (std::isnan(ref)) {
      CHECK(std::isnan(f));
      continue;
    }
    REQUIRE(double(f) == ref);
    REQUIRE(Half(f).bits == b);  // encoding the decoded value gives the same bits
  }
}

TEST_CASE("half: float rounding is nearest-even against a double reference") {
  // For random floats, the chosen half must be the nearest representable value (ties to even).
  const std::vector<double> vals = random_values(20000, 7, -70000.0, 70000.0);
  std::vector<double> small = random_values(20000, 8, -1e-4, 1e-4);
  int checked = 0;
  std::vector<double> all = vals;
  all.insert(all.end(), small.begin(), small.end());
  for (double dv : all) {
    const float f = float(dv);
    const Half h(f);
    const double got = half_reference(h.bits);
    if (std::fabs(f) >= 65520.0) {
      CHECK(std::isinf(got));
      continue;
    }
    // Neighbours of the result must not be closer to f.
    const double up = half_reference(uint16_t(h.bits + 1)), down = half_reference(uint16_t(h.bits - 1));
    const double err = std::fabs(got - f);
    if (!std::isnan(up)) REQUIRE(err <= std::fabs(up - f));
    if (!std::isnan(down) && (h.bits & 0x7fff) != 0) REQUIRE(err <= std::fabs(down - f));
    ++checked;
  }
  CHECK(checked > 30000);
  // Half's spacing at 0.5 is 2^-11: halfway points round to the even neighbour.
  CHECK(Half(0.5f + 0.000244140625f).bits == Half(0.5f).bits);                    // 0.5 + 2^-12 -> 0.5
  CHECK(Half(0.5f + 3 * 0.000244140625f).bits == uint16_t(Half(0.5f).bits + 2));  // 0.5 + 3*2^-12 -> 0.5 + 2^-10
}

TEST_CASE("bfloat16: rounding and specials") {
  CHECK(float(BFloat16(1.0f)) == 1.0f);
  CHECK(float(BFloat16(1.00390625f)) == 1.0f);       // tie (1 + 2^-8) rounds to even 1.0
  CHECK(float(BFloat16(1.01171875f)) == 1.015625f);  // tie (1 + 3*2^-8) rounds up to even
  CHECK(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(float(BFloat16(INFINITY))));
  for (double v : random_values(5000, 3, -1e4, 1e4)) {
    const float f = float(v);
    const float r = BFloat16(f);
    REQUIRE(std::fabs(r - f) <= std::fabs(f) * (1.0 / 256) + 1e-30);
  }
}

TEST_CASE("views share storage and follow index math") {
  Tensor x = from_vector(random_values(24, 1), {2, 3, 4});
  const std::vector<double> v = values_of(x);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[size_t((i * 3 + j) * 4 + k)]; };

  SUBCASE("permute") {
    Tensor p = x.permute({2, 0, 1});
    CHECK(p.sizes() == Shape{4, 2, 3});
    CHECK(p.shares_storage(x));
    CHECK_FALSE(p.is_contiguous());
    std::vector<double> expect;
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) expect.push_back(at(i, j, k));
    check_close(p, expect, 0, 0, "permute");
    check_close(p.contiguous(), expect, 0, 0, "permute().contiguous()");
    CHECK(p.contiguous().is_contiguous());
  }
  SUBCASE("transpose, slice with step, select, narrow") {
    std::vector<double> expect;
    // transpose -> (k, j, i); slice keeps k in {1, 3}; select takes i = 1: s[kk][j] = x[1][j][k]
    Tensor s = x.transpose(0, 2).slice(0, 1, 4, 2).select(2, 1);
    CHECK(s.sizes() == Shape{2, 3});
    for (int k : {1, 3})
      for (int j = 0; j < 3; ++j) expect.push_back(at(1, j, k));
    check_close(s, expect, 0, 0, "transpose/slice/select");
    Tensor n = x.narrow(1, 1, 2);
    CHECK(n.sizes() == Shape{2, 2, 4});
    CHECK(n.storage_offset() == 4);
    CHECK(values_of(n)[0] == at(0, 1, 0));
    CHECK(x.slice(2, -2, 100).sizes() == Shape{2, 3, 2});  // python-style clamping
  }
  SUBCASE("view, reshape, flatten, squeeze, unsqueeze, unflatten") {
    CHECK(x.view({6, -1}).sizes() == Shape{6, 4});
    CHECK(x.view({6, -1}).shares_storage(x));
    CHECK(x.flatten().sizes() == Shape{24});
    CHECK(x.flatten(1).sizes() == Shape{2, 12});
    CHECK(x.unsqueeze(0).sizes() == Shape{1, 2, 3, 4});
    CHECK(x.unsqueeze(-1).sizes() == Shape{2, 3, 4, 1});
    CHECK(x.unsqueeze(1).squeeze(1).sizes() == x.sizes());
    CHECK(x.unsqueeze(0).unsqueeze(3).squeeze().sizes() == x.sizes());
    CHECK(x.unflatten(2, {2, 2}).sizes() == Shape{2, 3, 2, 2});
    // A transposed tensor cannot be viewed flat, but can be reshaped (with a copy).
    Tensor t = x.transpose(1, 2);
    check_error([&] { t.view({24}); }, {"view", "[2, 4, 3]", "reshape"});
    Tensor r = t.reshape({24});
    CHECK_FALSE(r.shares_storage(x));
    check_close(r, values_of(t), 0, 0, "reshape of transposed");
    // Merging dims that are contiguous among themselves is still a view.
    CHECK(x.transpose(0, 2).reshape({4, 6}).shares_storage(x) == false);
    CHECK(x.permute({0, 1, 2}).reshape({6, 4}).shares_storage(x));
  }
  SUBCASE("expand broadcasts with stride 0") {
    Tensor c = from_vector(std::vector<float>{1, 2, 3}, {3, 1});
    Tensor e = c.expand({2, 3, 4});
    CHECK(e.strides() == Shape{0, 1, 0});
    const std::vector<double> ev = values_of(e);
    for (int64_t i = 0; i < 24; ++i) REQUIRE(ev[i] == double((i / 4) % 3 + 1));
    CHECK(c.expand({-1, 5}).sizes() == Shape{3, 5});
    check_error([&] { c.expand({2, 4}); }, {"expand", "[2, 4]"});
  }
}

TEST_CASE("version counter is shared by views and bumped by in-place writes") {
  Tensor x = zeros({4, 4});
  Tensor v = x.select(0, 1);
  const uint64_t v0 = x.version();
  v.copy_(ones({4}));
  CHECK(x.version() == v0 + 1);
  ops::fill_(x, 2.0);
  CHECK(v.version() == v0 + 2);
  CHECK(values_of(x.select(0, 1)) == std::vector<double>(4, 2.0));
}

TEST_CASE("factories") {
  CHECK(values_of(zeros({2, 2})) == std::vector<double>(4, 0.0));
  CHECK(values_of(ones({3}, kFloat16)) == std::vector<double>(3, 1.0));
  CHECK(values_of(full({2}, 2.5, kBFloat16)) == std::vector<double>{2.5, 2.5});
  CHECK(values_of(arange(5)) == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(arange(5).dtype() == kInt64);
  CHECK(values_of(arange(1.0, 2.0, 0.25)) == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(values_of(arange(1.0, -1.0, -0.5, kFloat16)) == std::vector<double>{1, 0.5, 0, -0.5});
  CHECK(values_of(arange(0.0, 1.0, 0.1, kBFloat16)) == values_of(arange(0.0, 1.0, 0.1, kFloat64).to(kBFloat16)));
  CHECK(values_of(arange(-1.0, 2.0, 1.0, kBool)) == std::vector<double>{1, 0, 1});
  CHECK(arange(3.0, 3.0, 1.0).numel() == 0);
  CHECK(values_of(eye(2, 3)) == std::vector<double>{1, 0, 0, 0, 1, 0});
  CHECK(scalar_tensor(3.0).dim() == 0);
  CHECK(scalar_tensor(3.0).item<float>() == 3.0f);
  Tensor e = empty({0, 3});
  CHECK(e.numel() == 0);
  CHECK(e.clone().sizes() == Shape{0, 3});
  check_error([] { empty({-1}); }, {"empty", "[-1]"});
  check_error([] { from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }, {"from_vector", "[2, 2]"});
  check_error([] { arange(0.0, 1.0, 0.0); }, {"arange", "step"});
  Tensor s = empty_strided({2, 3}, {1, 2});
  CHECK(s.strides() == Shape{1, 2});
  CHECK_FALSE(s.is_contiguous());
}

TEST_CASE("printing looks like PyTorch") {
  CHECK(from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 4.0f}, {2, 2}).str() ==
        "tensor([[ 1.5000, -2.2500],\n        [ 3.0000,  4.0000]])");
  CHECK(arange(3).str() == "tensor([0, 1, 2])");
  CHECK(ones({2}, kFloat16).str() == "tensor([1., 1.], dtype=float16)");
  CHECK(scalar_tensor(0.5).str() == "tensor(0.5000)");
  CHECK(zeros({0, 2}).str() == "tensor([], size=[0, 2])");
  const std::string big = arange(5000).str();
  CHECK(big.find("...") != std::string::npos);
  CHECK(big.size() < 100);
}

TEST_CASE("errors name the op, the shapes and the devices") {
  Tensor x = zeros({2, 3});
  check_error([&] { x.select(1, 3); }, {"select", "index 3", "float32[2, 3] cpu"});
  check_error([&] { x.transpose(0, 2); }, {"transpose", "dim 2"});
  check_error([&] { x.permute({0, 0}); }, {"permute", "repeated"});
  check_error([&] { x.view({4, -1}); }, {"view", "[4, -1]"});
  check_error([&] { x.narrow(1, 2, 2); }, {"narrow", "size 3"});
  check_error([&] { x.item<float>(); }, {"item", "[2, 3]"});
  check_error([&] { x.data_ptr<double>(); }, {"data_ptr", "float64", "float32"});
  check_error([] { Tensor().dim(); }, {"undefined"});
  check_error([] { Device("gpu:0"); }, {"Device", "gpu:0"});
  check_error([] { Device("cuda:x"); }, {"cuda:x"});
  CHECK(Device("cuda:1") == cuda(1));
  CHECK(Device("cpu").is_cpu());
}

TEST_CASE("an empty tensor is contiguous whatever its strides, and contiguous() and clone() of one are too") {
  // A size-0 dim used to make every dim outside it "out of place" (the running element
  // count became 0), so even a fresh empty({2, 4, 0, 3}) was not contiguous, nor was
  // contiguous() of an empty view: its copy was not contiguous either.
  CHECK(empty({2, 4, 0, 3}).is_contiguous());
  const Tensor t = zeros({2, 0, 3}).transpose(0, 2);  // (3, 0, 2), strides (1, 3, 3)
  CHECK(t.is_contiguous());
  CHECK(t.contiguous().is_contiguous());
  CHECK(t.clone().is_contiguous());
  CHECK_FALSE(zeros({2, 1, 3}).transpose(0, 2).is_contiguous());  // non-empty: the strides still decide
}

// ---- sizes that overflow (Note [Size overflow]) ------------------------------------------

namespace {
constexpr int64_t k62 = int64_t(1) << 62, k31 = int64_t(1) << 31, kMax = std::numeric_limits<int64_t>::max();
}

TEST_CASE("sizes: element counts and strides that overflow int64 are rejected, naming the op and shape") {
  // Independent expectations: counts worked out by hand.
  CHECK(numel_of({}) == 1);
  CHECK(numel_of({3, 0, 5}) == 0);
  CHECK(numel_of({0, kMax}) == 0);  // empty, and its strides [kMax, 1] fit
  CHECK(numel_of({k31, k31}) == k62);
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(contiguous_strides({2, 0, 4}) == Shape{4, 4, 1});
  check_error([] { numel_of({k31, k31, 8}, "myop"); }, {"myop", "[2147483648, 2147483648, 8]", "too many elements"});
  check_error([] { numel_of({k62, k62, 0}, "myop"); }, {"myop", "too many elements"});  // its strides overflow
  check_error([] { numel_of({2, -3}, "myop"); }, {"myop", "size -3 at dim 1", "[2, -3]", "negative"});
  check_error([] { contiguous_strides({k62, 4}, "myop"); }, {"myop", "[4611686018427387904, 4]"});
  check_error(
      [] {
        broadcast_shapes({int64_t(1) << 40, 1}, {1, int64_t(1) << 40}, "add");
      },
      {"add", "[1099511627776, 1099511627776]", "too many elements"});

  // empty({2^62}) once got a storage of 2^62 * 4 = 2^64 = 0 bytes; [2^31, 2^31, 8] once had 0 elements.
  check_error([] { empty({k62}); }, {"empty", "float32[4611686018427387904]", "more than 2^63 - 1 bytes"});
  CHECK_THROWS_AS(empty({k62}, kBool), OutOfMemoryError);  // 2^62 bytes fit int64: the allocator refuses them
  check_error([] { empty({k31, k31, 8}); }, {"empty", "[2147483648, 2147483648, 8]", "too many elements"});
  check_error([] { empty({k62, k62, 0}); }, {"empty", "too many elements"});
  check_error([] { empty({3, -1}); }, {"empty", "negative", "[3, -1]"});
  check_error([] { zeros({kMax, 2}); }, {"empty", "too many elements"});
  CHECK(empty({0, kMax}).numel() == 0);

  check_error([] { empty_strided({2, 2}, {kMax, 1}); }, {"empty_strided", "span more than 2^63 - 1 elements"});
  check_error([] { empty_strided({2}, {-1}); }, {"empty_strided", "negative size or stride"});
  check_error([] { empty_strided({2}, {1, 1}); }, {"empty_strided", "1 sizes but 2 strides"});
  CHECK(empty_strided({0, 2}, {kMax, kMax}).numel() == 0);

  check_error([] { arange(0.0, 1e300); }, {"arange", "too many elements"});  // once an undefined double -> int64
  check_error([] { arange(0.0, 1.0, std::nan("")); }, {"arange", "step must be finite"});
  check_error([] { eye(k31 * 2); }, {"eye", "too many elements"});
  check_error([] { empty_channels_last({k31, k31, k31, 1}, {}); }, {"channels_last", "too many elements"});
}

TEST_CASE("sizes: views check their span, offset and element count without overflowing") {
  Tensor x = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // (3 - 1) * 2^62 wraps to a negative `last` that once passed the bounds check.
  check_error([&] { x.as_strided({3}, {k62}, 0); }, {"as_strided", "span more than 2^63 - 1 elements"});
  check_error([&] { x.as_strided({3}, {k62 / 2}, 0); }, {"as_strided", "runs past a storage of 10 elements"});
  check_error([&] { x.as_strided({2}, {1}, kMax); }, {"as_strided", "offset 9223372036854775807"});
  check_error([&] { x.as_strided({2}, {1}, -1); }, {"as_strided", "offset -1"});
  check_error([&] { x.as_strided({2, 2}, {kMax, kMax}, 0); }, {"as_strided", "span more than"});
  CHECK(values_of(x.as_strided({2, 2}, {5, 1}, 3)) == std::vector<double>{3, 4, 8, 9});  // the last element fits
  check_error([&] { x.as_strided({2, 2}, {5, 1}, 4); }, {"as_strided", "runs past"});    // one past the end

  // expand: stride-0 views whose element (or byte) count overflows.
  const Tensor one = ones({1});
  check_error([&] { one.expand({k62, k62}); }, {"expand", "[4611686018427387904, 4611686018427387904]"});
  check_error([&] { one.expand({k62}); }, {"expand", "more than 2^63 - 1 bytes"});
  check_error([&] { one.expand({-2}); }, {"expand", "size -2 at dim 0 of shape [-2] is negative"});
  check_error([&] { one.expand({-2, 1}); }, {"expand", "new leading dim 0 must have a size >= 0"});
  const Tensor big = one.expand({int64_t(1) << 40});  // 2^42 bytes as a view: representable, so allowed
  CHECK(big.numel() == int64_t(1) << 40);
  CHECK(big.strides() == Shape{0});

  // view/reshape: sizes whose product wraps to the input's count once passed.
  const Tensor none = zeros({0});
  check_error([&] { none.view({k62, k62, 0}); }, {"view", "too many elements"});
  check_error([&] { none.reshape({-1, k62, k62}); }, {"reshape", "too many elements"});
  check_error([&] { x.view({k62, 4, -1}); }, {"view", "too many elements"});

  // narrow: start + length once overflowed past the range check.
  check_error([&] { x.narrow(0, 1, kMax); }, {"narrow", "start 1 length 9223372036854775807"});
  // slice: (end - start + step - 1) / step once overflowed for a huge step.
  const Tensor s = x.slice(0, 2, 10, kMax);
  CHECK(s.sizes() == Shape{1});
  CHECK(s.storage_offset() == 2);
  CHECK(values_of(s) == std::vector<double>{2});
  CHECK(x.slice(0, 0, 10, k62).sizes() == Shape{1});
  CHECK(values_of(x.slice(0, 1, 10, 4)) == std::vector<double>{1, 5, 9});
  CHECK(x.slice(0, 10, 10, kMax).sizes() == Shape{0});
}

TEST_CASE("errors: the location names the failing check; added context keeps it and the error's type") {
  const int line = __LINE__ + 1;
  auto fail_here = [] { FRUGAL_FAIL("op: went wrong"); };
  try {
    fail_here();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.message()) == "op: went wrong");
    CHECK(std::string(e.location()) == "test_tensor.cpp:" + std::to_string(line));
    CHECK(std::string(e.what()) == "op: went wrong  [test_tensor.cpp:" + std::to_string(line) + "]");
  }
  // A helper that throws for its callers reports the caller's line (ErrorSite).
  auto helper = [](ErrorSite first) { detail::throw_error(first, std::string(first.text) + "!"); };
  const int caller_line = __LINE__ + 2;
  try {
    helper("from the caller");
  } catch (const Error& e) {
    CHECK(std::string(e.message()) == "from the caller!");
    CHECK(std::string(e.location()) == "test_tensor.cpp:" + std::to_string(caller_line));
  }
  try {
    rethrow_with_context(OutOfMemoryError("cpu out of memory", "alloc.cpp:7"), "load: f.st: ");
  } catch (const OutOfMemoryError& e) {
    CHECK(std::string(e.what()) == "load: f.st: cpu out of memory  [alloc.cpp:7]");
  }
  CHECK_THROWS_AS(rethrow_with_context(Error("plain"), "ctx: "), Error);
  CHECK(std::string(Error("no location").location()).empty());
}

TEST_CASE("threads: set_num_threads / get_num_threads, as torch's; products do not depend on them") {
  const int before = get_num_threads();
  CHECK(before >= 1);
  const Tensor a = random_tensor({3, 64, 48}, kFloat32, 1), b = random_tensor({3, 48, 32}, kFloat32, 2);
  const std::vector<double> many = values_of(ops::matmul(a, b));
  set_num_threads(1);
  CHECK(get_num_threads() == 1);
  CHECK(values_of(ops::matmul(a, b)) == many);  // each product sums over K in the same order
  set_num_threads(before);
  CHECK(get_num_threads() == before);
  check_error([] { set_num_threads(0); }, {"set_num_threads", ">= 1", "0"});
}
