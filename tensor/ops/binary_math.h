#pragma once
// Scalar formulas of the binary ops and the dynamic-cast loads and stores, for the
// host (tensor/cpu/binary.cpp) and the device (tensor/cuda/binary.cu) alike; see
// Note [One formula, two backends] in unary_math.h.
#include <limits>
#include <type_traits>

#include "tensor/dispatch.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/unary_math.h"

namespace frugal::ops {

namespace math {
/// Integer power as PyTorch defines it: repeated squaring, wrapping on overflow; a
/// negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise.
template <typename T>
FRUGAL_HD T int_pow(T base, T exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent & 1) ? T(-1) : T(1);
    return 0;
  }
  T result = 1;
  while (exponent) {
    if (exponent & 1) result = wrapping_mul(result, base);
    exponent >>= 1;
    base = wrapping_mul(base, base);
  }
  return result;
}

FRUGAL_HD float atan2(float y, float x) { return ::atan2f(y, x); }
FRUGAL_HD double atan2(double y, double x) { return ::atan2(y, x); }
FRUGAL_HD float hypot(float x, float y) { return ::hypotf(x, y); }
FRUGAL_HD double hypot(double x, double y) { return ::hypot(x, y); }
FRUGAL_HD float fmod(float x, float y) { return ::fmodf(x, y); }
FRUGAL_HD double fmod(double x, double y) { return ::fmod(x, y); }
FRUGAL_HD float copysign(float x, float y) { return ::copysignf(x, y); }
FRUGAL_HD double copysign(double x, double y) { return ::copysign(x, y); }

/// log(e^a + e^b) as aten's: the larger plus log1p(e^-|a - b|), so nothing overflows; two
/// equal infinities give themselves (inf - inf would be NaN).
template <typename M>
FRUGAL_HD M logaddexp(M a, M b) {
  if (a == b && fabs(a) == std::numeric_limits<M>::infinity()) return a;
  const M larger = a < b ? b : a;
  return larger + log1p(exp(-fabs(a - b)));
}

/// The remainder with the divisor's sign, from fmod as aten's (Note [Division-like ops]).
template <typename M>
FRUGAL_HD M float_remainder(M a, M b) {
  const M r = fmod(a, b);
  return (r != M(0) && (b < M(0)) != (r < M(0))) ? r + b : r;
}

/// floor(a / b) as aten's div_floor_floating: the exact quotient (a - fmod(a, b)) / b, one
/// less when the signs of the remainder and the divisor differ, then rounded to the nearest
/// integer (the quotient is within an ulp of one); a zero quotient keeps the sign of a / b.
template <typename M>
FRUGAL_HD M float_floor_divide(M a, M b) {
  if (b == M(0)) return a / b;
  const M r = fmod(a, b);
  M q = (a - r) / b;
  if (r != M(0) && (b < M(0)) != (r < M(0))) q -= M(1);
  if (q == M(0)) return copysign(M(0), a / b);
  M f = floor(q);
  if (q - f > M(0.5)) f += M(1);
  return f;
}

// Integer division (Note [Division-like ops]). The front end refuses a zero divisor; the
// kernels still give 0 for one rather than trap. b == -1 is taken apart: the minimum
// integer divided by -1 overflows, which C++ leaves undefined and x86 traps on.
template <typename T>
FRUGAL_HD T int_trunc_divide(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if (b == T(-1)) return T(U(0) - U(a));
  return b == T(0) ? T(0) : T(a / b);
}
template <typename T>
FRUGAL_HD T int_fmod(T a, T b) {
  return (b == T(0) || b == T(-1)) ? T(0) : T(a % b);
}
template <typename T>
FRUGAL_HD T int_remainder(T a, T b) {
  const T r = int_fmod(a, b);
  return (r != T(0) && (r < T(0)) != (b < T(0))) ? T(r + b) : r;
}
template <typename T>
FRUGAL_HD T int_floor_divide(T a, T b) {
  const T q = int_trunc_divide(a, b);
  return (int_fmod(a, b) != T(0) && (a < T(0)) != (b < T(0))) ? T(q - 1) : q;
}
}  // namespace math

