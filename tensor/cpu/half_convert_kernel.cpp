// One instruction-set level's float16 <-> float32 conversions: built at x86-64-v3 and v4, each time
// with that level's -march and FRUGAL_KERNEL_ISA naming it, and nothing but its own header (and
// the intrinsics, which are never emitted out of line) in the translation unit, so no inline
// function of another header can be merged across levels (Note [GEMM kernels per instruction set]
// in tensor/cpu/gemm.cpp; tools/check_gemm_objects.py checks it).
//
// Note [Bulk float16 conversion]
// The library is built for x86-64-v2, which has no instruction that converts float16, so half.h
// converts one element at a time in integer arithmetic, with branches for subnormals, overflow and
// NaN. Under float16 autocast on the CPU every matrix product converts its operands to float32 and
// its result back, every cast and every via_float32.h chunk converts both ways, and a BERT training
// step spent most of its extra time over float32 there. F16C (part of x86-64-v3) converts 8
// elements in one instruction (vcvtph2ps, vcvtps2ph), AVX-512 16; here they run on contiguous
// arrays, the tail through the same instruction (a masked load and store at v4, a small buffer at
// v3), so every element is converted by the hardware or every one by half.h, never a mix.
//
// The bits are half.h's for every input, at every level (tests/cpu/test_half_convert.cpp checks
// all 65536 float16 values and float32 values of every exponent, near every rounding boundary):
// vcvtps2ph with _MM_FROUND_TO_NEAREST_INT rounds to nearest even whatever MXCSR says, keeps
// subnormal results and overflows to inf from 65520, as half.h. They differ on NaN alone, and
// there frugal follows PyTorch:
// - float16 -> float32: the hardware keeps the payload (shifted up 13 bits) and sets the quiet
//   bit of a signalling NaN, as IEEE 754 asks of a conversion and as PyTorch 1.13 gives
//   (torch.tensor of bits 0x7c01, float16, .float() is 0x7fc02000). half.h kept a signalling NaN
//   signalling; it now sets the quiet bit too.
// - float32 -> float16: the hardware keeps the payload's top 9 bits; PyTorch (c10::Half, and
//   .half() of any tensor) gives the one quiet NaN 0x7e00 with the input's sign, which half.h
//   gives too. So here a NaN lane is replaced by the float32 quiet NaN of its sign (0x7fc00000)
//   before the conversion, which the hardware turns into 0x7e00 with that sign.
#include "tensor/cpu/half_convert_kernel.h"

#include <immintrin.h>

#ifndef FRUGAL_KERNEL_ISA
#error "half_convert_kernel.cpp is built with -DFRUGAL_KERNEL_ISA=v3|v4 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA {

namespace {

#define FRUGAL_CONVERT_INLINE inline __attribute__((always_inline))

#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;  // elements per vector

// The conversions are written in their zero-masking form with every lane set: the plain
// _mm512_cvtph_ps/_mm512_cvtps_ph pass an undefined source that GCC 12 warns about
// (-Wmaybe-uninitialized); the instructions are the same.
constexpr __mmask16 kAll = 0xffff;

FRUGAL_CONVERT_INLINE __m512 cvtph_ps(__m256i h) { return _mm512_maskz_cvtph_ps(kAll, h); }

FRUGAL_CONVERT_INLINE __m512 load_h(const uint16_t* x) {
  return cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
/// x's float16 bits, NaN lanes made 0x7e00 with their sign (Note [Bulk float16 conversion]).
FRUGAL_CONVERT_INLINE __m256i to_h(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int32_t(0x80000000u)));
  x = _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000))));
  return _mm512_maskz_cvtps_ph(kAll, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
constexpr int64_t kWidth = 8;

FRUGAL_CONVERT_INLINE __m256 load_h(const uint16_t* x) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}
FRUGAL_CONVERT_INLINE __m128i to_h(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 quiet =
      _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(x, quiet, nan), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#endif

}  // namespace

void half_to_float(float* y, const uint16_t* x, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {  // two vectors an iteration: loads ahead of stores
    const auto a = load_h(x + i), b = load_h(x + i + kWidth);
#if defined(__AVX512F__)
    _mm512_storeu_ps(y + i, a);
    _mm512_storeu_ps(y + i + kWidth, b);
#else
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + kWidth, b);
#endif
  }
  for (; i < n; i += kWidth) {  // one vector at a time; the last one partial
    const int64_t m = n - i < kWidth ? n - i : kWidth;
#if defined(__AVX512F__)
    const __mmask16 k = __mmask16((1u << m) - 1u);
    _mm512_mask_storeu_ps(y + i, k, cvtph_ps(_mm256_maskz_loadu_epi16(k, x + i)));
#else
    uint16_t in[kWidth] = {};
    float out[kWidth];
    for (int64_t j = 0; j < m; ++j) in[j] = x[i + j];
    _mm256_storeu_ps(out, load_h(in));
    for (int64_t j = 0; j < m; ++j) y[i + j] = out[j];
#endif
  }
}

void float_to_half(uint16_t* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
#if defined(__AVX512F__)
    const __m256i a = to_h(_mm512_loadu_ps(x + i)), b = to_h(_mm512_loadu_ps(x + i + kWidth));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i + kWidth), b);
#else
    const __m128i a = to_h(_mm256_loadu_ps(x + i)), b = to_h(_mm256_loadu_ps(x + i + kWidth));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i + kWidth), b);
#endif
  }
  for (; i < n; i += kWidth) {
    const int64_t m = n - i < kWidth ? n - i : kWidth;
#if defined(__AVX512F__)
    const __mmask16 k = __mmask16((1u << m) - 1u);
    _mm256_mask_storeu_epi16(y + i, k, to_h(_mm512_maskz_loadu_ps(k, x + i)));
#else
    float in[kWidth] = {};
    uint16_t out[kWidth];
    for (int64_t j = 0; j < m; ++j) in[j] = x[i + j];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_h(_mm256_loadu_ps(in)));
    for (int64_t j = 0; j < m; ++j) y[i + j] = out[j];
#endif
  }
}

}  // namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA
