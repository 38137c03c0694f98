// Probes for silent wrong answers in dtype conversions and in printing: float32, float64
// and integers into float16/bfloat16 (ties to even, the overflow threshold, subnormals,
// -0, NaN), float64's double rounding, integer wrap-around, bool and uint8, through every
// path that converts (to(), copy_, contiguous(), clone(), tolist, item, from_vector, full,
// fill_) on contiguous, strided, transposed, expanded and size-0 tensors; and Tensor::str().
// Every expectation comes from a bit-level reference written here (exact float64 or
// integer arithmetic), or from PyTorch's documented code path, cited where it is used.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The value of IEEE binary16 bits b, decoded with float64 arithmetic (NaN for NaNs).
double half_value(uint16_t b) {
  const int exp = (b >> 10) & 31, mant = b & 1023;
  double v;
  if (exp == 31) v = mant ? kNaN : kInf;
  else if (exp == 0) v = std::ldexp(double(mant), -24);
  else v = std::ldexp(double(1024 + mant), exp - 25);
  return (b & 0x8000) ? -v : v;
}

/// x rounded to nearest, ties to even, in a binary format with `frac_bits` fraction bits,
/// smallest normal exponent `emin` and largest finite value `max_finite`; the IEEE
/// overflow rule (a result past max_finite is inf) and signed zeros. Exact: every step is
/// a power-of-two scaling, floor or subtraction of doubles.
double round_to_format(double x, int frac_bits, int emin, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade is 2^(e-1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, emin) - frac_bits);
  const double n = a / quantum;
  double k = std::floor(n);
  const double rest = n - k;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(k, 2.0) == 1.0)) k += 1.0;
  double v = k * quantum;
  if (v > max_finite) v = kInf;
  return std::copysign(v, x);
}
const double kHalfMax = 65504.0;
const double kBF16Max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
double round_half(double x) { return round_to_format(x, 10, -14, kHalfMax); }
double round_bf16(double x) { return round_to_format(x, 7, -126, kBF16Max); }
double round_f32(double x) { return round_to_format(x, 23, -126, double(std::numeric_limits<float>::max())); }

/// The binary16 bits of v, a value float16 holds exactly (or +-inf / NaN: canonical 0x7e00).
uint16_t half_bits_of(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (std::isnan(v)) return sign | 0x7e00;
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | uint16_t(std::ldexp(a, 24));
  int e;
  std::frexp(a, &e);
  const int E = e - 1;
  return sign | uint16_t((E + 15) << 10) | uint16_t((std::ldexp(a, -E) - 1.0) * 1024.0);
}

/// t's elements, row-major, read straight from its storage through its strides: no copy
/// kernel (the thing under test) touches them.
template <typename T>
std::vector<T> raw_elems(const Tensor& t) {
  const T* base = t.data_ptr<T>();
  std::vector<T> out;
  out.reserve(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, t.sizes());
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    out.push_back(base[off]);
  }
  return out;
}
std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> out;
  if (t.dtype() == kFloat16)
    for (Half h : raw_elems<Half>(t)) out.push_back(h.bits);
  else
    for (BFloat16 h : raw_elems<BFloat16>(t)) out.push_back(h.bits);
  return out;
}

/// The named results of converting the 1-D tensor `src` to `dt` through every path a user
/// takes. Each is 1-D with src's values in order (the strided and expanded ones are views).
std::vector<std::pair<std::string, Tensor>> conversions(const Tensor& src, DType dt) {
  const int64_t n = src.numel();
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("to() of a contiguous source", src.contiguous().to(dt));
  // A column of an (n, 2) buffer, seen through a transpose: a (2, n) source with strides (1, 2).
  Tensor buf = empty({n, 2}, src.dtype());  // empty: zeros() would fill, which uint8 does not do
  ops::copy_into(buf.select(1, 0), src);
  out.emplace_back("to() of a transposed source", buf.t().to(dt).select(0, 0));
  Tensor wide = empty({2 * n}, src.dtype());
  ops::copy_into(wide.slice(0, 0, 2 * n, 2), src);
  out.emplace_back("to() of a strided source", wide.slice(0, 0, 2 * n, 2).to(dt));
  out.emplace_back("to() of an expanded source", src.unsqueeze(1).expand({n, 3}).to(dt).select(1, 2));
  Tensor dst = zeros({3 * n}, dt).slice(0, 1, 3 * n, 3);
  dst.copy_(src);
  out.emplace_back("copy_ into a strided destination", dst);
  Tensor dst2 = zeros({n, 3}, dt).select(1, 1);
  ops::copy_into(dst2, buf.t().select(0, 0));  // strided to strided
  out.emplace_back("copy_ strided to strided", dst2);
  return out;
}

