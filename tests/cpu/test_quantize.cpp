// quantize_blockwise / dequantize_blockwise (Note [Blockwise quantization]) against float64
// reference encoders written from the formats' definitions (nearest of the 255 e4m3fn values,
// ties to the even code; round half to even for int8): exact codes, scales and values, in
// float32/float16/bfloat16, contiguous, transposed, strided, narrowed, size-0, blocks that do
// not divide numel; the per-element error bound; the e4m3 edge cases (ties, subnormals,
// saturation, zero blocks, NaN and inf); relu_mask / apply_relu_mask (Note [ReLU masks]).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/quantize.h"
#include "tensor/ops/quantize_math.h"
#include "tensor/ops/unary.h"
#include "tests/quantize_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::QuantFormat;

namespace {

const DType kQuantTypes[] = {kFloat32, kFloat16, kBFloat16};
const QuantFormat kFormats[] = {QuantFormat::Fp8E4M3, QuantFormat::Int8};

// ---- float64 references ---------------------------------------------------------

/// The value of the positive e4m3fn code c (0 .. 0x7E), from the definition.
double e4m3_value(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

/// The e4m3fn code of v: the nearest finite value (ties to the even code), saturated.
uint8_t ref_e4m3(double v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(v);
  int best = 0x7E;
  if (a < 448.0) {
    double best_err = std::numeric_limits<double>::infinity();
    for (int c = 0; c <= 0x7E; ++c) {
      const double err = std::fabs(a - e4m3_value(c));
      if (err < best_err || (err == best_err && c % 2 == 0)) best = c, best_err = err;
    }
  }
  return uint8_t(sign | best);
}

double ref_e4m3_decode(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e4m3_value(c & 0x7F);
  return (c & 0x80) ? -mag : mag;
}

uint8_t ref_int8(double v) {
  const double q = std::min(127.0, std::max(-127.0, std::nearbyint(v)));  // half to even
  return uint8_t(int8_t(q));
}

double ref_int8_decode(uint8_t c) { return c == 0x80 ? std::numeric_limits<double>::quiet_NaN() : double(int8_t(c)); }

struct RefQuantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> values;  // dequantized, rounded to the output dtype
};

/// Float32 roundings as the definition has them: q_i is ref_scaled (a float32 product or
/// quotient of float32 values is the float64 one rounded to float32: double rounding is
/// innocuous for / and *).
RefQuantized ref_quantize(const std::vector<double>& x, QuantFormat format, int64_t block, DType out) {
  const bool fp8 = format == QuantFormat::Fp8E4M3;
  const double qmax = fp8 ? 448.0 : 127.0;
  const int64_t n = int64_t(x.size());
  RefQuantized r;
  for (int64_t lo = 0; lo < n; lo += block) {
    const int64_t hi = std::min(n, lo + block);
    double absmax = 0.0;
    for (int64_t i = lo; i < hi; ++i)
      if (std::isfinite(x[size_t(i)])) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
    const float scale = float(absmax / qmax);
    r.scales.push_back(scale);
    for (int64_t i = lo; i < hi; ++i) {
      const double v = x[size_t(i)];
      uint8_t c;
      if (!std::isfinite(v)) {
        c = fp8 ? 0x7F : 0x80;
      } else {
        const double s = ref_scaled(v, scale);
        c = fp8 ? ref_e4m3(s) : ref_int8(s);
      }
      r.codes.push_back(c);
      const float dq = float((fp8 ? ref_e4m3_decode(c) : ref_int8_decode(c)) * double(scale));
      r.values.push_back(out == kFloat16    ? double(float(Half(dq)))
                         : out == kBFloat16 ? double(float(BFloat16(dq)))
                                            : double(dq));
    }
  }
  return r;
}

bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

/// Quantizes x, checks codes, scales and the dequantized values against the reference bit
/// for bit, and each element against the bound of Note [Blockwise quantization].
void check_quantize(const Tensor& x, QuantFormat format, int64_t block, const std::string& what) {
  INFO(what, " ", std::string(ops::to_string(format)), " block ", block, " ", x.describe());
  const std::vector<double> xv = values_of(x);
  const RefQuantized ref = ref_quantize(xv, format, block, x.dtype());
  const ops::Quantized q = ops::quantize_blockwise(x, format, block);
  REQUIRE(q.codes.dtype() == kUInt8);
  REQUIRE(q.codes.numel() == x.numel());
  REQUIRE(q.scales.numel() == int64_t(ref.scales.size()));
  const uint8_t* codes = q.codes.data_ptr<uint8_t>();
  const float* scales = q.scales.data_ptr<float>();
  int64_t code_mismatches = 0, scale_mismatches = 0, value_mismatches = 0, bound_failures = 0;
  for (size_t b = 0; b < ref.scales.size(); ++b) scale_mismatches += scales[b] != ref.scales[b];
  for (size_t i = 0; i < ref.codes.size(); ++i) {
    if (codes[i] != ref.codes[i]) {
      if (code_mismatches++ < 5)
        MESSAGE("code ", i, ": ", int(codes[i]), " expected ", int(ref.codes[i]), " for ", xv[i]);
    }
  }
  const Tensor dq = ops::dequantize_blockwise(q.codes, q.scales, format, block, x.dtype(), x.sizes());
  REQUIRE(dq.sizes() == x.sizes());
  REQUIRE(dq.dtype() == x.dtype());
  REQUIRE(dq.is_contiguous());
  const std::vector<double> dv = values_of(dq);
  const double out_ulp = x.dtype() == kFloat16    ? std::ldexp(1.0, -11)
                         : x.dtype() == kBFloat16 ? std::ldexp(1.0, -8)
                                                  : 0.0;
  for (size_t i = 0; i < dv.size(); ++i) {
    if (!same_double(dv[i], ref.values[i]) && value_mismatches++ < 5)
      MESSAGE("value ", i, ": ", dv[i], " expected ", ref.values[i]);
    if (!std::isfinite(xv[i])) {
      bound_failures += !std::isnan(dv[i]);
      continue;
    }
    const double scale = ref.scales[i / size_t(block)];
    const double ax = std::fabs(xv[i]);
    const double bound =
        (format == QuantFormat::Fp8E4M3 ? std::max(std::ldexp(ax, -4), std::ldexp(scale, -10)) : 0.5 * scale) +
        std::ldexp(ax + scale, -20) + out_ulp * std::fabs(dv[i]);
    if (!(std::fabs(xv[i] - dv[i]) <= bound) && bound_failures++ < 5)
      MESSAGE("bound ", i, ": |", xv[i], " - ", dv[i], "| > ", bound);
  }
  CHECK(code_mismatches == 0);
  CHECK(scale_mismatches == 0);
  CHECK(value_mismatches == 0);
  CHECK(bound_failures == 0);
}

}  // namespace

