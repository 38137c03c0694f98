// One instruction-set level's float32 softmax rows for attention: built once per level, each
// time with that level's -march, FRUGAL_KERNEL_ISA naming it (v2, v3, v4), -fopenmp-simd,
// -ffp-contract=off and -fno-trapping-math, and nothing but its own header in the translation
// unit (Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp; tools/check_gemm_objects.py
// checks it).
//
// Note [Vectorized masked softmax]
// The generic masked softmax (masked_softmax.cpp) is a scalar loop per row that calls glibc's
// expf per element; the gradient (softmax.cpp) is Eigen's, at the library's SSE4.2 width. Here
// both are loops the compiler vectorizes at the level's width, computing what the generic
// path computes in the same order of operations: the logit v = x * scale in float, -inf past
// keep_end (causal) or where a bool mask is false, plus an additive mask; the row's maximum m
// (NaN wins: a NaN anywhere makes the whole row NaN, as the generic path's NaN m and sum do);
// zeros when m is -inf (Note [Masked softmax]); else z = exp(v - m), 0 for v = -inf, their sum
// in double, and y = z * float(1 / sum). exp is computed in double (Cody-Waite reduction to
// |r| <= ln2 / 2, Taylor to degree 10: relative error below 2e-13) and rounded once to float,
// so z is the correctly rounded float of exp(v - m) but where that lies within 2e-13 of a
// rounding boundary (glibc's expf is correctly rounded as well); exp(d) for d < -105 is 0, as
// the float it rounds to. Only the sums' order differs from the generic path (vector lanes
// accumulate separately), so y agrees with it to within a float rounding or two
// (tests/cpu/test_masked_softmax_simd.cpp). The gradient gi = y (g - float(sum(g y))), the sum of
// the exact double products in double, is the generic formula with the same caveat.
#include "tensor/cpu/masked_softmax_kernel.h"

#ifndef FRUGAL_KERNEL_ISA
#error "masked_softmax_kernel.cpp is built with -DFRUGAL_KERNEL_ISA=v2|v3|v4 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA {

namespace {

#define FRUGAL_SOFTMAX_INLINE inline __attribute__((always_inline))

constexpr float kNegInf = -__builtin_inff();

/// exp(d) rounded to float, for d <= 0, -inf or NaN (NaN stays NaN); 0 below -105.
FRUGAL_SOFTMAX_INLINE float exp_nonpositive(float df) {
  const double d = df;
  const double a = d < -105.0 ? -105.0 : d;  // keeps the reduction finite; NaN stays
  constexpr double kLog2e = 1.4426950408889634, kShift = 0x1.8p52;
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double kd = a * kLog2e + kShift;  // kShift + rint(a log2 e), in its low bits
  const double n = kd - kShift;
  const double r = (a - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2 (n kLn2Hi is exact)
  double p = 1.0 / 3628800;
  p = p * r + 1.0 / 362880;
  p = p * r + 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n from n's bits: kd - kShift as integers is n, in [-152, 0]. Unsigned, so that a NaN's bits
  // (where p is NaN too, and so is e) wrap instead of overflowing.
  const unsigned long long nbits =
      __builtin_bit_cast(unsigned long long, kd) - __builtin_bit_cast(unsigned long long, kShift);
  const double e = p * __builtin_bit_cast(double, (nbits + 1023) << 52);
  return d < -105.0 ? 0.0f : float(e);
}

/// z[s] = the logit of entry s (Note [Vectorized masked softmax]); kind 0: no mask, 1: bool, 2: added;
/// unit: the mask's stride is 1.
template <int kind, bool unit>
FRUGAL_SOFTMAX_INLINE void logits(float* z, const float* x, int64_t S, float scale, int64_t keep_end,
                                  const bool* bool_mask, const float* add_mask, int64_t ms) {
#pragma omp simd
  for (int64_t s = 0; s < S; ++s) {
    float v = x[s] * scale;
    v = s >= keep_end ? kNegInf : v;
    if constexpr (kind == 1) v = bool_mask[unit ? s : s * ms] ? v : kNegInf;
    if constexpr (kind == 2) v = v + add_mask[unit ? s : s * ms];
    z[s] = v;
  }
}

}  // namespace

void masked_softmax_row_f32(float* y, const float* x, int64_t S, float scale, int64_t keep_end, const bool* bool_mask,
                            const float* add_mask, int64_t ms, float* z) {
  if (bool_mask) {
    if (ms == 1) logits<1, true>(z, x, S, scale, keep_end, bool_mask, add_mask, ms);
    else logits<1, false>(z, x, S, scale, keep_end, bool_mask, add_mask, ms);
  } else if (add_mask) {
    if (ms == 1) logits<2, true>(z, x, S, scale, keep_end, bool_mask, add_mask, ms);
    else logits<2, false>(z, x, S, scale, keep_end, bool_mask, add_mask, ms);
  } else {
    logits<0, true>(z, x, S, scale, keep_end, bool_mask, add_mask, ms);
  }
  float m = kNegInf;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t s = 0; s < S; ++s) {
    m = z[s] > m ? z[s] : m;
    nan |= z[s] != z[s];
  }
  if (nan || m == kNegInf) {  // NaN: every entry NaN, as the generic path's; no key left: zeros
    const float fill = nan ? __builtin_nanf("") : 0.0f;
    for (int64_t s = 0; s < S; ++s) y[s] = fill;
    return;
  }
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < S; ++s) {
    const float e = exp_nonpositive(z[s] - m);
    z[s] = z[s] == kNegInf ? 0.0f : e;
    sum += double(z[s]);
  }
  const float inv = float(1.0 / sum);
#pragma omp simd
  for (int64_t s = 0; s < S; ++s) y[s] = z[s] * inv;
}

void softmax_backward_rows_f32(float* gi, const float* g, const float* y, int64_t rows, int64_t S) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * S;
    const float* yr = y + r * S;
    float* out = gi + r * S;
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t s = 0; s < S; ++s) dot += double(gr[s]) * double(yr[s]);
    const float d = float(dot);
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) out[s] = yr[s] * (gr[s] - d);
  }
}

}  // namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA
