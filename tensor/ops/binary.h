#pragma once
// Binary elementwise ops with NumPy broadcasting and PyTorch type promotion.
//
// Note [Binary type promotion]
// A tensor-tensor op computes in result_type(a, b) (bool < int32 < int64 <
// floats; f16 with bf16 gives f32; a 0-d operand beside a dimensioned one counts only
// when its category is higher: Note [0-d operands in promotion] in tensor/dtype.h),
// except div, which is true division: integer or bool inputs give float32. A tensor-scalar op computes in
// promote_with_scalar(x, scalar_is_floating): the scalar lifts only the category,
// never the width. C++ has no separate integer scalar here, so a double scalar
// counts as an integer when it holds an integral value (mul(int_tensor, 2.0) stays
// integer) and as floating otherwise (add(int_tensor, 0.5) gives float32).
// Comparisons compute in the promoted type and return bool. Arithmetic on two bool
// tensors (add, sub, mul, maximum, minimum, pow) throws; use logical_or/and.
//
// Mixed dtypes convert on the fly inside the kernel (no temporary copies): the
// common case (both inputs already in the compute type) runs a statically typed,
// vectorized loop; any other combination runs a "dynamic cast" loop that loads
// each operand by its runtime dtype (see Note [Dynamic casting] in binary_math.h).
// The exception is where(), which first converts a mismatched operand to the result dtype.
#include <cstdint>
#include <string_view>

#include "tensor/tensor.h"

namespace frugal::ops {

/// a + alpha * b (alpha must be integral for integer results).
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a - alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
/// True division: integer and bool inputs give float32.
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise max; NaN if either is NaN.
Tensor maximum(const Tensor& a, const Tensor& b);
/// Elementwise min; NaN if either is NaN.
Tensor minimum(const Tensor& a, const Tensor& b);
/// a ^ b (integers: exact by repeated squaring).
Tensor pow(const Tensor& a, const Tensor& b);

// Note [Division-like ops]
// remainder, fmod and the rounded divisions are torch's: remainder takes the divisor's sign
// (Python's %), fmod the dividend's (C's fmod and %); div with rounding_mode "trunc" rounds
// the quotient toward zero, "floor" (floor_divide) down. On floats they are aten's formulas
// (remainder = fmod, plus the divisor when the signs differ; floor division from fmod, so
// that a = b q + r holds as closely as rounding allows), division by zero gives IEEE's inf
// or NaN. On integers they are exact and keep the dtype; the minimum integer divided by -1
// wraps to itself (its remainder is 0), where C++ would trap. An integer division by zero
// is an error, as PyTorch's CPU ZeroDivisionError: a tensor divisor is checked for zeros
// first, which on CUDA waits for the device (PyTorch's CUDA kernels return unspecified
// values instead). An integer scalar divisor must fit in the compute dtype.

/// atan2(a, b): the angle of the point (b, a), in [-pi, pi]; integer inputs give float32.
Tensor atan2(const Tensor& a, const Tensor& b);
/// sqrt(a^2 + b^2) without overflow or underflow in between; integer inputs give float32.
Tensor hypot(const Tensor& a, const Tensor& b);
/// log(e^a + e^b) without overflow (max(a, b) + log1p(e^-|a - b|)); integer inputs give float32.
Tensor logaddexp(const Tensor& a, const Tensor& b);
/// a - b floor(a / b): the divisor's sign, as Python's % (Note [Division-like ops]).
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& x, double s);
/// a - b trunc(a / b): the dividend's sign, as C's fmod (Note [Division-like ops]).
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& x, double s);
/// floor(a / b), in the promoted dtype (integers stay integers), as div(a, b, "floor").
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& x, double s);
/// a / b rounded: rounding_mode "trunc" (toward zero) or "floor" (down); integers stay
/// integers. div(a, b) is true division.
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode);
Tensor div(const Tensor& x, double s, std::string_view rounding_mode);

/// x + s, x - s, x * s, x / s (see Note [Binary type promotion] for the result dtype).
Tensor add(const Tensor& x, double s);
Tensor sub(const Tensor& x, double s);
Tensor mul(const Tensor& x, double s);
Tensor div(const Tensor& x, double s);

/// Comparisons, broadcast, computed in the promoted dtype; the result is bool.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& x, double s);
Tensor ne(const Tensor& x, double s);
Tensor lt(const Tensor& x, double s);
Tensor le(const Tensor& x, double s);
Tensor gt(const Tensor& x, double s);
Tensor ge(const Tensor& x, double s);

/// !x for bool x (x == 0 for other dtypes); bool result.
Tensor logical_not(const Tensor& x);
/// a && b, a || b, broadcast; non-bool inputs count as (x != 0). Bool result.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

/// cond ? a : b, all three broadcast; cond must be bool; dtype result_type(a, b) (as torch.where).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// mask ? value : x, mask (bool) and x broadcast together; dtype of x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

/// start + weight (end - start), as torch.lerp (Note [Lerp formula] in binary_math.h): the
/// three broadcast; start, end and a tensor weight of one floating dtype (no promotion, as
/// PyTorch), which the result has.
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
Tensor lerp(const Tensor& start, const Tensor& end, double weight);

// ---- in place: write into the first argument -------------------------------
// The first argument must already have the broadcast shape, and the result dtype
// must cast to its dtype (no float into int, nothing but bool into bool). Each op
// bumps its version and returns it. The output may alias an input of the same layout
// (a += a); an input that overlaps it in any other way is copied first.