TEST_CASE("quantize: the e4m3 encoder against the nearest-value reference at every edge") {
  std::vector<float> values;
  // Every code's value, the midpoints between neighbours (ties: to the even code), and the
  // floats just beside each midpoint.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = float(e4m3_value(c)), hi = float(e4m3_value(c + 1));
    const float mid = float((double(lo) + double(hi)) / 2);  // exact: few bits
    values.insert(values.end(), {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)});
  }
  // Saturation: 448 and above, the would-be next value 480 and its midpoint 464, inf;
  // subnormal floats; the smallest normal and its neighbours.
  const float inf = std::numeric_limits<float>::infinity();
  values.insert(values.end(), {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e30f, inf, std::ldexp(1.0f, -6),
                               std::nextafter(std::ldexp(1.0f, -6), 0.0f), std::ldexp(1.0f, -10),
                               std::nextafter(std::ldexp(1.0f, -10), 1.0f), 1e-40f, 0.0f});
  for (double v : random_values(4000, 7, -9.0, 9.0)) values.push_back(float(std::pow(2.0, v) * (v > 0 ? 1.3 : 0.7)));
  int64_t mismatches = 0;
  for (float v : values) {
    for (float s : {v, -v}) {
      const uint8_t got = ops::quant::e4m3_encode(s), want = ref_e4m3(double(s));
      if (got != want && mismatches++ < 10) MESSAGE(s, ": got ", int(got), " expected ", int(want));
    }
  }
  CHECK(mismatches == 0);
  CHECK(ops::quant::e4m3_encode(std::numeric_limits<float>::quiet_NaN()) == 0x7F);
  CHECK(ops::quant::e4m3_encode(-inf) == 0xFE);
  // Ties by name: 1 + 1/16 rounds down to 1 (even), 1 + 3/16 up to 1.25 (even), 2^-10 (half
  // the smallest subnormal) to 0, 15 * 2^-10 up to 2^-6, the smallest normal.
  CHECK(ops::quant::e4m3_encode(1.0625f) == 0x38);
  CHECK(ops::quant::e4m3_encode(1.1875f) == 0x3A);
  CHECK(ops::quant::e4m3_encode(std::ldexp(1.0f, -10)) == 0x00);
  CHECK(ops::quant::e4m3_encode(-std::ldexp(1.0f, -10)) == 0x80);
  CHECK(ops::quant::e4m3_encode(15 * std::ldexp(1.0f, -10)) == 0x08);
  CHECK(ops::quant::e4m3_encode(3 * std::ldexp(1.0f, -10)) == 0x02);
  for (int c = 0; c < 256; ++c) {
    const double want = ref_e4m3_decode(uint8_t(c));
    CHECK_MESSAGE(same_double(double(ops::quant::e4m3_decode(uint8_t(c))), want), "code ", c);
  }
}

