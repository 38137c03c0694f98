// The bulk float16 <-> float32 conversions (Note [Bulk float16 conversion] in
// tensor/cpu/half_convert_kernel.cpp) at every x86-64 level this CPU runs: every float16 value and
// float32 values of every exponent, near every rounding boundary, subnormal, overflowing and NaN,
// give half.h's bits, which an independent decoder/rounder in double checks in turn; lengths
// around the vector widths with nothing written past the end; casts of views, odd lengths, size 0
// and threaded sizes; and the callers (the float16 GEMM's copies, via_float32.h's GELU and dropout)
// give the bits of the same computation on float32 values converted one by one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tensor/cpu/half_convert.h"
#include "tensor/cpu/half_convert_kernel.h"
#include "tensor/factory.h"
#include "tensor/half.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/unary.h"
#include "tests/cpu_scopes.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

/// The level's conversions called directly on arrays (v2: the dispatch, which is half.h's loop).
void level_half_to_float(GemmIsa isa, float* y, const uint16_t* x, int64_t n) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::half_to_float(y, x, n);
    case GemmIsa::X86_64_V3: return v3::half_to_float(y, x, n);
    case GemmIsa::X86_64_V2: {
      LevelScope level(isa);
      return half_to_float(y, reinterpret_cast<const Half*>(x), n);
    }
  }
}
void level_float_to_half(GemmIsa isa, uint16_t* y, const float* x, int64_t n) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::float_to_half(y, x, n);
    case GemmIsa::X86_64_V3: return v3::float_to_half(y, x, n);
    case GemmIsa::X86_64_V2: {
      LevelScope level(isa);
      return float_to_half(reinterpret_cast<Half*>(y), x, n);
    }
  }
}

/// float16 bits h decoded without half.h: sign, exponent and mantissa scaled in double; a NaN is
/// quiet with h's payload shifted up (IEEE 754's conversion, PyTorch's).
uint32_t decode_reference(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return sign | 0x7f800000u | (mant ? 0x00400000u | uint32_t(mant) << 13 : 0u);
  const double v = exp == 0 ? std::ldexp(double(mant), -24) : std::ldexp(1024.0 + mant, exp - 25);
  return sign | detail::float_bits(float(v));  // exact: float holds every float16 value
}

/// float32 bits u rounded to float16 without half.h: the value's multiple of the float16 quantum
/// of its binade, rounded half to even in double; past the largest finite, inf; NaN to 0x7e00
/// with its sign (PyTorch's).
uint16_t round_reference(uint32_t u) {
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float f = detail::bits_float(u);
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(double(f));
  if (std::isinf(a)) return sign | 0x7c00;
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int binade = std::max(e - 1, -14);
  const double quantum = std::ldexp(1.0, binade - 10);
  const double q = a / quantum;  // exact: a power-of-two scaling
  double k = std::floor(q);
  const double rest = q - k;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(k, 2.0) == 1.0)) k += 1.0;
  const double r = k * quantum;
  if (r > 65504.0) return sign | 0x7c00;
  if (r < std::ldexp(1.0, -14)) return sign | uint16_t(k);  // subnormal: k units of 2^-24
  int er;
  std::frexp(r, &er);
  return sign | uint16_t((er - 1 + 15) << 10) | uint16_t(std::ldexp(r, 11 - er) - 1024.0);
}