/// Parses the numbers printed by Tensor::str(): the text between "tensor(" and the first
/// ", dtype=" / ", size=" / the final ")", split at brackets, commas and blanks.
std::vector<std::string> printed_tokens(const std::string& s) {
  REQUIRE(s.rfind("tensor(", 0) == 0);
  std::string body = s.substr(7);
  for (const char* tail : {", dtype=", ", size=", ", device="}) {
    const size_t at = body.find(tail);
    if (at != std::string::npos) body = body.substr(0, at);
  }
  if (!body.empty() && body.back() == ')') body.pop_back();
  std::vector<std::string> tokens;
  std::string cur;
  for (char c : body) {
    if (c == '[' || c == ']' || c == ',' || c == ' ' || c == '\n') {
      if (!cur.empty()) tokens.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) tokens.push_back(cur);
  return tokens;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// float32 -> float16 / bfloat16
// ---------------------------------------------------------------------------------------

TEST_CASE("probe dtypes: float32 -> float16 rounds every tie to even, overflows at 65520, keeps subnormals, -0, NaN") {
  // Inputs: for every finite positive half h, the float32 midpoint between h and the next
  // half (an exact tie: 12 significant bits) and its two float32 neighbours, then the same
  // negated, then specials. The midpoint above 65504 is 65520: a tie that rounds to the even
  // 65536, past the range, so inf (IEEE 754 round-to-nearest-even; PyTorch's
  // fp16_ieee_from_fp32_value and CUDA's __float2half_rn agree).
  std::vector<float> v;
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const double lo = half_value(uint16_t(b)), hi = b + 1 < 0x7c00 ? half_value(uint16_t(b + 1)) : 65536.0;
    const float mid = float((lo + hi) / 2);
    REQUIRE(double(mid) == (lo + hi) / 2);
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, INFINITY));
    if (b % 5 == 0) v.push_back(float(lo));
  }
  const size_t positives = v.size();
  for (size_t i = 0; i < positives; ++i) v.push_back(-v[i]);
  for (float s :
       {0.0f, -0.0f, 65519.99f, 65520.0f, 65536.0f, 1e6f, std::numeric_limits<float>::max(),
        std::numeric_limits<float>::denorm_min(), 1e-40f, float(INFINITY), float(-INFINITY),
        std::numeric_limits<float>::quiet_NaN(), detail::bits_float(0x7f800001u), detail::bits_float(0xffc00000u)})
    v.push_back(s);

  std::vector<uint16_t> want;
  for (float f : v) want.push_back(half_bits_of(round_half(double(f))));
  // Spot checks of the reference itself against hand-worked values.
  CHECK(half_bits_of(round_half(65519.99f)) == 0x7bff);                 // 65504
  CHECK(half_bits_of(round_half(65520.0f)) == 0x7c00);                  // inf
  CHECK(half_bits_of(round_half(std::ldexp(1.0, -25))) == 0x0000);      // tie between 0 and 2^-24: even 0
  CHECK(half_bits_of(round_half(3 * std::ldexp(1.0, -25))) == 0x0002);  // tie between 1 and 2 ulps: even 2
  CHECK(half_bits_of(round_half(-0.0)) == 0x8000);

  const Tensor src = from_vector(v);
  auto paths = conversions(src, kFloat16);
  paths.emplace_back("from_vector<float> with dtype float16", from_vector(v, {}, TensorOptions(kFloat16)));
  for (const auto& [name, t] : paths) {
    CAPTURE(name);
    REQUIRE(t.dtype() == kFloat16);
    const std::vector<uint16_t> got = bits16(t);
    REQUIRE(got.size() == want.size());
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
    CHECK_MESSAGE(bad == 0, bad, " wrong; first: float32 bits ",
                  detail::float_bits(v[size_t(std::max<int64_t>(first, 0))]), " gave half bits ",
                  first >= 0 ? got[size_t(first)] : 0, " expected ", first >= 0 ? want[size_t(first)] : 0);
  }
  // tolist<Half>() and item<Half>() convert on the way out.
  const std::vector<Half> listed = src.tolist<Half>();
  for (size_t i = 0; i < v.size(); ++i) REQUIRE(listed[i].bits == want[i]);
  CHECK(from_vector(std::vector<float>{65520.0f}).to(kFloat16).item<Half>().bits == 0x7c00);
  // item<Half>() of a finite value beyond float16 is refused, as libtorch's checked_convert.
  CHECK_THROWS(from_vector(std::vector<float>{65520.0f}).item<Half>());
  CHECK(scalar_tensor(-0.0, kFloat32).item<Half>().bits == 0x8000);
}

