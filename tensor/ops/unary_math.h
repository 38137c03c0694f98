#pragma once
// Scalar formulas of the unary ops, compiled for the host (tensor/cpu/unary.cpp)
// and the device (tensor/cuda/unary.cu) from this one file, so the two backends
// cannot drift apart.
//
// Note [One formula, two backends]
// unary_apply<kOp>(x, a, b) is the whole definition of an op on one value of its
// compute type (float or double; integers for the few integer ops). UnaryFn adds
// the load/store conversion of Note [Half types compute in f32]. The backends
// only choose how to walk memory: cpu_map or cuda_map over an ElementwiseLayout.
#include <math.h>

#include <limits>
#include <type_traits>

#include "tensor/half.h"
#include "tensor/ops/unary.h"
#include "tensor/wrapping.h"  // integer neg and square wrap around

namespace frugal::ops::math {

// float/double overloads that name the same libm function on the host and the
// CUDA math library on the device (where std:: overloads are not all available).
FRUGAL_HD float exp(float x) { return ::expf(x); }
FRUGAL_HD double exp(double x) { return ::exp(x); }
FRUGAL_HD float log(float x) { return ::logf(x); }
FRUGAL_HD double log(double x) { return ::log(x); }
FRUGAL_HD float log1p(float x) { return ::log1pf(x); }
FRUGAL_HD double log1p(double x) { return ::log1p(x); }
FRUGAL_HD float expm1(float x) { return ::expm1f(x); }
FRUGAL_HD double expm1(double x) { return ::expm1(x); }
FRUGAL_HD float sqrt(float x) { return ::sqrtf(x); }
FRUGAL_HD double sqrt(double x) { return ::sqrt(x); }
FRUGAL_HD float tanh(float x) { return ::tanhf(x); }
FRUGAL_HD double tanh(double x) { return ::tanh(x); }
FRUGAL_HD float erf(float x) { return ::erff(x); }
FRUGAL_HD double erf(double x) { return ::erf(x); }
FRUGAL_HD float erfc(float x) { return ::erfcf(x); }
FRUGAL_HD double erfc(double x) { return ::erfc(x); }
FRUGAL_HD float sin(float x) { return ::sinf(x); }
FRUGAL_HD double sin(double x) { return ::sin(x); }
FRUGAL_HD float cos(float x) { return ::cosf(x); }
FRUGAL_HD double cos(double x) { return ::cos(x); }
FRUGAL_HD float fabs(float x) { return ::fabsf(x); }
FRUGAL_HD double fabs(double x) { return ::fabs(x); }
FRUGAL_HD float exp2(float x) { return ::exp2f(x); }
FRUGAL_HD double exp2(double x) { return ::exp2(x); }
FRUGAL_HD float log2(float x) { return ::log2f(x); }
FRUGAL_HD double log2(double x) { return ::log2(x); }
FRUGAL_HD float log10(float x) { return ::log10f(x); }
FRUGAL_HD double log10(double x) { return ::log10(x); }
FRUGAL_HD float tan(float x) { return ::tanf(x); }
FRUGAL_HD double tan(double x) { return ::tan(x); }
FRUGAL_HD float asin(float x) { return ::asinf(x); }
FRUGAL_HD double asin(double x) { return ::asin(x); }
FRUGAL_HD float acos(float x) { return ::acosf(x); }
FRUGAL_HD double acos(double x) { return ::acos(x); }
FRUGAL_HD float atan(float x) { return ::atanf(x); }
FRUGAL_HD double atan(double x) { return ::atan(x); }
FRUGAL_HD float sinh(float x) { return ::sinhf(x); }
FRUGAL_HD double sinh(double x) { return ::sinh(x); }
FRUGAL_HD float cosh(float x) { return ::coshf(x); }
FRUGAL_HD double cosh(double x) { return ::cosh(x); }
FRUGAL_HD float asinh(float x) { return ::asinhf(x); }
FRUGAL_HD double asinh(double x) { return ::asinh(x); }
FRUGAL_HD float acosh(float x) { return ::acoshf(x); }
FRUGAL_HD double acosh(double x) { return ::acosh(x); }
FRUGAL_HD float atanh(float x) { return ::atanhf(x); }
FRUGAL_HD double atanh(double x) { return ::atanh(x); }
FRUGAL_HD float floor(float x) { return ::floorf(x); }
FRUGAL_HD double floor(double x) { return ::floor(x); }
FRUGAL_HD float ceil(float x) { return ::ceilf(x); }
FRUGAL_HD double ceil(double x) { return ::ceil(x); }
FRUGAL_HD float trunc(float x) { return ::truncf(x); }
FRUGAL_HD double trunc(double x) { return ::trunc(x); }
// rint rounds in the current rounding mode, to nearest with ties to even unless a program
// changed it (torch.round uses nearbyint, the same).
FRUGAL_HD float rint(float x) { return ::rintf(x); }
FRUGAL_HD double rint(double x) { return ::rint(x); }
FRUGAL_HD float pow(float x, float y) { return ::powf(x, y); }
FRUGAL_HD double pow(double x, double y) { return ::pow(x, y); }
FRUGAL_HD float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}
FRUGAL_HD double rsqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrt(x);
#else
  return 1.0 / ::sqrt(x);