TEST_CASE("quantize: codes, scales and values match the float64 reference in every dtype and layout") {
  uint64_t seed = 1;
  for (QuantFormat format : kFormats) {
    for (DType dt : kQuantTypes) {
      for (Layout layout : kAllLayouts) {
        const Tensor x = random_tensor({7, 37}, dt, seed++, layout, -3.0, 3.0);
        for (int64_t block : {1, 7, 32, 256, 1000}) check_quantize(x, format, block, name_of(dt, layout));
      }
      // Narrowed (an offset and a row stride), permuted 3-d, size 0, one element, a wide
      // dynamic range within one block.
      const Tensor big = random_tensor({9, 40}, dt, seed++);
      check_quantize(big.narrow(0, 2, 5).narrow(1, 3, 31), format, 16, "narrowed");
      check_quantize(random_tensor({3, 4, 5}, dt, seed++).permute({2, 0, 1}), format, 6, "permuted");
      check_quantize(empty({0, 4}, dt), format, 256, "size-0");
      check_quantize(random_tensor({1}, dt, seed++), format, 256, "one element");
      std::vector<double> wide = random_values(300, seed++, -1.0, 1.0);
      for (size_t i = 0; i < wide.size(); ++i) wide[i] *= std::pow(10.0, double(i % 7) - 5.0);
      check_quantize(make_tensor(wide, {300}, dt), format, 100, "wide range");
    }
  }
}

TEST_CASE("quantize: zero blocks, signed zeros, NaN and inf") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  //                    block 0: zeros      block 1: NaN, inf among finite      block 2: only non-finite
  const std::vector<double> v = {0.0, -0.0, 0.0, 0.0, 1.5, nan, -inf, -3.0, nan, inf, -inf, nan};
  for (QuantFormat format : kFormats) {
    for (DType dt : kQuantTypes) {
      const Tensor x = make_tensor(v, {12}, dt);
      check_quantize(x, format, 4, "non-finite");
      const ops::Quantized q = ops::quantize_blockwise(x, format, 4);
      const std::vector<double> scales = values_of(q.scales);
      CHECK(scales[0] == 0.0);
      CHECK(scales[1] == double(float(3.0 / (format == QuantFormat::Fp8E4M3 ? 448.0 : 127.0))));
      CHECK(scales[2] == 0.0);
      const std::vector<double> dq = values_of(ops::dequantize_blockwise(q.codes, q.scales, format, 4, dt, {12}));
      CHECK(std::signbit(dq[1]) == (format == QuantFormat::Fp8E4M3));  // -0 stays -0 in e4m3; int8 has no -0
      CHECK(dq[4] == doctest::Approx(1.5).epsilon(0.07));
      CHECK(dq[7] == doctest::Approx(-3.0).epsilon(1e-6));  // the absmax element: 448 * scale
      for (int i : {5, 6, 8, 9, 10, 11}) CHECK_MESSAGE(std::isnan(dq[size_t(i)]), "element ", i);
    }
  }
}