TEST_CASE("probe dtypes: float32 -> bfloat16 rounds ties to even, overflows past the largest finite, NaN stays NaN") {
  std::vector<float> v;
  for (uint32_t b = 0; b < 0x7f80; ++b) {  // every finite positive bfloat16 and the next
    const double lo = double(detail::bits_float(b << 16));
    const double hi = b + 1 < 0x7f80 ? double(detail::bits_float((b + 1) << 16)) : std::ldexp(1.0, 128);
    const float mid = float((lo + hi) / 2);
    REQUIRE(double(mid) == (lo + hi) / 2);
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    if (b + 1 < 0x7f80) v.push_back(std::nextafter(mid, INFINITY));
  }
  const size_t positives = v.size();
  for (size_t i = 0; i < positives; ++i) v.push_back(-v[i]);
  for (float s : {0.0f, -0.0f, std::numeric_limits<float>::max(), float(INFINITY), float(-INFINITY)}) v.push_back(s);
  // NaNs whose payload sits only in the low 16 bits: truncating would give 0x7f80 (inf).
  const std::vector<uint32_t> nans{0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fc00000u, 0x7f810000u, 0xffffffffu};
  const size_t first_nan = v.size();
  for (uint32_t u : nans) v.push_back(detail::bits_float(u));

  const Tensor src = from_vector(v);
  auto paths = conversions(src, kBFloat16);
  paths.emplace_back("from_vector<float> with dtype bfloat16", from_vector(v, {}, TensorOptions(kBFloat16)));
  for (const auto& [name, t] : paths) {
    CAPTURE(name);
    const std::vector<uint16_t> got = bits16(t);
    REQUIRE(got.size() == v.size());
    int64_t bad = 0;
    for (size_t i = 0; i < first_nan; ++i) {
      const double want = round_bf16(double(v[i]));
      const uint16_t want_bits = uint16_t(detail::float_bits(float(want)) >> 16);  // want is exact in float
      if (got[i] != want_bits && bad++ == 0)
        FAIL_CHECK("float32 bits ", detail::float_bits(v[i]), " gave bfloat16 bits ", got[i], " expected ", want_bits);
    }
    CHECK(bad == 0);
    for (size_t i = first_nan; i < v.size(); ++i) {
      CAPTURE(nans[i - first_nan]);
      CHECK((got[i] & 0x7f80) == 0x7f80);  // exponent all ones ...
      CHECK((got[i] & 0x007f) != 0);       // ... and a nonzero mantissa: NaN, not inf
    }
  }
  const std::vector<BFloat16> listed = src.tolist<BFloat16>();
  for (size_t i = first_nan; i < v.size(); ++i) CHECK(std::isnan(float(listed[i])));
}

TEST_CASE("probe dtypes: float16/bfloat16 -> float32/float64 decode all 65536 bit patterns exactly through views") {
  Tensor h = empty({256, 256}, kFloat16), b = empty({256, 256}, kBFloat16);
  for (uint32_t i = 0; i < 65536; ++i) {
    h.data_ptr<Half>()[i] = Half::from_bits(uint16_t(i));
    b.data_ptr<BFloat16>()[i] = BFloat16::from_bits(uint16_t(i));
  }
  for (DType out : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(out));
    // Transposed back and forth: the element order is the bit pattern's again.
    const std::vector<double> hv = h.t().to(out).t().contiguous().to(kFloat64).tolist<double>();
    const std::vector<double> bv = b.t().to(out).t().contiguous().to(kFloat64).tolist<double>();
    int64_t bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const double hr = half_value(uint16_t(i));
      const double br = double(detail::bits_float(i << 16));  // bfloat16 is float32's top half
      const bool h_ok = std::isnan(hr) ? std::isnan(hv[i]) : (hv[i] == hr && std::signbit(hv[i]) == std::signbit(hr));
      const bool b_ok = std::isnan(br) ? std::isnan(bv[i]) : (bv[i] == br && std::signbit(bv[i]) == std::signbit(br));
      if (!(h_ok && b_ok) && bad++ < 3) FAIL_CHECK("bits ", i, ": half gave ", hv[i], ", bfloat16 gave ", bv[i]);
    }
    CHECK(bad == 0);
  }
  // A float16 NaN keeps its sign and payload in float32 (PyTorch's fp16_ieee_to_fp32_bits
  // shifts the mantissa up; only a signalling NaN's quiet bit may be set on the way).
  const std::vector<float> f = h.to(kFloat32).view({-1}).narrow(0, 0xfc01, 2).tolist<float>();  // 0xfc01, 0xfc02
  CHECK(std::isnan(f[0]));
  CHECK(std::signbit(f[0]));
  CHECK((detail::float_bits(f[1]) & 0x003fffffu) == (2u << 13));
}

// ---------------------------------------------------------------------------------------
// Same-dtype copies of views
// ---------------------------------------------------------------------------------------