#endif
}

// Note [Activation tails]
// The textbook forms 0.5 x (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(u)) cancel for
// x < -3: 1 + erf is then below erf's own rounding (erf(-3.5) = -0.99999926 in float32), so
// gelu(-5) = -1.4e-6 came out 30% off, and 0 from x = -5.9 although the true value is a
// normal float down to x = -13 (float16/bfloat16 results were off by many ulps there too).
// 1 / (1 + exp(-x)) overflows exp(-x) for x < -88.7 and gave 0 for sigmoid and silu where
// the results are still normal floats (silu(-89) = -1.9e-37). PyTorch's CPU kernels use
// the textbook forms. Here every one is written without cancellation: Phi(x) =
// 0.5 erfc(-x / sqrt 2); 0.5 (1 + tanh(u)) = sigmoid(2u); and the logistic takes exp of
// -|z| only, so it never overflows: sigmoid(z) = 1 / (1 + e) for z >= 0, e / (1 + e) below,
// with e = exp(-|z|), and its complement 1 - sigmoid(z) comes from the same e instead of a
// subtraction; tanh's sech^2 = 1 - tanh^2 the same way, as 4 e / (1 + e)^2. The results are
// within a few ulps (times the condition number of the exp's argument) over the whole
// float32 range, and within one ulp in float16/bfloat16 (tests/cpu/test_probe_numerics.cpp).

/// sigmoid(z) and 1 - sigmoid(z), both to full relative precision, with e = exp(-|z|) <= 1
/// (Note [Activation tails]). A NaN z gives NaN for both.
template <typename M>
struct Logistic {
  M s, sc, e;  // sigmoid(z), 1 - sigmoid(z), exp(-|z|)
};
template <typename M>
FRUGAL_HD Logistic<M> logistic(M z) {
  const M e = exp(-fabs(z)), big = M(1) / (M(1) + e), small = e * big;
  return z >= M(0) ? Logistic<M>{big, small, e} : z < M(0) ? Logistic<M>{small, big, e} : Logistic<M>{z, z, z};
}

/// log(1 + e^z) = max(z, 0) + log1p(e^-|z|): no overflow for large z, no cancellation.
template <typename M>
FRUGAL_HD M softplus_stable(M z) {
  return (z > M(0) ? z : M(0)) + log1p(exp(-fabs(z)));
}

/// relu6(x + 3), hardsigmoid's and hardswish's numerator; NaN stays NaN (comparisons with
/// NaN are false). Both ops divide by 6 last, as PyTorch's kernels, for the same roundings.
template <typename M>
FRUGAL_HD M relu6_shifted(M x) {
  const M shifted = x + M(3);
  const M low = shifted < M(0) ? M(0) : shifted;
  return low > M(6) ? M(6) : low;
}

