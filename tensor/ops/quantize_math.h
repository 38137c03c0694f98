#pragma once
// The scalar encoders and decoders of Note [Blockwise quantization] and the logical-order
// indexer both backends walk x with, compiled for the host (tensor/cpu/quantize.cpp) and the
// device (tensor/cuda/quantize.cu) from this one file (Note [One formula, two backends] in
// tensor/ops/unary_math.h). CUDA encodes e4m3 with the hardware conversion instead of
// e4m3_encode; tests/gpu/test_quantize_cuda.cpp checks that the two agree bit for bit.
#include <math.h>

#include <cstdint>

#include "tensor/half.h"
#include "tensor/ops/quantize.h"

namespace frugal::ops::quant {

inline constexpr float kE4M3Max = 448.0f;  // 1.75 * 2^8, the largest finite e4m3fn value
inline constexpr float kInt8Max = 127.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;  // S.1111.111 with S = 0
inline constexpr uint8_t kInt8NaN = 0x80;  // -128, never a code of a number

FRUGAL_HD float qmax(QuantFormat format) { return format == QuantFormat::Fp8E4M3 ? kE4M3Max : kInt8Max; }
FRUGAL_HD uint8_t nan_code(QuantFormat format) { return format == QuantFormat::Fp8E4M3 ? kE4M3NaN : kInt8NaN; }

/// The e4m3fn code of v rounded to nearest even, saturated to +-448 (inf too); NaN -> 0x7F.
/// The software form of __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3).
FRUGAL_HD uint8_t e4m3_encode(float v) {
  const uint32_t u = detail::float_bits(v);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kE4M3NaN;
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (a < 0x3c800000u) {
    // Below 2^-6, the smallest normal: subnormal steps of 2^-9, so the code is the
    // mantissa |v| * 2^9 rounded to nearest even (8 rounds up to 0x08 = 2^-6 exactly).
    // The scaling by a power of two is exact.
    return sign | uint8_t(rintf(detail::bits_float(a) * 512.0f));
  }
  // Normal: keep 3 of float32's 23 mantissa bits, rounding to nearest even; a carry runs
  // into the exponent as it should. (a >> 20) is (exponent << 3 | top 3 mantissa bits), and
  // the exponent bias goes from 127 to 7.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  const uint32_t code = r - (120u << 3);
  return sign | uint8_t(code > 0x7eu ? 0x7eu : code);
}

/// The factor a block's values are multiplied by before encoding (Note [Blockwise
/// quantization]): 1 / scale rounded to float32, or 0 where that is not finite (a scale of 0,
/// or below 2^-128, whose values are divided instead).
FRUGAL_HD float inverse_scale(float scale) {
#ifdef __CUDA_ARCH__
  const float inv = scale > 0.0f ? __frcp_rn(scale) : 0.0f;  // IEEE under any flags, as the host's
#else
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
#endif
  return ::isfinite(inv) ? inv : 0.0f;  // ::, not frugal::ops::isfinite (a tensor op)
}

/// v (finite) in units of its block's scale: v * inverse, v / scale where the inverse is 0, and
/// v itself in a block of zeros (scale 0: v is +-0, or below the scale's range).
FRUGAL_HD float scaled(float v, float scale, float inverse) {
#ifdef __CUDA_ARCH__
  if (inverse != 0.0f) return __fmul_rn(v, inverse);
  return scale > 0.0f ? __fdiv_rn(v, scale) : v;
#else
  if (inverse != 0.0f) return v * inverse;
  return scale > 0.0f ? v / scale : v;
#endif
}

/// The value of an e4m3fn code (exact in float32).
FRUGAL_HD float e4m3_decode(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 15 && m == 7) return detail::bits_float(0x7fc00000u);
  const float mag = e == 0 ? float(m) * 0.001953125f  // m * 2^-9
                           : detail::bits_float(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -mag : mag;
}

/// A dequantized value decode(code) * scale as computed in float32, kept finite: the product
/// rounds past the largest float32 only for a block whose absmax is FLT_MAX itself (int8:
/// 127 * fl(FLT_MAX / 127) rounds to 2^128), and a finite input must not come back as inf
/// (Note [Blockwise quantization]). NaN stays NaN.
FRUGAL_HD float keep_finite(float product) {
  constexpr float kFloat32Max = 3.40282347e38f;
  return fabsf(product) > kFloat32Max ? copysignf(kFloat32Max, product) : product;
}

/// The int8 code (as a byte) of v rounded half to even, clamped to [-127, 127]; v finite.
FRUGAL_HD uint8_t int8_encode(float v) {
  const float q = fminf(fmaxf(rintf(v), -kInt8Max), kInt8Max);
  return uint8_t(int8_t(q));
}

/// The value of an int8 code; 0x80 is NaN.
FRUGAL_HD float int8_decode(uint8_t c) { return c == kInt8NaN ? detail::bits_float(0x7fc00000u) : float(int8_t(c)); }

/// Where element i (row-major over the logical sizes) of a strided tensor lives, for
/// kernels that walk any layout in logical order. Dims that are contiguous with each other
/// are merged, so a contiguous tensor has one dim of stride 1.
struct LogicalIndexer {
  static constexpr int kMaxDims = 12;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  FRUGAL_HD bool dense() const { return ndim == 0 || (ndim == 1 && strides[0] == 1); }
  FRUGAL_HD int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = ndim - 1; d > 0; --d) {
      off += (i % sizes[d]) * strides[d];
      i /= sizes[d];
    }
    return ndim > 0 ? off + i * strides[0] : off;
  }
};

/// The indexer of t (numel > 0), host side; throws past kMaxDims merged dims.
inline LogicalIndexer make_logical_indexer(const Tensor& t, const char* op) {
  LogicalIndexer ix;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    if (size == 1) continue;
    if (ix.ndim > 0 && ix.strides[ix.ndim - 1] == stride * size) {
      ix.sizes[ix.ndim - 1] *= size;  // merges into the dim before it
      ix.strides[ix.ndim - 1] = stride;
      continue;
    }
    FRUGAL_CHECK(ix.ndim < LogicalIndexer::kMaxDims, op, ": ", t.describe(), " has more than ",
                 LogicalIndexer::kMaxDims, " dims that do not merge");
    ix.sizes[ix.ndim] = size;
    ix.strides[ix.ndim] = stride;
    ++ix.ndim;
  }
  return ix;
}

}  // namespace frugal::ops::quant