TEST_CASE("probe dtypes: contiguous(), clone() and copy_ of a float16/bfloat16 view keep every bit, NaN payloads too") {
  // A same-dtype copy is a copy of the bits in PyTorch (copy_ with equal dtypes goes to
  // direct_copy_kernel in aten/src/ATen/native/cpu/CopyKernel.cpp, whatever the strides), and
  // frugal's contiguous fast path is a memcpy. A view must not take another road that
  // decodes to float and encodes back: that makes every float16 NaN 0x7e00 and sets the
  // quiet bit of a signalling bfloat16 NaN, so a transposed checkpoint tensor would not
  // save bit-exact (test_probe_api's NaN-payload round trip only covers contiguous ones).
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    Tensor all = empty({256, 256}, dt);
    auto* raw = static_cast<uint16_t*>(all.data());
    for (uint32_t i = 0; i < 65536; ++i) raw[i] = uint16_t(i);
    const Tensor t = all.t();  // (256, 256), strides (1, 256)
    const std::vector<uint16_t> want = bits16(t);
    CHECK(bits16(t.contiguous()) == want);
    CHECK(bits16(t.clone()) == want);
    Tensor dst = empty({256, 512}, dt).slice(1, 0, 512, 2);
    dst.copy_(t);
    CHECK(bits16(dst) == want);
    CHECK(bits16(t.to(dt)) == want);
    CHECK(bits16(all.slice(0, 0, 256, 2).contiguous()) == bits16(all.slice(0, 0, 256, 2)));
    CHECK(bits16(all.view({-1}).slice(0, 1, 65536, 3).clone()) == bits16(all.view({-1}).slice(0, 1, 65536, 3)));
  }
  // The same for float32 and float64 NaNs with payloads (signalling ones included).
  Tensor f = empty({4, 2}, kFloat32);
  const std::vector<uint32_t> fb{0x7f800001u, 0xff800123u, 0x7fc00001u, 0xffffffffu, 0, 0x80000000u, 1, 0x7f7fffffu};
  std::memcpy(f.data(), fb.data(), 32);
  const std::vector<float> ft = raw_elems<float>(f.t());
  const std::vector<float> fc = f.t().contiguous().tolist<float>();
  for (size_t i = 0; i < 8; ++i) CHECK(detail::float_bits(fc[i]) == detail::float_bits(ft[i]));
}

// ---------------------------------------------------------------------------------------
// float64 -> 16-bit: double rounding
// ---------------------------------------------------------------------------------------

TEST_CASE(
    "probe dtypes: float64 -> float16/bfloat16 rounds through float32 on every path, as PyTorch's c10::Half(float)") {
  // PyTorch has no double -> half conversion: c10::convert<Half, double> is
  // static_cast<c10::Half>(double), which calls Half(float) (c10/util/TypeCast.h, Half.h;
  // BFloat16 the same), so a float64 is rounded to float32 first and then to 16 bits.
  // A value that float32 rounds onto a 16-bit tie then goes to the even neighbour, where a
  // direct rounding (numpy's npy_double_to_half) would not. frugal does what PyTorch does,
  // on every path; these are the cases where that differs from the direct rounding.
  struct Case {
    double x;
    double via_float;  // PyTorch and frugal
    double direct;     // numpy's float64 -> float16, correctly rounded
    DType dt;
  };
  const std::vector<Case> cases{
      {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 1.0, 1.0 + std::ldexp(1.0, -10), kFloat16},
      {65519.999, kInf, 65504.0, kFloat16},  // float32(65519.999) is 65520: a tie, to inf
      {-65519.999, -kInf, -65504.0, kFloat16},
      {std::ldexp(1.0, -25) + std::ldexp(1.0, -60), 0.0, std::ldexp(1.0, -24), kFloat16},  // a subnormal tie
      {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), 1.0, 1.0 + std::ldexp(1.0, -7), kBFloat16},
  };
  for (const Case& c : cases) {
    CAPTURE(c.x);
    CAPTURE(dtype_name(c.dt));
    // The reference: round to float32, then to 16 bits, each exactly.
    const double ref = c.dt == kFloat16 ? round_half(round_f32(c.x)) : round_bf16(round_f32(c.x));
    CHECK(ref == c.via_float);
    CHECK((c.dt == kFloat16 ? round_half(c.x) : round_bf16(c.x)) == c.direct);
    const Tensor src = from_vector(std::vector<double>{c.x}, {1});
    std::vector<std::pair<std::string, Tensor>> paths = conversions(src, c.dt);
    paths.emplace_back("full", full({1}, c.x, c.dt));
    paths.emplace_back("scalar_tensor", scalar_tensor(c.x, c.dt).view({1}));
    paths.emplace_back("from_vector<double>", from_vector(std::vector<double>{c.x}, {}, TensorOptions(c.dt)));
    Tensor filled = zeros({2, 3}, c.dt).t().select(0, 1);
    ops::fill_(filled, c.x);
    paths.emplace_back("fill_ of a view", filled);
    for (const auto& [name, t] : paths) {
      CAPTURE(name);
      for (double got : values_of(t)) CHECK(got == ref);
    }
  }
  // And for many random doubles of every magnitude half holds, through to() and full().
  std::vector<double> xs = random_values(4000, 11, -70000.0, 70000.0);
  for (double& x : random_values(4000, 12, -1.0, 1.0)) xs.push_back(std::ldexp(x, -14));
  const std::vector<double> got = values_of(from_vector(xs).to(kFloat16));
  for (size_t i = 0; i < xs.size(); ++i) REQUIRE(got[i] == round_half(round_f32(xs[i])));
}

