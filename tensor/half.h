#pragma once
// 16-bit floating types usable on host and device. Storage is the raw bits;
// arithmetic happens in float (see Note [Half types compute in f32]).
//
// Note [Half types compute in f32]
// Every kernel loads Half/BFloat16, converts to float, computes, and rounds once
// on store. This is what cuBLAS does with CUBLAS_COMPUTE_32F and what PyTorch's
// elementwise kernels do (opmath_t), and it keeps CPU and CUDA results within one
// rounding of each other.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define FRUGAL_HD __host__ __device__ __forceinline__
#else
#define FRUGAL_HD inline
#endif

namespace frugal {

namespace detail {
FRUGAL_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
FRUGAL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary16 <-> binary32, round-to-nearest-even, with subnormals, inf and NaN.
FRUGAL_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  // inf, or NaN with its payload and the quiet bit set, as IEEE 754's conversions, PyTorch and
  // F16C give (Note [Bulk float16 conversion] in tensor/cpu/half_convert_kernel.cpp)
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);  // +-0
    // Subnormal: value = mant * 2^-24, exact in float.
    float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

FRUGAL_HD uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN (PyTorch's one) / inf
  if (ax >= 0x477ff000u) return sign | 0x7c00u;                                 // rounds to >= 65520: overflow to inf
  if (ax < 0x38800000u) {                                                       // result is subnormal or zero
    // Scale so the half subnormal unit (2^-24) becomes 1, then round to nearest even.
    float v = bits_float(ax) * 16777216.0f;  // exact: power-of-two scaling
    uint32_t r = uint32_t(v);
    float rem = v - float(r);
    if (rem > 0.5f || (rem == 0.5f && (r & 1u))) ++r;
    return sign | uint16_t(r);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (nearest even).
  uint32_t m = ax + 0xc8000000u;  // exponent - 112
  m += 0x0fffu + ((m >> 13) & 1u);
  return sign | uint16_t(m >> 13);
}

FRUGAL_HD float bf16_bits_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

FRUGAL_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                          // nearest even
  return uint16_t(x >> 16);
}
}  // namespace detail

struct alignas(2) Half {
  uint16_t bits = 0;
  Half() = default;
  FRUGAL_HD Half(float f) {
#if defined(__CUDA_ARCH__)
    bits = __half_as_ushort(__float2half_rn(f));
#else
    bits = detail::float_to_half_bits(f);
#endif
  }
  FRUGAL_HD operator float() const {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits));
#else
    return detail::half_bits_to_float(bits);
#endif
  }
  static FRUGAL_HD Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct alignas(2) BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  FRUGAL_HD BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  FRUGAL_HD operator float() const { return detail::bf16_bits_to_float(bits); }
  static FRUGAL_HD BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

/// The type a kernel computes in for storage type T (float for the 16-bit types).
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <typename T>
using opmath_t = typename OpMath<T>::type;

}  // namespace frugal