/// Which compute types each kernel-level op is instantiated for: arithmetic on
/// numbers (true division, atan2, hypot and logaddexp on floats only), comparisons on
/// everything, logical and/or on bool (the front end maps other dtypes to x != 0 first).
template <BinaryOp kOp, typename T>
constexpr bool binary_op_supports() {
  if (kOp == BinaryOp::LogicalAnd || kOp == BinaryOp::LogicalOr) return std::is_same_v<T, bool>;
  if (binary_op_is_predicate(kOp)) return true;
  if (binary_op_is_floating(kOp)) return !std::is_integral_v<T>;  // bool is integral too
  return !std::is_same_v<T, bool>;
}

/// The op on two values of compute type M (float, double, an integer or bool);
/// alpha scales b for Add only. Predicates return bool.
template <BinaryOp kOp, typename M>
FRUGAL_HD auto binary_apply(M a, M b, M alpha) {
  constexpr bool kInt = std::is_integral_v<M> && !std::is_same_v<M, bool>;
  if constexpr (kOp == BinaryOp::Add) {
    if constexpr (kInt) {
      return math::wrapping_add(a, math::wrapping_mul(alpha, b));
    } else {
      return a + alpha * b;
    }
  } else if constexpr (kOp == BinaryOp::Mul) {
    if constexpr (kInt) {
      return math::wrapping_mul(a, b);
    } else {
      return a * b;
    }
  } else if constexpr (kOp == BinaryOp::Div) {
    return a / b;
  } else if constexpr (kOp == BinaryOp::Maximum) {
    return (a > b || a != a) ? a : b;  // a != a: a is NaN; b NaN fails a > b and is chosen
  } else if constexpr (kOp == BinaryOp::Minimum) {
    return (a < b || a != a) ? a : b;
  } else if constexpr (kOp == BinaryOp::Pow) {
    if constexpr (kInt) {
      return math::int_pow(a, b);
    } else {
      return math::pow(a, b);
    }
  } else if constexpr (kOp == BinaryOp::Atan2) {
    return math::atan2(a, b);
  } else if constexpr (kOp == BinaryOp::Hypot) {
    return math::hypot(a, b);
  } else if constexpr (kOp == BinaryOp::LogAddExp) {
    return math::logaddexp(a, b);
  } else if constexpr (kOp == BinaryOp::Remainder) {
    if constexpr (kInt) {
      return math::int_remainder(a, b);
    } else {
      return math::float_remainder(a, b);
    }
  } else if constexpr (kOp == BinaryOp::Fmod) {
    if constexpr (kInt) {
      return math::int_fmod(a, b);
    } else {
      return math::fmod(a, b);
    }
  } else if constexpr (kOp == BinaryOp::DivTrunc) {
    if constexpr (kInt) {
      return math::int_trunc_divide(a, b);
    } else {
      return math::trunc(a / b);
    }
  } else if constexpr (kOp == BinaryOp::DivFloor) {
    if constexpr (kInt) {
      return math::int_floor_divide(a, b);
    } else {
      return math::float_floor_divide(a, b);
    }
  } else if constexpr (kOp == BinaryOp::Eq) {
    return a == b;
  } else if constexpr (kOp == BinaryOp::Ne) {
    return a != b;
  } else if constexpr (kOp == BinaryOp::Lt) {
    return a < b;
  } else if constexpr (kOp == BinaryOp::Le) {
    return a <= b;
  } else if constexpr (kOp == BinaryOp::Gt) {
    return a > b;
  } else if constexpr (kOp == BinaryOp::Ge) {
    return a >= b;
  } else if constexpr (kOp == BinaryOp::LogicalAnd) {
    return a && b;
  } else {
    static_assert(kOp == BinaryOp::LogicalOr, "binary_apply: an op without a formula");
    return a || b;
  }
}