// ---------------------------------------------------------------------------------------
// Integers
// ---------------------------------------------------------------------------------------

namespace {
/// The integer i rounded to nearest-even with `sig_bits` significant bits, exactly (integer
/// arithmetic on |i| as uint64, so INT64_MIN is fine); returned as a double, which holds it.
double round_int(int64_t i, int sig_bits) {
  const bool neg = i < 0;
  uint64_t a = neg ? uint64_t(0) - uint64_t(i) : uint64_t(i);
  int width = 0;
  for (uint64_t t = a; t; t >>= 1) ++width;
  if (width > sig_bits) {
    const int shift = width - sig_bits;
    const uint64_t rest = a & ((uint64_t(1) << shift) - 1), half = uint64_t(1) << (shift - 1);
    uint64_t q = a >> shift;
    if (rest > half || (rest == half && (q & 1))) ++q;
    const double v = std::ldexp(double(q), shift);  // q has at most sig_bits + 1 bits: exact
    return neg ? -v : v;
  }
  return neg ? -double(a) : double(a);
}
}  // namespace

TEST_CASE("probe dtypes: int64/int32 -> float16/bfloat16/float32/float64 round to nearest even and overflow to inf") {
  std::vector<int64_t> v{0,
                         1,
                         -1,
                         2047,
                         2048,
                         2049,
                         2050,
                         2051,
                         4097,
                         4098,
                         4099,
                         4101,
                         65504,
                         65505,
                         65519,
                         65520,
                         65535,
                         -65519,
                         -65520,
                         257,
                         258,
                         259,
                         16777217,
                         16777219,
                         -16777217,
                         33554435,
                         1LL << 53,
                         (1LL << 53) + 1,
                         (1LL << 53) + 3,
                         INT64_MAX,
                         INT64_MIN,
                         INT32_MAX,
                         INT32_MIN,
                         0x1010001,
                         0x100ffff,
                         -0x1010001};
  for (int64_t x : random_values(200, 21, -1e18, 1e18)) v.push_back(x);
  const Tensor src = from_vector(v);
  for (DType dt : {kFloat16, kBFloat16, kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dt));
    std::vector<double> want;
    for (int64_t x : v) {
      switch (dt) {
        case DType::Float16:
          want.push_back(round_half(round_int(x, 11)));
          break;  // exact: ints past 2^24 are inf anyway
        // int64 -> bfloat16 goes through float32 in PyTorch (static_cast<c10::BFloat16>(int64_t) is
        // BFloat16(float)), and so in frugal: 0x1010001 gives 2^24, not the nearest 2^24 + 2^17.
        case DType::BFloat16: want.push_back(round_bf16(round_int(x, 24))); break;
        case DType::Float32: want.push_back(round_int(x, 24)); break;
        default: want.push_back(round_int(x, 53)); break;
      }
    }
    if (dt == kBFloat16) CHECK(want[33] == 16777216.0);
    for (const auto& [name, t] : conversions(src, dt)) {
      CAPTURE(name);
      check_close(t, want, 0, 0, name);
    }
    for (const auto& [name, t] : conversions(src.to(kInt32), dt)) {  // the int32 source: v wrapped to 32 bits
      CAPTURE(name);
      std::vector<double> w32;
      for (int64_t x : v) {
        const int32_t y = int32_t(uint32_t(uint64_t(x)));
        w32.push_back(dt == kFloat16    ? round_half(round_int(y, 11))
                      : dt == kBFloat16 ? round_bf16(round_int(y, 24))
                      : dt == kFloat32  ? round_int(y, 24)
                                        : double(y));
      }
      check_close(t, w32, 0, 0, name);
    }
  }
}