// Note [pow of 0.5 and -0.5]
// PyTorch computes x^0.5 as sqrt(x) and x^-0.5 as rsqrt(x) on both of its backends, and
// those differ from IEEE pow at two points: sqrt(-0) = -0 where pow(-0, 0.5) = +0, and
// sqrt(-inf) = NaN where pow(-inf, 0.5) = +inf. pow_scalar does the same, for the forward
// (exponent a) and the derivative (a x^(a-1) with a - 1 = +-0.5), so the values match
// PyTorch's everywhere; any other exponent is powf/pow.
template <typename M>
FRUGAL_HD M pow_scalar(M x, M e) {
  if (e == M(0.5)) return sqrt(x);
  if (e == M(-0.5)) return rsqrt(x);
  return pow(x, e);
}

// Note [NaN stays NaN]
// Every op here gives NaN for a NaN input, also where PyTorch does not: its sign(NaN) is 0 and
// its abs' at NaN is sign(NaN) = 0 (pytorch/pytorch#41245), which turn a NaN that reached them
// into a plausible number, so a diverged run goes on with finite losses. frugal's sign(NaN) is
// NaN, and abs' at NaN is NaN wherever the incoming gradient is nonzero.

/// -1, 0 or 1; NaN for NaN (Note [NaN stays NaN]); 0 (not -0) for -0, as PyTorch.
template <typename M>
FRUGAL_HD M sign(M x) {
  if constexpr (std::is_integral_v<M>) {
    return M(x > 0) - M(x < 0);
  } else {
    return x > M(0) ? M(1) : x < M(0) ? M(-1) : x == M(0) ? M(0) : x;
  }
}

}  // namespace frugal::ops::math