/// float32 bit patterns of every exponent and sign: mantissas whose low r bits sit at, just
/// below and just above the tie of rounding away r bits (r = 1..23, which covers the float16
/// normal cut at 13 bits and the subnormal cuts above it), on even and odd kept parts; a stride
/// over all 2^32 patterns; and the named edges (65504, 65520, the subnormal boundary, NaN payloads).
std::vector<uint32_t> float_sample() {
  std::vector<uint32_t> s;
  std::mt19937 rng(7);
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t exp = 0; exp < 256; ++exp)
      for (int r = 1; r <= 23; ++r) {
        const uint32_t tie = 1u << (r - 1), low = (1u << r) - 1;
        for (int k = 0; k < 6; ++k) {
          const uint32_t kept = (k < 2 ? uint32_t(k) << r : rng() & ~low) & 0x7fffffu;
          for (uint32_t d : {0u, 1u, tie - 1, tie, tie + 1, low})
            s.push_back(sign | exp << 23 | ((kept | (d & low)) & 0x7fffffu));
        }
      }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) s.push_back(uint32_t(u));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t u : {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x7f7fffffu, 0x7f800000u,
                       0x38800000u, 0x387fffffu, 0x387fe000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u,
                       0x00000001u, 0x007fffffu, 0x00800000u, 0u})
      s.push_back(sign | u);
    for (int k = 0; k < 23; ++k) {  // NaN payloads: one bit, and all bits below it (signalling and quiet)
      s.push_back(sign | 0x7f800000u | 1u << k);
      s.push_back(sign | 0x7f800000u | ((2u << k) - 1));
    }
  }
  return s;
}

std::vector<uint16_t> bits16(const Tensor& t) {  // t's elements, row-major, through a contiguous copy
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint16_t*>(c.data());
  return std::vector<uint16_t>(p, p + c.numel());
}
std::vector<uint32_t> bits32(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint32_t*>(c.data());
  return std::vector<uint32_t>(p, p + c.numel());
}

/// A float16 tensor of `shape` from float32 values, rounded one by one by half.h.
Tensor half_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = empty(shape, kFloat16);
  for (size_t i = 0; i < v.size(); ++i) t.data_ptr<Half>()[i] = Half(v[i]);
  return t;
}
/// t's values (float16, any layout) widened one by one by half.h, as a contiguous float32 tensor.
Tensor widen_by_element(const Tensor& t) {
  const std::vector<uint16_t> b = bits16(t);
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = detail::half_bits_to_float(b[i]);
  return from_vector<float>(v, t.sizes());
}
/// t's values (float32) rounded one by one by half.h.
std::vector<uint16_t> round_by_element(const Tensor& t) {
  const std::vector<uint32_t> b = bits32(t);
  std::vector<uint16_t> h(b.size());
  for (size_t i = 0; i < b.size(); ++i) h[i] = detail::float_to_half_bits(detail::bits_float(b[i]));
  return h;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("half convert: half.h against the independent decoder and rounder") {
  int64_t bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t got = detail::float_bits(detail::half_bits_to_float(uint16_t(h))),
                   want = decode_reference(uint16_t(h));
    if (got != want && bad++ < 3) FAIL_CHECK("float16 ", h, ": half.h gives ", got, ", the reference ", want);
  }
  for (uint32_t u : float_sample()) {
    const uint16_t got = detail::float_to_half_bits(detail::bits_float(u)), want = round_reference(u);
    if (got != want && bad++ < 6) FAIL_CHECK("float32 bits ", u, ": half.h gives ", got, ", the reference ", want);
  }
  CHECK(bad == 0);
  // The edges by name: 65520 is the first float that overflows, a signalling float16 NaN
  // becomes quiet with its payload, every float32 NaN becomes 0x7e00 with its sign.
  CHECK(detail::float_to_half_bits(65519.99f) == 0x7bff);
  CHECK(detail::float_to_half_bits(65520.0f) == 0x7c00);
  CHECK(detail::float_to_half_bits(-65520.0f) == 0xfc00);
  CHECK(detail::float_bits(detail::half_bits_to_float(0x7c01)) == 0x7fc02000u);
  CHECK(detail::float_bits(detail::half_bits_to_float(0xfe01)) == 0xffc02000u);
  CHECK(detail::float_to_half_bits(detail::bits_float(0x7f800001u)) == 0x7e00);
  CHECK(detail::float_to_half_bits(detail::bits_float(0xffa00000u)) == 0xfe00);
}