template <BinaryOp kOp, typename T>
using binary_out_t = std::conditional_t<binary_op_is_predicate(kOp), bool, T>;

/// out = op(a, b), all operands of storage type T (bool out for predicates).
template <typename T, BinaryOp kOp>
struct BinaryFn {
  using M = opmath_t<T>;
  M alpha;
  FRUGAL_HD binary_out_t<kOp, T> operator()(T a, T b) const {
    return binary_out_t<kOp, T>(binary_apply<kOp, M>(M(a), M(b), alpha));
  }
};

/// out = op(a, s) with a scalar right-hand side already in the compute type.
template <typename T, BinaryOp kOp>
struct BinaryScalarFn {
  using M = opmath_t<T>;
  M s;
  FRUGAL_HD binary_out_t<kOp, T> operator()(T a) const {
    return binary_out_t<kOp, T>(binary_apply<kOp, M>(M(a), s, M(1)));
  }
};

/// The scalar of a tensor-scalar op in compute type C's opmath. Arithmetic keeps it in
/// opmath precision, as PyTorch's CUDA kernels do (and its CPU mul and div); PyTorch 1.13's
/// CPU add, sub and mul first round a float16/bfloat16 tensor's scalar to the tensor's dtype
/// (half(2048) + 1.0004 is 2048 there, 2050 here, the correctly rounded sum), so 16-bit
/// tensor-scalar results on the CPU may differ from it by an ulp: frugal's CPU and CUDA agree
/// instead. A comparison rounds the scalar to C first, so that a half tensor holding
/// half(0.1) compares equal to 0.1.
template <typename C, BinaryOp kOp>
opmath_t<C> binary_scalar_value(double s) {
  using M = opmath_t<C>;
  if constexpr (binary_op_is_predicate(kOp) && !std::is_same_v<M, C>) {
    return M(C(M(s)));
  } else {
    return M(s);
  }
}

template <typename T>
struct WhereFn {
  FRUGAL_HD T operator()(bool c, T a, T b) const { return c ? a : b; }
};

// Note [Lerp formula]
// lerp(start, end, w) = start + w (end - start), computed as torch.lerp does so that w = 1
// gives `end` exactly (and w = 0 `start`): from start while w < 0.5, from end otherwise,
//   w < 0.5 ? start + w (end - start) : end - (end - start) (1 - w),
// in the opmath type (float for float16 and bfloat16), rounded once on store. (PyTorch 1.13's
// vectorized CPU kernel fuses the product and the sum into an FMA, so float32 results may
// differ from it in the last bit; CUDA and frugal's CPU compute the same unfused formula.)
template <typename M>
FRUGAL_HD M lerp_apply(M start, M end, M w) {
  const M d = end - start;
  return w < M(0.5) ? start + w * d : end - d * (M(1) - w);
}

/// out = lerp(start, end, w), every operand a tensor of type T.
template <typename T>
struct LerpFn {
  using M = opmath_t<T>;
  FRUGAL_HD T operator()(T start, T end, T w) const { return T(lerp_apply<M>(M(start), M(end), M(w))); }
};

/// out = lerp(start, end, w), w a scalar already in the opmath type.
template <typename T>
struct LerpScalarFn {
  using M = opmath_t<T>;
  M w;
  FRUGAL_HD T operator()(T start, T end) const { return T(lerp_apply<M>(M(start), M(end), w)); }
};

template <typename T>
struct MaskedFillFn {
  T value;
  FRUGAL_HD T operator()(T x, bool m) const { return m ? value : x; }
};

// Note [Dynamic casting]
// When an operand's dtype differs from the compute type (f16 + f32, int32 + f16,
// in-place f16 += f32, ...), the kernel loads each operand through a switch on its
// runtime dtype and converts on the fly, as PyTorch's TensorIterator does. This
// needs one kernel per (op, compute type) instead of one per dtype combination,
// and reads each input once, with no converted temporaries. A value first becomes
// the compute type C (an int32 added to a half is rounded to half, as if cast
// first) and then C's opmath type.

