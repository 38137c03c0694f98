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

#include <type_traits>

#include "tensor/half.h"
#include "tensor/ops/unary.h"

namespace frugal::ops::math {

// float/double overloads that name the same libm function on the host and the
// CUDA math library on the device (where std:: overloads are not all available).
FRUGAL_HD float exp(float x) { return ::expf(x); }
FRUGAL_HD double exp(double x) { return ::exp(x); }
FRUGAL_HD float log(float x) { return ::logf(x); }
FRUGAL_HD double log(double x) { return ::log(x); }
FRUGAL_HD float sqrt(float x) { return ::sqrtf(x); }
FRUGAL_HD double sqrt(double x) { return ::sqrt(x); }
FRUGAL_HD float tanh(float x) { return ::tanhf(x); }
FRUGAL_HD double tanh(double x) { return ::tanh(x); }
FRUGAL_HD float erf(float x) { return ::erff(x); }
FRUGAL_HD double erf(double x) { return ::erf(x); }
FRUGAL_HD float sin(float x) { return ::sinf(x); }
FRUGAL_HD double sin(double x) { return ::sin(x); }
FRUGAL_HD float cos(float x) { return ::cosf(x); }
FRUGAL_HD double cos(double x) { return ::cos(x); }
FRUGAL_HD float fabs(float x) { return ::fabsf(x); }
FRUGAL_HD double fabs(double x) { return ::fabs(x); }
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

/// Two's-complement wrap-around for integer neg and square, as PyTorch (and the
/// hardware) do, without signed-overflow undefined behaviour.
template <typename T>
FRUGAL_HD T wrapping_neg(T x) {
  using U = std::make_unsigned_t<T>;
  return T(U(0) - U(x));
}
template <typename T>
FRUGAL_HD T wrapping_mul(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return T(U(x) * U(y));
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
  } else if constexpr (kOp == U::Sigmoid) {
    return M(1) / (M(1) + math::exp(-x));  // exp(-x) = inf for x << 0 gives exactly 0
  } else if constexpr (kOp == U::Gelu) {
    constexpr M kInvSqrt2 = M(0.70710678118654752440);
    return M(0.5) * x * (M(1) + math::erf(x * kInvSqrt2));
  } else if constexpr (kOp == U::GeluTanh) {
    constexpr M kSqrt2OverPi = M(0.79788456080286535588);
    constexpr M kCoeff = M(0.044715);
    return M(0.5) * x * (M(1) + math::tanh(kSqrt2OverPi * (x + kCoeff * x * x * x)));
  } else if constexpr (kOp == U::Silu) {
    return x / (M(1) + math::exp(-x));
  } else if constexpr (kOp == U::Reciprocal) {
    return M(1) / x;
  } else if constexpr (kOp == U::Sin) {
    return math::sin(x);
  } else if constexpr (kOp == U::Cos) {
    return math::cos(x);
  } else if constexpr (kOp == U::Pow) {
    return math::pow(x, a);
  } else if constexpr (kOp == U::Affine) {
    return x * a + b;  // one FMA on the GPU
  } else {
    static_assert(kOp == U::Clamp, "unary_apply: an op without a formula");
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

}  // namespace frugal::ops