const Tensor& add_(const Tensor& a, const Tensor& b, double alpha = 1.0);
const Tensor& sub_(const Tensor& a, const Tensor& b, double alpha = 1.0);
const Tensor& mul_(const Tensor& a, const Tensor& b);
const Tensor& div_(const Tensor& a, const Tensor& b);
const Tensor& add_(const Tensor& x, double s);
const Tensor& sub_(const Tensor& x, double s);
const Tensor& mul_(const Tensor& x, double s);
const Tensor& div_(const Tensor& x, double s);
/// x[mask] = value, mask (bool) broadcast to x's shape.
const Tensor& masked_fill_(const Tensor& x, const Tensor& mask, double value);
/// self = lerp(self, end, weight) (an EMA of weights: ema.lerp_(w, 1 - decay)); end and a
/// tensor weight broadcast to self's shape, all of one floating dtype.
const Tensor& lerp_(const Tensor& self, const Tensor& end, const Tensor& weight);
const Tensor& lerp_(const Tensor& self, const Tensor& end, double weight);

// ---- backend interface -----------------------------------------------------

// Kernel-level ops (sub runs as add with -alpha, exactly, since negation is exact).
// X(Enumerator, "name", is_predicate: returns bool)
#define FRUGAL_BINARY_OPS(X)         \
  X(Add, "add", false)               \
  X(Mul, "mul", false)               \
  X(Div, "div", false)               \
  X(Maximum, "maximum", false)       \
  X(Minimum, "minimum", false)       \
  X(Pow, "pow", false)               \
  X(Atan2, "atan2", false)           \
  X(Hypot, "hypot", false)           \
  X(LogAddExp, "logaddexp", false)   \
  X(Remainder, "remainder", false)   \
  X(Fmod, "fmod", false)             \
  X(DivTrunc, "div_trunc", false)    \
  X(DivFloor, "floor_divide", false) \
  X(Eq, "eq", true)                  \
  X(Ne, "ne", true)                  \
  X(Lt, "lt", true)                  \
  X(Le, "le", true)                  \
  X(Gt, "gt", true)                  \
  X(Ge, "ge", true)                  \
  X(LogicalAnd, "logical_and", true) \
  X(LogicalOr, "logical_or", true)

enum class BinaryOp : uint8_t {
#define FRUGAL_BINARY_ENUM(E, name, pred) E,
  FRUGAL_BINARY_OPS(FRUGAL_BINARY_ENUM)
#undef FRUGAL_BINARY_ENUM
};

constexpr const char* binary_op_name(BinaryOp op) {
  switch (op) {
#define FRUGAL_BINARY_NAME(E, name, pred) \
  case BinaryOp::E: return name;
    FRUGAL_BINARY_OPS(FRUGAL_BINARY_NAME)
#undef FRUGAL_BINARY_NAME
  }
  return "?";
}

/// True for the ops whose result is bool (comparisons, logical and/or).
constexpr bool binary_op_is_predicate(BinaryOp op) {
  switch (op) {
#define FRUGAL_BINARY_PRED(E, name, pred) \
  case BinaryOp::E: return pred;
    FRUGAL_BINARY_OPS(FRUGAL_BINARY_PRED)
#undef FRUGAL_BINARY_PRED
  }
  return false;
}

/// True for the ops that compute in a floating dtype only: integer and bool inputs give
/// float32 (true division, atan2, hypot, logaddexp).
constexpr bool binary_op_is_floating(BinaryOp op) {
  return op == BinaryOp::Div || op == BinaryOp::Atan2 || op == BinaryOp::Hypot || op == BinaryOp::LogAddExp;
}

/// True for the ops that divide: an integer divisor of 0 is refused (Note [Division-like ops]).
constexpr bool binary_op_divides(BinaryOp op) {
  return op == BinaryOp::Remainder || op == BinaryOp::Fmod || op == BinaryOp::DivTrunc || op == BinaryOp::DivFloor;
}

/// Calls f.template operator()<kOp>() with the op as a compile-time constant.
template <typename F>
decltype(auto) visit_binary_op(BinaryOp op, F&& f) {
  switch (op) {
#define FRUGAL_BINARY_CASE(E, name, pred) \
  case BinaryOp::E: return f.template operator()<BinaryOp::E>();
    FRUGAL_BINARY_OPS(FRUGAL_BINARY_CASE)
#undef FRUGAL_BINARY_CASE
  }
  FRUGAL_FAIL("visit_binary_op: invalid BinaryOp ", int(op));
}

}  // namespace frugal::ops

namespace frugal::ops::cpu {
// out = op(a, alpha * b) computed in `compute` (Note [Binary type promotion]); alpha is
// used by Add only. out: the broadcast shape (any strides, dtype bool for predicates or
// anything `compute` casts to); a, b: broadcastable to out, any dtypes.
void binary_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, const Tensor& b, double alpha);
// out = op(a, s): a has out's shape.
void binary_scalar_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, double s);
// out = cond ? a : b; cond: bool, a, b: out's dtype, all broadcastable to out.
void where_kernel(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// out = mask ? value : x; x: out's dtype, mask: bool, both broadcastable to out.
void masked_fill_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
// out = lerp(start, end, weight); start, end, weight: out's floating dtype, broadcastable to out.
void lerp_kernel(const Tensor& out, const Tensor& start, const Tensor& end, const Tensor& weight);
// out = lerp(start, end, weight); start, end: out's floating dtype, broadcastable to out.
void lerp_scalar_kernel(const Tensor& out, const Tensor& start, const Tensor& end, double weight);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void binary_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, const Tensor& b, double alpha);
void binary_scalar_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, double s);
void where_kernel(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void masked_fill_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
void lerp_kernel(const Tensor& out, const Tensor& start, const Tensor& end, const Tensor& weight);
void lerp_scalar_kernel(const Tensor& out, const Tensor& start, const Tensor& end, double weight);
}  // namespace frugal::ops::cuda