TEST_CASE("half convert: every float16 value, and float32 near every rounding boundary, at every level") {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  const std::vector<uint32_t> sample = float_sample();
  std::vector<float> fs(sample.size());
  for (size_t i = 0; i < sample.size(); ++i) fs[i] = detail::bits_float(sample[i]);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    std::vector<float> wide(all.size());
    level_half_to_float(isa, wide.data(), all.data(), int64_t(all.size()));
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint32_t got = detail::float_bits(wide[h]),
                     want = detail::float_bits(detail::half_bits_to_float(uint16_t(h)));
      if (got != want && bad++ < 3) FAIL_CHECK("float16 ", h, " -> ", got, ", half.h ", want);
    }
    std::vector<uint16_t> narrow(fs.size());
    level_float_to_half(isa, narrow.data(), fs.data(), int64_t(fs.size()));
    for (size_t i = 0; i < fs.size(); ++i) {
      const uint16_t want = detail::float_to_half_bits(fs[i]);
      if (narrow[i] != want && bad++ < 6) FAIL_CHECK("float32 bits ", sample[i], " -> ", narrow[i], ", half.h ", want);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("half convert: every length up to 3 vectors and more, unaligned, nothing written past the end") {
  const std::vector<float> v = random_values(4200, 3, 100.0f);
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = detail::float_to_half_bits(v[i]);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n : {127, 128, 129, 4095, 4096, 4097}) lengths.push_back(n);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    for (int64_t n : lengths) {
      for (int64_t at : {0, 1, 3}) {  // element offsets: 2- and 4-byte aligned, not 16 or 32
        CAPTURE(n);
        CAPTURE(at);
        std::vector<float> wide(size_t(n + 8 + at), -7.0f);
        level_half_to_float(isa, wide.data() + at, h.data() + at, n);
        std::vector<uint16_t> narrow(size_t(n + 8 + at), 0x1234);
        level_float_to_half(isa, narrow.data() + at, v.data() + at, n);
        bool ok = true;
        for (int64_t i = 0; i < n + 8 + at; ++i) {
          const bool inside = i >= at && i < at + n;
          ok &= detail::float_bits(wide[size_t(i)]) ==
                (inside ? detail::float_bits(detail::half_bits_to_float(h[size_t(i)])) : detail::float_bits(-7.0f));
          ok &= narrow[size_t(i)] == (inside ? h[size_t(i)] : 0x1234);
        }
        CHECK(ok);
      }
    }
  }
}

TEST_CASE("half convert: casts of views, odd lengths, size 0 and threaded sizes give the elementwise bits") {
  const std::vector<float> v = random_values(3 * 70001, 11, 300.0f);
  const Tensor f = from_vector<float>(v, {3, 70001});  // 210003 elements: threaded, odd
  const Tensor h = half_tensor(v, {3, 70001});
  const Tensor f2 = f.narrow(1, 0, 64 * 65).view({3, 64, 65}), h2 = h.narrow(1, 0, 64 * 65).view({3, 64, 65});
  // Views of a (3, 70001) tensor t and of t3, its first 64 x 65 columns as (3, 64, 65): a dense
  // run, a narrow, transposes, a step, an expand, size 0 and size 1.
  const auto views_of = [](const Tensor& t, const Tensor& t3) {
    return std::vector<Tensor>{t,
                               t.narrow(1, 5, 33),
                               t.t(),
                               t3.transpose(1, 2),
                               t3.slice(2, 1, 65, 2),
                               t.narrow(0, 1, 1).expand({4, 70001}),
                               t.narrow(1, 0, 0),
                               t.narrow(1, 7, 1)};
  };
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope level(isa);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      ThreadScope scope(threads);
      for (const Tensor& x : views_of(f, f2)) {
        CAPTURE(x.describe());
        CHECK(bits16(x.to(kFloat16)) == round_by_element(x));
        Tensor dst = empty(x.sizes(), kFloat16);
        dst.copy_(x);
        CHECK(bits16(dst) == round_by_element(x));
      }
      for (const Tensor& x : views_of(h, h2)) {
        CAPTURE(x.describe());
        CHECK(bits32(x.to(kFloat32)) == bits32(widen_by_element(x)));
        if (x.dim() == 2) {  // into a transposed float32 destination
          Tensor d = empty({x.size(1), x.size(0)}, kFloat32).t();
          d.copy_(x);
          CHECK(bits32(d) == bits32(widen_by_element(x)));
        }
      }
      // float32 into a float16 destination with a step of 2

      Tensor hs = empty({2, 70001 * 2}, kFloat16).slice(1, 0, 70001 * 2, 2).narrow(0, 0, 1);
      hs.copy_(f.narrow(0, 2, 1));
      CHECK(bits16(hs) == round_by_element(f.narrow(0, 2, 1)));
    }
  }
}