/// v converted to R (bool: v != 0), through the opmath types of both.
template <typename R, typename S>
FRUGAL_HD R cast_to(S v) {
  if constexpr (std::is_same_v<R, S>) return v;
  else if constexpr (std::is_same_v<R, bool>) {
    return static_cast<opmath_t<S>>(v) != opmath_t<S>(0);
  } else {
    return R(static_cast<opmath_t<R>>(static_cast<opmath_t<S>>(v)));
  }
}

/// The element at p, of runtime dtype t, as an R.
template <typename R>
FRUGAL_HD R load_as(const char* p, DType t) {
  switch (t) {
    case DType::Float32: return cast_to<R>(*reinterpret_cast<const float*>(p));
    case DType::Float16: return cast_to<R>(*reinterpret_cast<const Half*>(p));
    case DType::BFloat16: return cast_to<R>(*reinterpret_cast<const BFloat16*>(p));
    case DType::Float64: return cast_to<R>(*reinterpret_cast<const double*>(p));
    case DType::Int32: return cast_to<R>(*reinterpret_cast<const int32_t*>(p));
    case DType::Int64: return cast_to<R>(*reinterpret_cast<const int64_t*>(p));
    case DType::Bool: return cast_to<R>(*reinterpret_cast<const bool*>(p));
    case DType::UInt8: return cast_to<R>(*reinterpret_cast<const uint8_t*>(p));
  }
  return R();
}

/// Stores v at p, converted to runtime dtype t.
template <typename V>
FRUGAL_HD void store_as(char* p, DType t, V v) {
  switch (t) {
    case DType::Float32: *reinterpret_cast<float*>(p) = cast_to<float>(v); return;
    case DType::Float16: *reinterpret_cast<Half*>(p) = cast_to<Half>(v); return;
    case DType::BFloat16: *reinterpret_cast<BFloat16*>(p) = cast_to<BFloat16>(v); return;
    case DType::Float64: *reinterpret_cast<double*>(p) = cast_to<double>(v); return;
    case DType::Int32: *reinterpret_cast<int32_t*>(p) = cast_to<int32_t>(v); return;
    case DType::Int64: *reinterpret_cast<int64_t*>(p) = cast_to<int64_t>(v); return;
    case DType::Bool: *reinterpret_cast<bool*>(p) = cast_to<bool>(v); return;
    case DType::UInt8: *reinterpret_cast<uint8_t*>(p) = cast_to<uint8_t>(v); return;
  }
}

/// One element of a dynamic-cast binary op: out, a, b point at elements of the
/// dtypes recorded here; b is ignored when the right-hand side is the scalar s.
template <typename C, BinaryOp kOp>
struct DynamicBinaryFn {
  using M = opmath_t<C>;
  DType out_t, a_t, b_t;
  M alpha, s;
  bool scalar_rhs;
  FRUGAL_HD void operator()(char* out, const char* a, const char* b) const {
    const M x = M(load_as<C>(a, a_t));
    const M y = scalar_rhs ? s : M(load_as<C>(b, b_t));
    store_as(out, out_t, binary_apply<kOp, M>(x, y, alpha));
  }
};

/// Calls run.template operator()<C>() for the compute dtype when kOp supports it
/// (both backends' binary kernels dispatch through this).
template <BinaryOp kOp, typename Run>
void dispatch_compute(DType compute, Device device, Run&& run) {
  dispatch_all(compute, binary_op_name(kOp), device, [&]<typename C>() {
    if constexpr (binary_op_supports<kOp, C>()) run.template operator()<C>();
    else throw_unsupported_dtype(binary_op_name(kOp), compute, device);
  });
}

}  // namespace frugal::ops