TEST_CASE("quantize: errors name the op and the tensors") {
  check_error([] { ops::quantize_blockwise(zeros({4}, kFloat64), QuantFormat::Int8, 4); },
              {"quantize_blockwise", "float64[4] cpu"});
  check_error([] { ops::quantize_blockwise(zeros({4}), QuantFormat::Int8, 0); }, {"quantize_blockwise", "block"});
  const ops::Quantized q = ops::quantize_blockwise(zeros({10}), QuantFormat::Fp8E4M3, 4);
  check_error([&] { ops::dequantize_blockwise(q.codes, q.scales, QuantFormat::Fp8E4M3, 4, kFloat32, {11}); },
              {"dequantize_blockwise", "uint8[10] cpu", "[11]"});
  check_error([&] { ops::dequantize_blockwise(q.codes, q.scales, QuantFormat::Fp8E4M3, 5, kFloat32, {10}); },
              {"dequantize_blockwise", "float32[3] cpu"});
  check_error([&] { ops::dequantize_blockwise(q.codes, q.scales, QuantFormat::Fp8E4M3, 4, kInt32, {10}); },
              {"dequantize_blockwise", "int32"});
  check_error([&] { ops::unary(ops::UnaryOp::Relu, q.codes); }, {"uint8"});
}

TEST_CASE("quantize: relu_mask packs what relu's backward passes, apply_relu_mask is that backward bit for bit") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  uint64_t seed = 100;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (Layout layout : kAllLayouts) {
      std::vector<double> yv = random_values(5 * 13, seed++, -1.0, 1.0);
      yv[3] = 0.0, yv[4] = -0.0, yv[5] = nan, yv[6] = 1e-30;
      const Tensor y = make_tensor(yv, {5, 13}, dt, layout);
      const Tensor g = random_tensor({5, 13}, dt, seed++, kAllLayouts[(int(layout) + 1) % 3]);
      const Tensor mask = ops::relu_mask(y);
      REQUIRE(mask.numel() == (65 + 7) / 8);
      const std::vector<double> ys = values_of(y), gs = values_of(g);
      const uint8_t* m = mask.data_ptr<uint8_t>();
      for (size_t i = 0; i < ys.size(); ++i)
        CHECK_MESSAGE(bool((m[i / 8] >> (i % 8)) & 1) == !(ys[i] <= 0.0), "element ", i, " ", name_of(dt, layout));
      const std::vector<double> got = values_of(ops::apply_relu_mask(g, mask));
      const std::vector<double> want = values_of(ops::unary_backward(ops::UnaryOp::Relu, g, y));
      for (size_t i = 0; i < got.size(); ++i)
        CHECK_MESSAGE(same_double(got[i], want[i]), "element ", i, " ", name_of(dt, layout));
    }
  }
  CHECK(ops::relu_mask(empty({0, 3})).numel() == 0);
  CHECK(ops::apply_relu_mask(empty({0, 3}), ops::relu_mask(empty({0, 3}))).sizes() == Shape{0, 3});
  check_error([] { ops::apply_relu_mask(zeros({9}), ops::relu_mask(zeros({8}))); },
              {"apply_relu_mask", "uint8[1] cpu", "float32[9] cpu"});
}