TEST_CASE("half convert: float16 matmul, bmm and linear keep the bits of float32 products of the widened values") {
  // The float16 GEMM multiplies float32 copies and rounds once (Note [Half types compute in
  // f32]); its copies now convert in bulk, a transposed operand in its own memory order. The
  // reference is the float32 product of copies widened element by element, rounded by half.h.
  const Tensor a = half_tensor(random_values(96 * 80, 1, 1.0f), {96, 80});
  const Tensor b = half_tensor(random_values(80 * 72, 2, 1.0f), {80, 72});
  const Tensor w = half_tensor(random_values(72 * 80, 3, 0.1f), {72, 80});  // linear's (out, in)
  const Tensor bias = half_tensor(random_values(72, 4, 1.0f), {72});
  const Tensor batch_a = half_tensor(random_values(3 * 40 * 24, 5, 1.0f), {3, 40, 24});
  const Tensor batch_b = half_tensor(random_values(3 * 24 * 36, 6, 1.0f), {3, 24, 36});
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope level(isa);
    auto check_mm = [&](const Tensor& x, const Tensor& y) {
      CAPTURE(x.describe());
      CAPTURE(y.describe());
      const Tensor want = ops::matmul(widen_by_element(x), widen_by_element(y));
      CHECK(bits16(ops::matmul(x, y)) == round_by_element(want));
    };
    check_mm(a, b);
    check_mm(a, w.t());                                // a transposed dense operand: converted in its own order
    check_mm(b.t(), a.t());                            // both
    check_mm(a.narrow(1, 0, 72), w.narrow(0, 0, 72));  // strided rows
    check_mm(batch_a, batch_b);
    check_mm(batch_a, batch_b.transpose(1, 2).contiguous().transpose(1, 2));  // (3, 24, 36) column-major
    check_mm(batch_a, batch_b.narrow(0, 0, 1).expand({3, 24, 36}));           // a broadcast batch
    CHECK(bits16(ops::linear(a, w, bias)) ==
          round_by_element(ops::linear(widen_by_element(a), widen_by_element(w), widen_by_element(bias))));
    CHECK(bits16(ops::linear(a, w)) == round_by_element(ops::linear(widen_by_element(a), widen_by_element(w))));
  }
}

TEST_CASE("half convert: float16 GELU and dropout through via_float32 keep the float32 kernel's bits") {
  const int64_t n = 4096 * 2 + 37;  // chunks of 4096 and a partial one
  const Tensor x = half_tensor(random_values(n, 8, 3.0f), {n}), g = half_tensor(random_values(n, 9, 1.0f), {n});
  const Tensor xf = widen_by_element(x), gf = widen_by_element(g);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope level(isa);
    CHECK(bits16(ops::unary(ops::UnaryOp::Gelu, x)) == round_by_element(ops::unary(ops::UnaryOp::Gelu, xf)));
    CHECK(bits16(ops::unary_backward(ops::UnaryOp::Gelu, g, x)) ==
          round_by_element(ops::unary_backward(ops::UnaryOp::Gelu, gf, xf)));
    const Generator::Range range{0x1234567887654321ull, 99};
    CHECK(bits16(ops::dropout_with_range(x, 0.3, range)) == round_by_element(ops::dropout_with_range(xf, 0.3, range)));
  }
}