namespace frugal::ops {

/// The op on one value of compute type M (float, double, int32_t or int64_t).
/// a, b are the op's parameters (see UnaryOp).
template <UnaryOp kOp, typename M>
FRUGAL_HD M unary_apply(M x, M a, M b) {
  constexpr bool kInt = std::is_integral_v<M>;
  using U = UnaryOp;
  static_assert(!kInt || unary_op_allows_integers(kOp), "this unary op is defined for floating types only");
  // The four ops that also take integers.
  if constexpr (kOp == U::Neg) {
    if constexpr (kInt) {
      return math::wrapping_neg(x);
    } else {
      return -x;
    }
  } else if constexpr (kOp == U::Abs) {
    if constexpr (kInt) {
      return x < 0 ? math::wrapping_neg(x) : x;
    } else {
      return math::fabs(x);
    }
  } else if constexpr (kOp == U::Relu) {
    return x < M(0) ? M(0) : x;  // NaN < 0 is false: NaN passes through
  } else if constexpr (kOp == U::Square) {
    if constexpr (kInt) {
      return math::wrapping_mul(x, x);
    } else {
      return x * x;
    }
  } else if constexpr (kOp == U::Sign) {
    return math::sign(x);
  } else if constexpr (kInt) {  // floor, ceil, trunc, round: an integer is already integral
    static_assert(kOp == U::Floor || kOp == U::Ceil || kOp == U::Trunc || kOp == U::Round);
    return x;
  } else if constexpr (kOp == U::Floor) {
    return math::floor(x);
  } else if constexpr (kOp == U::Ceil) {
    return math::ceil(x);
  } else if constexpr (kOp == U::Trunc) {
    return math::trunc(x);
  } else if constexpr (kOp == U::Round) {
    return math::rint(x);
  }
  // Floating only.
  else if constexpr (kOp == U::Exp) {
    return math::exp(x);
  } else if constexpr (kOp == U::Log) {
    return math::log(x);
  } else if constexpr (kOp == U::Sqrt) {
    return math::sqrt(x);
  } else if constexpr (kOp == U::Rsqrt) {
    return math::rsqrt(x);
  } else if constexpr (kOp == U::Tanh) {
    return math::tanh(x);
  } else if constexpr (kOp == U::Sigmoid) {  // Note [Activation tails]
    return math::logistic(x).s;
  } else if constexpr (kOp == U::Gelu) {  // x Phi(x), Phi = 0.5 erfc(-x / sqrt 2): Note [Activation tails]
    constexpr M kInvSqrt2 = M(0.70710678118654752440);
    return M(0.5) * x * math::erfc(-x * kInvSqrt2);
  } else if constexpr (kOp == U::GeluTanh) {  // 0.5 x (1 + tanh(u)) = x sigmoid(2u)
    constexpr M kSqrt2OverPi = M(0.79788456080286535588);
    constexpr M kCoeff = M(0.044715);
    return x * math::logistic(M(2) * kSqrt2OverPi * (x + kCoeff * x * x * x)).s;
  } else if constexpr (kOp == U::Silu) {
    return x * math::logistic(x).s;
  } else if constexpr (kOp == U::Reciprocal) {
    return M(1) / x;
  } else if constexpr (kOp == U::Sin) {
    return math::sin(x);
  } else if constexpr (kOp == U::Cos) {
    return math::cos(x);
  } else if constexpr (kOp == U::Pow) {
    return math::pow_scalar(x, a);  // Note [pow of 0.5 and -0.5]
  } else if constexpr (kOp == U::Affine) {
    return x * a + b;  // one FMA on the GPU
  } else if constexpr (kOp == U::Log1p) {
    return math::log1p(x);
  } else if constexpr (kOp == U::Softplus) {  // torch: x where beta x > threshold; NaN stays NaN
    // log(1 + e^z) = max(z, 0) + log1p(e^-|z|): no overflow for large z, so threshold = inf
    // is exact everywhere (binary_cross_entropy_with_logits relies on it).
    const M bx = x * a;
    return bx > b ? x : math::softplus_stable(bx) / a;
  } else if constexpr (kOp == U::LeakyRelu) {  // NaN > 0 is false: NaN * slope stays NaN
    return x > M(0) ? x : x * a;
  } else if constexpr (kOp == U::Elu) {
    return x > M(0) ? x : a * math::expm1(x);
  } else if constexpr (kOp == U::Hardtanh) {  // clamp's forward (a <= b checked by the op)
    const M lo_clamped = x < a ? a : x;
    return lo_clamped > b ? b : lo_clamped;
  } else if constexpr (kOp == U::Hardsigmoid) {
    return math::relu6_shifted(x) / M(6);
  } else if constexpr (kOp == U::Hardswish) {
    return x * math::relu6_shifted(x) / M(6);
  } else if constexpr (kOp == U::Mish) {
    return x * math::tanh(math::softplus_stable(x));
  } else if constexpr (kOp == U::Selu) {
    return x > M(0) ? M(kSeluScale) * x : M(kSeluScale * kSeluAlpha) * math::expm1(x);
  } else if constexpr (kOp == U::Celu) {
    return x > M(0) ? x : a * math::expm1(x / a);
  } else if constexpr (kOp == U::Softsign) {  // +-1 at +-inf, where x / (1 + |x|) is inf / inf
    const M ax = math::fabs(x);
    return ax == std::numeric_limits<M>::infinity() ? (x > M(0) ? M(1) : M(-1)) : x / (M(1) + ax);
  } else if constexpr (kOp == U::Tanhshrink) {
    return x - math::tanh(x);
  } else if constexpr (kOp == U::Hardshrink) {  // NaN fails both tests and stays
    return (x >= -a && x <= a) ? M(0) : x;
  } else if constexpr (kOp == U::Softshrink) {
    return x > a ? x - a : x < -a ? x + a : x == x ? M(0) : x;  // NaN stays NaN
  } else if constexpr (kOp == U::Threshold) {
    return x <= a ? b : x;
  } else if constexpr (kOp == U::Tan) {
    return math::tan(x);
  } else if constexpr (kOp == U::Asin) {
    return math::asin(x);
  } else if constexpr (kOp == U::Acos) {
    return math::acos(x);
  } else if constexpr (kOp == U::Atan) {
    return math::atan(x);
  } else if constexpr (kOp == U::Sinh) {
    return math::sinh(x);
  } else if constexpr (kOp == U::Cosh) {
    return math::cosh(x);
  } else if constexpr (kOp == U::Asinh) {
    return math::asinh(x);
  } else if constexpr (kOp == U::Acosh) {
    return math::acosh(x);
  } else if constexpr (kOp == U::Atanh) {
    return math::atanh(x);
  } else if constexpr (kOp == U::Erf) {
    return math::erf(x);
  } else if constexpr (kOp == U::Erfc) {
    return math::erfc(x);
  } else if constexpr (kOp == U::Expm1) {
    return math::expm1(x);
  } else if constexpr (kOp == U::Exp2) {
    return math::exp2(x);
  } else if constexpr (kOp == U::Log2) {
    return math::log2(x);
  } else if constexpr (kOp == U::Log10) {
    return math::log10(x);
  } else if constexpr (kOp == U::LogSigmoid) {  // -softplus(-x) = min(x, 0) - log1p(e^-|x|), +0 far right
    return (x < M(0) ? x : M(0)) - math::log1p(math::exp(-math::fabs(x)));
  } else {
    static_assert(kOp == U::Clamp, "unary_apply: an op without a formula");
    if (a != a || b != b) return a + b;      // a NaN bound gives NaN everywhere, as PyTorch
    const M lo_clamped = x < a ? a : x;      // comparisons with NaN are false:
    return lo_clamped > b ? b : lo_clamped;  // NaN passes; lo > hi gives hi
  }
}

/// out = op(x) for storage type T: load, compute in opmath_t<T>, round once on store.
template <typename T, UnaryOp kOp>
struct UnaryFn {
  using M = opmath_t<T>;
  M a, b;
  FRUGAL_HD T operator()(T x) const { return T(unary_apply<kOp, M>(M(x), a, b)); }
};

/// The gradient of the op with respect to its input, g * f'(x), on one value of compute
/// type M (float or double). v is x or y = f(x) as unary_grad_from(kOp) says (see
/// unary.h); a, b are the op's parameters. Each formula is derivatives.yaml's, written
/// so one pass computes it (llm.c's gelu_backward).
template <UnaryOp kOp, typename M>
FRUGAL_HD M unary_grad(M g, M v, M a, M b) {
  using U = UnaryOp;
  static_assert(!std::is_integral_v<M>, "unary_grad: floating types only");
  static_assert(unary_grad_from(kOp) != UnaryGradFrom::Nothing, "neg and affine scale the gradient: use affine");
  static_assert(unary_grad_from(kOp) != UnaryGradFrom::Zero, "the rounding ops' gradient is zeros: no kernel");
  (void)b;
  if constexpr (kOp == U::Exp) {  // v = y: dy/dx = y
    return g * v;
  } else if constexpr (kOp == U::Log) {  // 1 / x
    return g / v;
  } else if constexpr (kOp == U::Sqrt) {  // v = y: 1 / (2 sqrt x) = 1 / 2y
    return g / (M(2) * v);
  } else if constexpr (kOp == U::Rsqrt) {  // v = y: -x^(-3/2) / 2 = -y^3 / 2
    return M(-0.5) * g * v * v * v;
  } else if constexpr (kOp == U::Tanh) {  // v = y: 1 - y^2
    return g * (M(1) - v * v);
  } else if constexpr (kOp == U::Sigmoid) {  // v = y: y (1 - y)
    return g * v * (M(1) - v);
  } else if constexpr (kOp == U::Relu) {  // v = y; 0 at 0 and where y <= 0; NaN y passes g
    return v <= M(0) ? M(0) : g;
  } else if constexpr (kOp == U::Gelu) {  // Phi(x) + x phi(x), Phi from erfc (Note [Activation tails])
    constexpr M kInvSqrt2 = M(0.70710678118654752440);
    constexpr M kInvSqrt2Pi = M(0.39894228040143267794);
    const M cdf = M(0.5) * math::erfc(-v * kInvSqrt2);
    const M pdf = kInvSqrt2Pi * math::exp(M(-0.5) * v * v);
    return g * (cdf + v * pdf);
  } else if constexpr (kOp == U::GeluTanh) {
    // llm.c gelu_backward: 0.5 (1 + t) + 0.5 x sech^2(u) u', t = tanh(u), written with
    // 0.5 (1 + t) = sigmoid(2u) and 0.5 sech^2(u) = 2 e / (1 + e)^2, e = exp(-2|u|)
    // (Note [Activation tails]).
    constexpr M kSqrt2OverPi = M(0.79788456080286535588);
    constexpr M kCoeff = M(0.044715);
    const M x2 = v * v;
    const math::Logistic<M> l = math::logistic(M(2) * kSqrt2OverPi * (v + kCoeff * x2 * v));
    const M dt = kSqrt2OverPi * (M(1) + M(3) * kCoeff * x2);  // du/dx
    return g * (l.s + M(2) * v * (l.s * l.sc) * dt);
  } else if constexpr (kOp == U::Silu) {  // s (1 + x (1 - s)), s = sigmoid(x)
    const math::Logistic<M> l = math::logistic(v);
    return g * l.s * (M(1) + v * l.sc);
  } else if constexpr (kOp == U::Abs) {  // sign(x), 0 at 0; at NaN x: NaN, but 0 where g is 0
    // (a NaN that a `where` or a mask kept out of the loss must not poison the gradient, as
    // PyTorch's g * sgn(x); one that reached the loss, g != 0, shows)
    return v > M(0) ? g : v < M(0) ? -g : v == M(0) || g == M(0) ? M(0) : v;
  } else if constexpr (kOp == U::Square) {  // 2x
    return M(2) * v * g;
  } else if constexpr (kOp == U::Reciprocal) {  // v = y: -1 / x^2 = -y^2
    return -g * v * v;
  } else if constexpr (kOp == U::Sin) {
    return g * math::cos(v);
  } else if constexpr (kOp == U::Cos) {
    return -g * math::sin(v);
  } else if constexpr (kOp == U::Pow) {  // a x^(a-1); exactly 0 for a = 0 (no 0 * inf at x = 0)
    return a == M(0) ? M(0) : g * a * math::pow_scalar(v, a - M(1));
  } else if constexpr (kOp == U::Log1p) {  // 1 / (1 + x)
    return g / (M(1) + v);
  } else if constexpr (kOp == U::Softplus) {  // sigmoid(beta x), 1 past the threshold (torch)
    const M bx = v * a;
    return bx > b ? g : g * math::logistic(bx).s;
  } else if constexpr (kOp == U::LeakyRelu) {  // the slope at 0, as PyTorch (x > 0 ? g : g slope)
    return v > M(0) ? g : g * a;
  } else if constexpr (kOp == U::Elu) {  // alpha e^x where x <= 0; NaN passes g (PyTorch's x <= 0 test)
    return v <= M(0) ? g * a * math::exp(v) : g;
  } else if constexpr (kOp == U::Hardtanh) {  // 0 at and past both bounds; NaN passes g (PyTorch)
    return (v <= a || v >= b) ? M(0) : g;
  } else if constexpr (kOp == U::Hardsigmoid) {                 // 1/6 strictly inside (-3, 3)
    return (v > M(-3) && v < M(3)) ? g * (M(1) / M(6)) : M(0);  // PyTorch multiplies by 1/6
  } else if constexpr (kOp == U::Hardswish) {                   // PyTorch's branches: 0 below -3, x/3 + 1/2 up to 3
    return v < M(-3) ? M(0) : v <= M(3) ? g * (v / M(3) + M(0.5)) : g;
  } else if constexpr (kOp == U::Mish) {  // t + x sigmoid(x) (1 - t^2), t = tanh(softplus(x))
    const M t = math::tanh(math::softplus_stable(v));
    return g * (t + v * math::logistic(v).s * (M(1) - t * t));
  } else if constexpr (kOp == U::Selu) {  // scale alpha e^x where x <= 0 (PyTorch's branch), else scale
    return v <= M(0) ? g * M(kSeluScale * kSeluAlpha) * math::exp(v) : g * M(kSeluScale);
  } else if constexpr (kOp == U::Celu) {  // e^(x / alpha) where x <= 0, else 1
    return v <= M(0) ? g * math::exp(v / a) : g;
  } else if constexpr (kOp == U::Softsign) {  // 1 / (1 + |x|)^2
    const M d = M(1) + math::fabs(v);
    return g / (d * d);
  } else if constexpr (kOp == U::Tanhshrink) {  // 1 - (1 - tanh^2) = tanh^2
    const M t = math::tanh(v);
    return g * t * t;
  } else if constexpr (kOp == U::Hardshrink || kOp == U::Softshrink) {  // 0 on [-lambd, lambd]; NaN passes g
    return (v >= -a && v <= a) ? M(0) : g;
  } else if constexpr (kOp == U::Threshold) {  // 0 at and below the threshold; NaN passes g
    return v <= a ? M(0) : g;
  } else if constexpr (kOp == U::Tan) {  // v = y: 1 + y^2
    return g * (M(1) + v * v);
  } else if constexpr (kOp == U::Asin) {  // 1 / sqrt(1 - x^2)
    return g * math::rsqrt(M(1) - v * v);
  } else if constexpr (kOp == U::Acos) {  // -1 / sqrt(1 - x^2)
    return -g * math::rsqrt(M(1) - v * v);
  } else if constexpr (kOp == U::Atan) {  // 1 / (1 + x^2)
    return g / (v * v + M(1));
  } else if constexpr (kOp == U::Sinh) {
    return g * math::cosh(v);
  } else if constexpr (kOp == U::Cosh) {
    return g * math::sinh(v);
  } else if constexpr (kOp == U::Asinh) {  // 1 / sqrt(x^2 + 1)
    return g * math::rsqrt(v * v + M(1));
  } else if constexpr (kOp == U::Acosh) {  // 1 / sqrt(x^2 - 1)
    return g * math::rsqrt(v * v - M(1));
  } else if constexpr (kOp == U::Atanh) {  // 1 / (1 - x^2)
    return g / (M(1) - v * v);
  } else if constexpr (kOp == U::Erf) {  // 2 / sqrt(pi) e^(-x^2)
    constexpr M k2OverSqrtPi = M(1.12837916709551257390);
    return g * k2OverSqrtPi * math::exp(-v * v);
  } else if constexpr (kOp == U::Erfc) {
    constexpr M k2OverSqrtPi = M(1.12837916709551257390);
    return -g * k2OverSqrtPi * math::exp(-v * v);
  } else if constexpr (kOp == U::Expm1) {  // v = y: e^x = y + 1
    return g * (v + M(1));
  } else if constexpr (kOp == U::Exp2) {  // v = y: 2^x ln 2
    constexpr M kLn2 = M(0.69314718055994530942);
    return g * v * kLn2;
  } else if constexpr (kOp == U::Log2) {  // 1 / (x ln 2), as PyTorch
    constexpr M kLn2 = M(0.69314718055994530942);
    return g / (v * kLn2);
  } else if constexpr (kOp == U::Log10) {
    constexpr M kLn10 = M(2.30258509299404568402);
    return g / (v * kLn10);
  } else if constexpr (kOp == U::LogSigmoid) {  // 1 - sigmoid(x), from exp(-|x|) (Note [Activation tails])
    return g * math::logistic(v).sc;
  } else {
    static_assert(kOp == U::Clamp, "unary_grad: an op without a derivative");
    return (v >= a && v <= b) ? g : M(0);  // lo <= x <= hi; NaN or lo > hi: 0
  }
}

/// grad_in = unary_grad(grad, v) for storage type T, computed in opmath_t<T>.
template <typename T, UnaryOp kOp>
struct UnaryBackwardFn {
  using M = opmath_t<T>;
  M a, b;
  FRUGAL_HD T operator()(T g, T v) const { return T(unary_grad<kOp, M>(M(g), M(v), a, b)); }
};

/// isnan / isinf / isfinite of one floating value, tested in its compute type (a Half or
/// BFloat16 converts to float exactly, NaN and infinities included). No libm call: NaN is
/// the one value unequal to itself, and the infinities compare equal to themselves.
template <typename T, FloatClass kClass>
struct FloatClassFn {
  using M = opmath_t<T>;
  FRUGAL_HD bool operator()(T x) const {
    const M v = M(x);
    const M inf = std::numeric_limits<M>::infinity();
    if constexpr (kClass == FloatClass::Nan) return v != v;
    else if constexpr (kClass == FloatClass::Inf) return v == inf || v == -inf;
    else return v == v && v != inf && v != -inf;
  }
};

}  // namespace frugal::ops