TEST_CASE("probe dtypes: int64 -> int32 wraps as two's complement; bool casts: NaN true, -0 false, 2^32 true") {
  // PyTorch: int64 -> int32 is static_cast<int32_t> (c10::convert), modular in C++20 and on
  // every target; any -> bool is static_cast<bool> (NaN and every nonzero true, -0.0 false).
  const std::vector<int64_t> v{INT64_MAX, INT64_MIN, 1LL << 31, (1LL << 32) + 5, -(1LL << 31) - 1,
                               -1,        0,         1LL << 32, 0x123456789abLL};
  const Tensor src = from_vector(v);
  std::vector<double> want32, wantb;
  for (int64_t x : v) {
    want32.push_back(double(int32_t(uint32_t(uint64_t(x)))));
    wantb.push_back(x != 0 ? 1.0 : 0.0);
  }
  for (const auto& [name, t] : conversions(src, kInt32)) check_close(t, want32, 0, 0, name + " int64 -> int32");
  // 2^32 and INT64_MIN have zero low 32 bits: a bool cast through int32 would call them false.
  for (const auto& [name, t] : conversions(src, kBool)) check_close(t, wantb, 0, 0, name + " int64 -> bool");
  CHECK(from_vector(std::vector<int64_t>{1LL << 32}).item<bool>());
  const std::vector<int32_t> listed32 = src.tolist<int32_t>();  // tolist converts the same way
  for (size_t i = 0; i < v.size(); ++i) CHECK(listed32[i] == int32_t(want32[i]));
  // int32 -> int64 sign-extends.
  CHECK(from_vector(std::vector<int32_t>{-1, INT32_MIN, INT32_MAX}).to(kInt64).tolist<int64_t>() ==
        std::vector<int64_t>{-1, INT32_MIN, INT32_MAX});

  // Floating -> bool, from every floating dtype and through every path.
  const std::vector<double> fv{kNaN, -kNaN, -0.0, 0.0, 1e-300, -1e-300, kInf, -kInf, 0.5, std::ldexp(1.0, -24)};
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    std::vector<double> wb;
    const Tensor s = from_vector(fv).to(dt);  // 1e-300 is 0 in the narrower types: then false
    for (double x : values_of(s)) wb.push_back(std::isnan(x) || x != 0.0 ? 1.0 : 0.0);
    CHECK(wb[0] == 1.0);
    CHECK(wb[2] == 0.0);
    for (const auto& [name, t] : conversions(s, kBool)) check_close(t, wb, 0, 0, name);
    const std::vector<bool> listed = s.tolist<bool>();
    for (size_t i = 0; i < fv.size(); ++i) CHECK(listed[i] == (wb[i] == 1.0));
  }
  CHECK(from_vector(std::vector<double>{1e-300}).item<bool>());  // float64 -> bool directly, not via float32
  CHECK(scalar_tensor(kNaN, kBool).item<bool>());                // fill_: NaN != 0
  CHECK_FALSE(scalar_tensor(-0.0, kBool).item<bool>());
  // bool -> every dtype: 1 and 0.
  const Tensor bsrc = from_vector(std::vector<bool>{true, false, true});
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool})
    for (const auto& [name, t] : conversions(bsrc, dt)) check_close(t, {1, 0, 1}, 0, 0, name + " from bool");
}

TEST_CASE("probe dtypes: uint8 reads as 0..255 into every dtype on every layout; every cast into uint8 is refused") {
  // Note [Reading uint8 as numbers]: uint8 -> any dtype gives 0..255; a cast into uint8
  // (where PyTorch's negative-float result is platform-defined: c10::convert routes it
  // through int64 and truncates) is an error on every path, never a silent value.
  Tensor u = empty({256}, kUInt8);
  for (int i = 0; i < 256; ++i) u.data_ptr<uint8_t>()[i] = uint8_t(i);
  std::vector<double> want(256), wantb(256);
  for (int i = 0; i < 256; ++i) want[size_t(i)] = i, wantb[size_t(i)] = i != 0;
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool})
    for (const auto& [name, t] : conversions(u, dt)) check_close(t, dt == kBool ? wantb : want, 0, 0, name);
  // uint8 -> uint8 in any layout copies the bytes.
  CHECK(raw_elems<uint8_t>(u.unsqueeze(0).expand({2, 256}).t().contiguous().select(1, 1)) == raw_elems<uint8_t>(u));
  for (DType from : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    CAPTURE(dtype_name(from));
    const Tensor s = full({4}, -1.0, from);
    check_error([&] { s.to(kUInt8); }, {"copy_", "uint8"});
    check_error([&] { empty({4}, kUInt8).copy_(s); }, {"copy_", "uint8"});
    check_error([&] { ops::copy_into(empty({8}, kUInt8).slice(0, 0, 8, 2), s.t()); }, {"copy_", "uint8"});
  }
  check_error([] { full({2}, -1.0, kUInt8); }, {"fill_", "uint8"});
}

TEST_CASE("probe dtypes: size-0 tensors convert between every pair of dtypes and keep their shape") {
  const std::vector<DType> all{kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool, kUInt8};
  for (DType from : all) {
    for (DType to : all) {
      if (to == kUInt8 && from != kUInt8) continue;  // refused (previous case)
      CAPTURE(dtype_name(from));
      CAPTURE(dtype_name(to));
      for (const Shape& s : {Shape{0}, Shape{3, 0}, Shape{0, 4, 2}}) {
        const Tensor x = empty(s, from);
        const Tensor y = (s.size() >= 2 ? x.transpose(0, 1) : x).to(to);
        CHECK(y.dtype() == to);
        CHECK(y.numel() == 0);
        CHECK(y.sizes() == (s.size() >= 2 ? x.transpose(0, 1).sizes() : s));
        Tensor dst = empty(s, to);
        dst.copy_(x);  // nothing to do, and no error
        if (to != kUInt8) CHECK(y.to(kFloat64).tolist<double>().empty());
      }
    }
  }
}

