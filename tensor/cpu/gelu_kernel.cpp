// One instruction-set level's exact-GELU kernels for float32: built once per level, each time
// with that level's -march, FRUGAL_GELU_ISA naming it (v2, v3, v4), -fopenmp-simd,
// -ffp-contract=fast and -fno-trapping-math (without it GCC keeps the selects below as branches
// below AVX-512, and the loops do not vectorize; tensor/meson.build), and nothing but its own header in the translation
// unit, so no inline function of another header can be merged across levels (Note [GEMM kernels
// per instruction set] in tensor/cpu/gemm.cpp; tools/check_gemm_objects.py checks it).
//
// Note [Vectorized GELU]
// unary_apply's Gelu, 0.5 x erfc(-x / sqrt 2) (Note [Activation tails]), calls glibc's scalar
// erfcf per element: 6 ms for a (512, 3072) tensor on two cores, and 10 ms for the backward,
// which calls erfcf and expf. Here both are branch-free code that the compiler vectorizes
// (8 doubles per AVX-512 register), computed in double and rounded once to float:
//   Phi(-t) = e(t) m(t),  e(t) = exp(-t^2 / 2),  t = |x|,
// where m(t) = Phi(-t) / e(t) (Mills' ratio over sqrt(2 pi)) is smooth, 0.5 at 0 and
// ~ 1 / (t sqrt(2 pi)) for large t. In w = 1 / (1 + t / 4) it is w P(w), P a polynomial of
// degree 12 fitted for relative error (6e-11 on t in [0, 20]). Then Phi(x) = e m for x < 0, to
// full relative precision however small (the tails of Note [Activation tails]), and 1 - e m for
// x >= 0 (at least 0.5, so no cancellation). t^2 is exact in double, so e has none of the error
// a float exp(-t^2/2) has from rounding t^2 (its condition number is t^2, 100 at x = -10); exp
// is reduced by Cody-Waite to [-ln2/2, ln2/2], with a degree-11 Taylor polynomial there.
// The gradient Phi(x) + x phi(x) = e (m(t) - t / sqrt(2 pi)) for x < 0 and 1 - e (m(t) -
// t / sqrt(2 pi)) for x >= 0 vanishes at x = -t0, t0 = 0.75179...; written as m(t) - t /
// sqrt(2 pi) = (t0 - t) h(t), with h (degree 11 in w, 2e-11) fitted the same way and t0 as a
// sum of two doubles, the gradient keeps its relative precision at that root too, where
// 0.5 erfc(-x / sqrt 2) + x phi(x) cancels. Every result is within 1 ulp of float32
// (tests/cpu/test_gelu_simd.cpp measures each level against long double), and the special values
// are unary_apply's: gelu(NaN) = NaN, gelu(+inf) = +inf, gelu(-inf) = NaN (-inf * 0), gelu(-0) =
// -0; the gradient is NaN at +-inf and NaN, 1 for large x, +0 for large -x.
#include "tensor/cpu/gelu_kernel.h"

#ifndef FRUGAL_GELU_ISA
#error "gelu_kernel.cpp is built with -DFRUGAL_GELU_ISA=v2|v3|v4 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::FRUGAL_GELU_ISA {

namespace {

#define FRUGAL_GELU_INLINE inline __attribute__((always_inline))

/// exp(-a) for a >= 0; 0 for a >= 200 (below every float result's reach) and for NaN.
FRUGAL_GELU_INLINE double exp_neg(double a) {
  const double ac = a < 200.0 ? a : 200.0;  // keeps the reduction finite; NaN -> 200
  constexpr double kLog2e = 1.4426950408889634, kShift = 0x1.8p52;
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double kd = -ac * kLog2e + kShift;  // kShift + rint(-ac log2 e), in its low bits
  const double n = kd - kShift;
  const double r = (-ac - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2 (n kLn2Hi is exact)
  // e^r, Taylor to degree 11: truncation below 1e-14 relative on |r| <= 0.35.
  double p = 1.0 / 39916800;
  p = p * r + 1.0 / 3628800;
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
  // 2^n from n's bits: kd - kShift as integers is n, in [-289, 0].
  const long long nbits = __builtin_bit_cast(long long, kd) - __builtin_bit_cast(long long, kShift);
  const double scale = __builtin_bit_cast(double, (nbits + 1023) << 52);
  const double e = p * scale;  // computed on both sides of the select: no branch
  return a < 200.0 ? e : 0.0;
}

/// Phi(-t) / exp(-t^2 / 2) for t >= 0 (Note [Vectorized GELU]); 0 at +inf.
FRUGAL_GELU_INLINE double mills(double w) {  // w = 1 / (1 + t / 4)
  double p = 0.0057983406577231762;
  p = p * w - 0.049813576010640966;
  p = p * w + 0.17584492832682699;
  p = p * w - 0.32441083410107657;
  p = p * w + 0.33842318516752762;
  p = p * w - 0.23995441383725824;
  p = p * w + 0.14900385102709471;
  p = p * w - 0.0022204038827937748;
  p = p * w + 0.075163029426649514;
  p = p * w + 0.078968269336868457;
  p = p * w + 0.09374243367676624;
  p = p * w + 0.099719118957553504;
  p = p * w + 0.099736071223692269;
  return p * w;
}

/// (m(t) - t / sqrt(2 pi)) / (t0 - t) for t >= 0, t0 its root (Note [Vectorized GELU]).
FRUGAL_GELU_INLINE double grad_ratio(double w) {  // w = 1 / (1 + t / 4)
  double p = -0.0037325655654712499;
  p = p * w + 0.023377790667408638;
  p = p * w - 0.056405860411706282;
  p = p * w + 0.063457303819504596;
  p = p * w - 0.043637940980700785;
  p = p * w + 0.037944378440769901;
  p = p * w + 0.015329980539641914;
  p = p * w + 0.039766151430867674;
  p = p * w + 0.050878154429553242;
  p = p * w + 0.064180512399037881;
  p = p * w + 0.074977738561049265;
  return p * w + 0.39894235178945842;
}

constexpr double kT0Hi = 0.7517915246935645, kT0Lo = -1.4956759177009883e-17;  // t0 = hi + lo

FRUGAL_GELU_INLINE float gelu_one(float xf) {
  const double x = xf, t = __builtin_fabs(x);
  const double em = exp_neg(0.5 * (t * t)) * mills(1.0 / (1.0 + 0.25 * t));  // Phi(-t)
  const double upper = 1.0 - em;
  const double cdf = x < 0.0 ? em : upper;  // Phi(x); NaN stays
  return float(x * cdf);                    // -inf * 0 = NaN, as unary_apply
}

FRUGAL_GELU_INLINE float gelu_backward_one(float gf, float xf) {
  const double x = xf, t = __builtin_fabs(x);
  const double d = (kT0Hi - t) + kT0Lo;  // t0 - t, exact near t0
  const double q = exp_neg(0.5 * (t * t)) * (d * grad_ratio(1.0 / (1.0 + 0.25 * t)));
  // x < 0: Phi + x phi = q, + 0 so that an x past -20 gives +0 as unary_grad does; x = +-inf
  // gives 0 * inf = NaN, as there.
  const double lower = q + 0.0, upper = 1.0 - q;
  const double grad = x < 0.0 ? lower : upper;
  return float(double(gf) * grad);
}

}  // namespace

void gelu_f32(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_one(x[i]);
}

void gelu_backward_f32(float* grad_in, const float* g, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) grad_in[i] = gelu_backward_one(g[i], x[i]);
}

}  // namespace frugal::ops::cpu::FRUGAL_GELU_ISA