TEST_CASE("probe dtypes: item() and tolist() of views read the view's own elements, converted once") {
  // A 1-element view at a storage offset, an expanded scalar and a transposed select.
  const Tensor base = from_vector(std::vector<float>{1.0f, 2049.0f, -0.0f, 3.5f, 65520.0f, 7.0f}, {2, 3});
  CHECK(base.select(0, 1).select(0, 1).to(kFloat16).item<Half>().bits == 0x7c00);     // 65520 -> inf
  CHECK(base.t().select(0, 1).select(0, 0).item<Half>().bits == half_bits_of(2048));  // 2049 -> 2048
  CHECK(base.t().select(0, 2).select(0, 0).item<Half>().bits == 0x8000);              // -0 kept
  CHECK(base.select(1, 0).narrow(0, 1, 1).item<float>() == 3.5f);
  CHECK(base.select(0, 1).select(0, 2).expand({1}).item<int64_t>() == 7);
  CHECK(base.t().to(kFloat16).tolist<float>() == std::vector<float>{1.0f, 3.5f, 2048.0f, INFINITY, -0.0f, 7.0f});
  // Float -> integer item(): a value the integer cannot hold is refused, as libtorch's
  // item<T>() (to() saturates instead: Note [Float to integer conversion]).
  CHECK_THROWS(scalar_tensor(kNaN).item<int64_t>());
  CHECK_THROWS(scalar_tensor(-kInf, kFloat16).item<int32_t>());
  CHECK(scalar_tensor(-kInf, kFloat16).to(kInt32).item<int32_t>() == INT32_MIN);
  CHECK(scalar_tensor(2.9, kBFloat16).item<int32_t>() == 2);
}

// ---------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------

TEST_CASE("probe print: int64 and int32 values print exactly, also beyond 2^53") {
  // PyTorch prints integer tensors with str(int): every digit. Through a double, 2^53 + 1
  // prints as ...992 and INT64_MAX as ...808, a number the tensor does not hold.
  const std::vector<int64_t> v{INT64_MAX, INT64_MIN, (1LL << 53) + 1, -(1LL << 53) - 3, 0, -7};
  const Tensor t = from_vector(v);
  std::vector<std::string> want;
  for (int64_t x : v) want.push_back(std::to_string(x));
  CHECK(printed_tokens(t.str()) == want);
  CHECK(printed_tokens(t.t().str()) == want);
  CHECK(printed_tokens(t.view({2, 3}).t().str()) ==
        std::vector<std::string>{want[0], want[3], want[1], want[4], want[2], want[5]});
  CHECK(scalar_tensor(0, kInt64).str() == "tensor(0)");
  CHECK(from_vector(std::vector<int64_t>{INT64_MAX}, {}).str() == "tensor(9223372036854775807)");
  CHECK(from_vector(std::vector<int32_t>{INT32_MIN, 5}).str() ==
        "tensor([-2147483648, " + std::string(10, ' ') + "5], dtype=int32)");  // right-aligned to the widest
}

TEST_CASE("probe print: small values beside zeros, NaN or inf print in scientific notation, as PyTorch's _Formatter") {
  // torch/_tensor_str.py: the mode is chosen from the nonzero finite values only: scientific
  // when max/min > 1000, max > 1e8 or (not all whole) min < 1e-4. A zero, NaN or inf next to
  // 1e-6 must not pull the tensor into fixed mode, where 1e-6 prints as 0.0000.
  struct Case {
    std::vector<double> v;
    std::string want;
  };
  const std::vector<Case> cases{
      {{0.0, 1e-6}, "tensor([0.0000e+00, 1.0000e-06], dtype=float64)"},
      {{1e-6, kNaN}, "tensor([1.0000e-06,        nan], dtype=float64)"},
      {{0.0, 0.00012345, 10.0}, "tensor([0.0000e+00, 1.2345e-04, 1.0000e+01], dtype=float64)"},
      {{0.001, 1.5}, "tensor([1.0000e-03, 1.5000e+00], dtype=float64)"},   // max/min > 1000
      {{1.0, 2000.0}, "tensor([1.0000e+00, 2.0000e+03], dtype=float64)"},  // whole, max/min > 1000
      {{0.0, 1.0, 1000.0}, "tensor([   0.,    1., 1000.], dtype=float64)"},
      {{0.5, 2.25}, "tensor([0.5000, 2.2500], dtype=float64)"},
      {{0.0, -0.0, kNaN}, "tensor([0., -0., nan], dtype=float64)"},
      {{1.0, -kInf}, "tensor([1., -inf], dtype=float64)"},
      {{1e8, 1.0}, "tensor([1.0000e+08, 1.0000e+00], dtype=float64)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.want);
    CHECK(from_vector(c.v).str() == c.want);
  }
}

TEST_CASE("probe print: every printed number parses back to the element within the printed precision") {
  // Fixed mode: 4 decimals (|printed - x| <= 5e-5, plus the element's own float spacing);
  // scientific: 5 significant digits (relative 5e-5). NaN, +-inf and -0 print as themselves.
  std::vector<std::vector<double>> sets;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::vector<double> v = random_values(37, seed, -1.0, 1.0);
    const int scale = int(seed % 6) * 7 - 20;  // 2^-20 .. 2^15
    for (double& x : v) x = std::ldexp(x, scale + int(std::fabs(x) * 12));
    if (seed % 3 == 0) v[5] = 0.0;
    if (seed % 4 == 0) v[7] = kNaN, v[8] = -kInf;
    if (seed % 5 == 0) v[9] = -0.0;
    sets.push_back(v);
  }
  sets.push_back({1e-300, 1e300, -2.5});
  sets.push_back({65504, -65504, 6e-8});  // float16 extremes
  for (const auto& v : sets) {
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
      const Tensor t = make_tensor(v, {int64_t(v.size())}, dt);
      const std::vector<double> held = values_of(t);
      const std::string s = t.str();
      CAPTURE(s);
      const std::vector<std::string> tok = printed_tokens(s);
      REQUIRE(tok.size() == held.size());
      bool sci = false;
      for (const std::string& k : tok) sci = sci || k.find('e') != std::string::npos;
      for (size_t i = 0; i < held.size(); ++i) {
        const double x = held[i];
        const double p = std::strtod(tok[i].c_str(), nullptr);
        if (std::isnan(x)) {
          CHECK(tok[i] == "nan");
        } else if (std::isinf(x)) {
          CHECK(tok[i] == (x > 0 ? "inf" : "-inf"));
        } else {
          CHECK(std::signbit(p) == std::signbit(x));
          const double tol = sci ? 5.0001e-5 * std::fabs(x) : 5.0001e-5;
          CHECK_MESSAGE(std::fabs(p - x) <= tol, tok[i], " printed for ", x);
        }
      }
    }
  }
}

TEST_CASE("probe print: views print their own elements; big tensors show the right edges; 0-d, size-0 and bool") {
  const Tensor base = arange(0.0, 24.0, 1.0, kFloat32).view({2, 3, 4});
  CHECK(base.select(0, 1).narrow(1, 1, 2).str() == "tensor([[13., 14.],\n        [17., 18.],\n        [21., 22.]])");
  CHECK(base.permute({2, 0, 1}).select(0, 3).str() == "tensor([[ 3.,  7., 11.],\n        [15., 19., 23.]])");
  CHECK(base.select(2, 3).select(1, 2).expand({2, 2}).str() == "tensor([[11., 23.],\n        [11., 23.]])");
  CHECK(base.view({-1}).slice(0, 1, 24, 5).str() == "tensor([ 1.,  6., 11., 16., 21.])");
  // Summarized (more than 1000 elements): the first and last 3 of each dim, of the view.
  // big[i][j] = 1000 + 200 j + i: whole numbers within a ratio of 1000, so "1000." style.
  const Tensor big = arange(1000.0, 41000.0, 1.0, kFloat64).view({200, 200}).t();
  const std::vector<std::string> tok = printed_tokens(big.str());
  std::vector<std::string> want;
  for (int64_t i : {0, 1, 2, 197, 198, 199}) {
    for (int64_t j : {0, 1, 2, 197, 198, 199}) {
      if (j == 197) want.push_back("...");
      want.push_back(std::to_string(1000 + 200 * j + i) + ".");
    }
    if (i == 2) want.push_back("...");
  }
  CHECK(tok == want);
  // 0-d tensors of every dtype.
  CHECK(scalar_tensor(-0.0).str() == "tensor(-0.)");
  CHECK(scalar_tensor(kNaN, kFloat16).str() == "tensor(nan, dtype=float16)");
  CHECK(scalar_tensor(-kInf, kBFloat16).str() == "tensor(-inf, dtype=bfloat16)");
  CHECK(scalar_tensor(1e-5, kFloat64).str() == "tensor(1.0000e-05, dtype=float64)");
  CHECK(scalar_tensor(65504, kFloat16).str() == "tensor(65504., dtype=float16)");
  CHECK(scalar_tensor(-3, kInt32).str() == "tensor(-3, dtype=int32)");
  // Size-0: PyTorch prints "[]", and the size whenever the tensor is not 1-D.
  CHECK(zeros({0}).str() == "tensor([])");
  CHECK(zeros({2, 0}).str() == "tensor([], size=[2, 0])");
  CHECK(zeros({3, 0, 2}).transpose(0, 2).str() == "tensor([], size=[2, 0, 3])");
  const std::string e16 = zeros({0, 3}, kFloat16).str();
  CHECK(e16.rfind("tensor([], ", 0) == 0);
  CHECK(e16.find("size=[0, 3]") != std::string::npos);
  CHECK(e16.find("dtype=float16") != std::string::npos);
  // bool: PyTorch prints True/False, right-aligned, with no dtype (it is inferred).
  CHECK(from_vector(std::vector<bool>{true, false, true}).str() == "tensor([ True, False,  True])");
  CHECK(scalar_tensor(1, kBool).str() == "tensor(True)");
}
