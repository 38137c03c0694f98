#include "tensor/ops/binary.h"

#include <cmath>
#include <limits>
#include <ostream>
#include <string>

#include "tensor/device_dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/reduce.h"

namespace frugal::ops {

namespace {

void check_defined(const char* name, const Tensor& t) { FRUGAL_CHECK(t.defined(), name, ": undefined input tensor"); }

/// A dense copy of t in `dtype`. Raw ops copy through copy_into, never Tensor::to/clone,
/// so that nothing here is seen by autograd (see Note [Tensor handle]).
Tensor dense_copy(const Tensor& t, DType dtype) {
  Tensor out = empty(t.sizes(), {dtype, t.device()});
  copy_into(out, t);
  return out;
}
Tensor as_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : dense_copy(t, dtype); }

/// See Note [Binary type promotion]: an integral double counts as an integer scalar.
bool scalar_is_floating(double s) { return !(std::isfinite(s) && s == std::trunc(s)); }

/// The operands of an op, for error messages: "float32[2, 3] cpu and int32[3] cpu" or
/// "int32[3] cpu and scalar 0.5". Streamed only when a check fails, so the success path
/// builds no strings.
struct Operands {
  const Tensor& a;
  const Tensor* b;  // null for a scalar
  double s = 0.0;
};
std::ostream& operator<<(std::ostream& os, const Operands& o) {
  os << o.a.describe() << " and ";
  if (o.b) return os << o.b->describe();
  return os << "scalar " << o.s;
}

// Note [Integer scalars out of range]
// An integer scalar reaches the kernels as a double that they convert to the compute type,
// and converting a double outside an integer type's range is undefined behaviour. PyTorch's
// integer scalar is an int64 (a Python integer beyond it is an error), converted to the
// compute type with two's-complement wrap-around: int32 + 3000000000 gives the int32 wrap of
// the exact sum, consistent with integer arithmetic wrapping. frugal does the same for add,
// sub and mul: the scalar must fit in int64 and is wrapped to the compute type's width before
// the kernel sees it. add's and sub's alpha multiplies a tensor, so it must fit the compute
// type itself, as PyTorch checks (a wrapped alpha would be another factor). A comparison would be wrong after wrapping
// (torch says 1 < 3000000000 is false for an int32 tensor), so a scalar beyond the compute type compares as -inf or
// +inf in float64 instead: exact, since no integer of the tensor reaches it and the conversion to double keeps the
// order.
constexpr double kTwo31 = 2147483648.0, kTwo63 = 9223372036854775808.0;

/// Whether the integral double s lies in integer dtype t's range.
bool fits_integer(double s, DType t) { return t == kInt32 ? s >= -kTwo31 && s < kTwo31 : s >= -kTwo63 && s < kTwo63; }

/// The integer scalar or alpha `s` of an arithmetic op computing in integer dtype `compute`,
/// wrapped to its width (Note [Integer scalars out of range]); negated after the check when
/// `negate` (sub's), modulo 2^64 as the subtraction itself is: x - (-2^63) is x + 2^63.
double wrap_integer_scalar(const char* name, const char* role, double s, DType compute, const Operands& what,
                           bool negate = false) {
  FRUGAL_CHECK(fits_integer(s, kInt64), name, ": the integer ", role, " ", s,
               " does not fit in int64, so it cannot be an operand of ", dtype_name(compute), " arithmetic (", what,
               "); convert the tensor to a floating dtype first");
  const uint64_t v = negate ? uint64_t(0) - uint64_t(int64_t(s)) : uint64_t(int64_t(s));
  return compute == kInt32 ? double(int32_t(uint32_t(v))) : double(int64_t(v));  // modular (C++20)
}

/// sub's operands: PyTorch refuses subtraction with a bool tensor (`a - b` of two masks is no
/// logical op), whatever the other operand's dtype.
void check_sub_operands(const char* name, const Tensor& a, const Tensor* b, const Operands& what) {
  FRUGAL_CHECK(a.dtype() != kBool && (!b || b->dtype() != kBool), name, ": subtraction with a bool tensor is not ",
               "supported (", what, "); use logical_not / logical_xor, or convert with .to()");
}

/// The compute dtype of `op` on operands whose promoted dtype is `promoted`; throws for
/// arithmetic on bool.
/// torch.result_type(a, b) (Note [0-d operands in promotion] in tensor/dtype.h), refusing uint8
/// with the op's name and operands (result_type itself knows neither; Note [Storage-only uint8]).
DType promote(const char* name, const Tensor& a, const Tensor& b, const Operands& what) {
  FRUGAL_CHECK(a.dtype() != kUInt8 && b.dtype() != kUInt8, name,
               ": uint8 is a storage-only dtype and takes no arithmetic (", what,
               "; Note [Storage-only uint8] in tensor/dtype.h)");
  return result_type(a.dtype(), a.dim() == 0, b.dtype(), b.dim() == 0);
}

DType compute_dtype(const char* name, BinaryOp op, DType promoted, const Operands& what) {
  FRUGAL_CHECK(promoted != kUInt8, name, ": uint8 is a storage-only dtype and takes no arithmetic (", what,
               "; Note [Storage-only uint8] in tensor/dtype.h)");
  if (binary_op_is_floating(op)) return is_floating(promoted) ? promoted : kFloat32;  // true division, atan2, ...
  if (!binary_op_is_predicate(op))
    FRUGAL_CHECK(promoted != kBool, name, ": arithmetic on bool is not supported (", what,
                 "); use logical_or / logical_and, or convert with .to()");
  return promoted;
}

/// add's alpha (sub's, then negated) as the kernel takes it: any value for a floating result;
/// an integer of the result's range for an integer result, as PyTorch's alpha check (alpha
/// multiplies the tensor: a wrapped alpha would be another factor, not a wrapped sum).
double checked_alpha(const char* name, DType compute, double alpha, const Operands& what, bool negate) {
  if (is_floating(compute)) return negate ? -alpha : alpha;
  FRUGAL_CHECK(std::isfinite(alpha) && alpha == std::trunc(alpha), name,
               ": alpha must be an integer when the result is ", dtype_name(compute), ", got ", alpha);
  FRUGAL_CHECK(fits_integer(alpha, compute), name, ": alpha ", alpha, " does not fit in ", dtype_name(compute),
               ", the dtype of the result (", what, ")");
  return wrap_integer_scalar(name, "alpha", alpha, compute, what, negate);
}

/// PyTorch's can_cast: a result may be written into `out` unless that would turn a
/// floating value into an integer, or a non-bool into a bool.
bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

/// `other` as an input of an in-place op writing `out`: reading an overlapping tensor
/// in a different layout while writing would read already-written elements, so such an
/// input is copied first. The same layout (a += a) is safe: each element is read
/// before it is written, by the same thread.
Tensor safe_input(const Tensor& out, const Tensor& other) {
  if (!other.shares_storage(out)) return other;
  const bool same_layout = other.sizes() == out.sizes() && other.strides() == out.strides() &&
                           other.storage_offset() == out.storage_offset();
  return same_layout ? other : dense_copy(other, other.dtype());
}

/// Throws unless every element of `out` is its own memory (no expanded dims).
/// Checks an in-place op's output: it must hold the broadcast shape and the result dtype.
void check_inplace(const char* name, const Tensor& out, const Shape& shape, DType result, const Operands& what) {
  FRUGAL_CHECK(shape == out.sizes(), name, ": the result of ", what, " has shape ", shape_str(shape),
               ", which does not fit the in-place output of shape ", shape_str(out.sizes()));
  FRUGAL_CHECK(can_cast(result, out.dtype()), name, ": result type ", dtype_name(result),
               " cannot be written into the in-place output ", out.describe());
  check_no_internal_overlap(name, out);
}

/// An integer division's divisor b holds no 0 (Note [Division-like ops]); on CUDA the count
/// waits for the device.
void check_integer_divisor(const char* name, const Tensor& b, const Operands& what) {
  const int64_t zeros = sum(eq(b, 0.0)).item<int64_t>();
  FRUGAL_CHECK(zeros == 0, name, ": integer division by zero (", what, ": the divisor holds ", zeros,
               zeros == 1 ? " zero" : " zeros", "); PyTorch's CPU raises ZeroDivisionError here");
}

/// An integer scalar divisor: nonzero and within the compute dtype (wrapping it, as add's
/// scalar is, would divide by another number).
void check_integer_scalar_divisor(const char* name, double s, DType compute, const Operands& what) {
  FRUGAL_CHECK(s != 0.0, name, ": integer division by zero (", what, "); PyTorch's CPU raises ZeroDivisionError here");
  FRUGAL_CHECK(fits_integer(s, compute), name, ": the divisor ", s, " does not fit in ", dtype_name(compute), " (",
               what, "); convert the tensor to a wider dtype first");
}

// `negate`: sub, a - alpha b, run as add with -alpha (negated after alpha's checks).
Tensor binary_op(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, double alpha = 1.0,
                 bool negate = false) {
  check_defined(name, a);
  check_defined(name, b);
  check_same_device(name, a, b);
  if (negate) check_sub_operands(name, a, &b, {a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  const DType compute = compute_dtype(name, op, promote(name, a, b, {a, &b}), {a, &b});
  if (op == BinaryOp::Add) alpha = checked_alpha(name, compute, alpha, Operands{a, &b}, negate);
  if (binary_op_divides(op) && is_integral(compute) && numel_of(shape) > 0) check_integer_divisor(name, b, {a, &b});
  Tensor out = empty_elementwise_output(shape, {binary_op_is_predicate(op) ? kBool : compute, a.device()}, {&a, &b});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(name, a.device(), binary_kernel, op, compute, out, a, b, alpha);
  return out;
}

// `negate`: sub, x - s, run as add of -s (negated after the scalar's checks).
Tensor scalar_op(const char* name, BinaryOp op, const Tensor& x, double s, bool negate = false) {
  check_defined(name, x);
  if (negate) check_sub_operands(name, x, nullptr, {x, nullptr, s});
  DType compute = compute_dtype(name, op, promote_with_scalar(x.dtype(), scalar_is_floating(s)), {x, nullptr, s});
  if (!is_integral(compute) && negate) s = -s;
  if (is_integral(compute)) {  // Note [Integer scalars out of range]
    if (binary_op_divides(op)) check_integer_scalar_divisor(name, s, compute, {x, nullptr, s});
    if (!binary_op_is_predicate(op)) {
      s = wrap_integer_scalar(name, "scalar", s, compute, Operands{x, nullptr, s}, negate);
    } else if (!fits_integer(s, compute)) {
      compute = kFloat64;
      s = s > 0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    }
  }
  Tensor out = empty_elementwise_output(x.sizes(), {binary_op_is_predicate(op) ? kBool : compute, x.device()}, {&x});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(name, x.device(), binary_scalar_kernel, op, compute, out, x, s);
  return out;
}

const Tensor& binary_inplace(const char* name, BinaryOp op, const Tensor& self, const Tensor& other, double alpha = 1.0,
                             bool negate = false) {
  check_defined(name, self);
  check_defined(name, other);
  check_same_device(name, self, other);
  const Operands what{self, &other};
  if (negate) check_sub_operands(name, self, &other, what);
  const Shape shape = broadcast_shapes(self.sizes(), other.sizes(), name);
  const DType compute = compute_dtype(name, op, promote(name, self, other, what), what);
  if (op == BinaryOp::Add) alpha = checked_alpha(name, compute, alpha, what, negate);
  check_inplace(name, self, shape, compute, what);
  if (self.numel() > 0) {
    const Tensor rhs = safe_input(self, other);
    FRUGAL_DEVICE_DISPATCH(name, self.device(), binary_kernel, op, compute, self, self, rhs, alpha);
  }
  self.bump_version();
  return self;
}

const Tensor& scalar_inplace(const char* name, BinaryOp op, const Tensor& self, double s, bool negate = false) {
  check_defined(name, self);
  const Operands what{self, nullptr, s};
  if (negate) check_sub_operands(name, self, nullptr, what);
  const DType compute = compute_dtype(name, op, promote_with_scalar(self.dtype(), scalar_is_floating(s)), what);
  check_inplace(name, self, self.sizes(), compute, what);
  if (is_integral(compute)) s = wrap_integer_scalar(name, "scalar", s, compute, what, negate);  // no predicates
  else if (negate) s = -s;
  if (self.numel() > 0) FRUGAL_DEVICE_DISPATCH(name, self.device(), binary_scalar_kernel, op, compute, self, self, s);
  self.bump_version();
  return self;
}

/// lerp's operands: defined, one floating dtype (start's), one device; weight may be null.
void check_lerp(const char* name, const Tensor& start, const Tensor& end, const Tensor* weight) {
  check_defined(name, start);
  check_defined(name, end);
  if (weight) check_defined(name, *weight);
  const std::string operands = "start " + start.describe() + ", end " + end.describe() +
                               (weight ? ", weight " + weight->describe() : std::string());
  FRUGAL_CHECK(is_floating(start.dtype()), name, ": expects floating tensors, got ", operands);
  FRUGAL_CHECK(end.dtype() == start.dtype(), name, ": expected dtype ", dtype_name(start.dtype()), " for end, got ",
               operands, " (lerp does not promote: convert with .to(dtype))");
  if (weight)
    FRUGAL_CHECK(weight->dtype() == start.dtype(), name, ": expected dtype ", dtype_name(start.dtype()),
                 " for weight, got ", operands, " (lerp does not promote: convert with .to(dtype))");
  check_same_device(name, start, end);
  if (weight) check_same_device(name, start, *weight);
}

/// x as bool: itself when already bool, else x != 0.
Tensor truth(const Tensor& x) { return x.dtype() == kBool ? x : ne(x, 0.0); }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return binary_op("add", BinaryOp::Add, a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  return binary_op("sub", BinaryOp::Add, a, b, alpha, true);
}
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", BinaryOp::Div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op("maximum", BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op("minimum", BinaryOp::Minimum, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op("pow", BinaryOp::Pow, a, b); }

Tensor atan2(const Tensor& a, const Tensor& b) { return binary_op("atan2", BinaryOp::Atan2, a, b); }
Tensor hypot(const Tensor& a, const Tensor& b) { return binary_op("hypot", BinaryOp::Hypot, a, b); }
Tensor logaddexp(const Tensor& a, const Tensor& b) { return binary_op("logaddexp", BinaryOp::LogAddExp, a, b); }
Tensor remainder(const Tensor& a, const Tensor& b) { return binary_op("remainder", BinaryOp::Remainder, a, b); }
Tensor remainder(const Tensor& x, double s) { return scalar_op("remainder", BinaryOp::Remainder, x, s); }
Tensor fmod(const Tensor& a, const Tensor& b) { return binary_op("fmod", BinaryOp::Fmod, a, b); }
Tensor fmod(const Tensor& x, double s) { return scalar_op("fmod", BinaryOp::Fmod, x, s); }
Tensor floor_divide(const Tensor& a, const Tensor& b) { return binary_op("floor_divide", BinaryOp::DivFloor, a, b); }
Tensor floor_divide(const Tensor& x, double s) { return scalar_op("floor_divide", BinaryOp::DivFloor, x, s); }

namespace {
/// div's rounding_mode as its kernel-level op.
BinaryOp rounded_division(std::string_view rounding_mode) {
  FRUGAL_CHECK(rounding_mode == "trunc" || rounding_mode == "floor", "div: rounding_mode must be \"trunc\" or ",
               "\"floor\", got \"", rounding_mode, "\" (div(a, b) without one is true division)");
  return rounding_mode == "trunc" ? BinaryOp::DivTrunc : BinaryOp::DivFloor;
}
}  // namespace

Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode) {
  return binary_op("div", rounded_division(rounding_mode), a, b);
}
Tensor div(const Tensor& x, double s, std::string_view rounding_mode) {
  return scalar_op("div", rounded_division(rounding_mode), x, s);
}

Tensor add(const Tensor& x, double s) { return scalar_op("add", BinaryOp::Add, x, s); }
Tensor sub(const Tensor& x, double s) { return scalar_op("sub", BinaryOp::Add, x, s, /*negate=*/true); }
Tensor mul(const Tensor& x, double s) { return scalar_op("mul", BinaryOp::Mul, x, s); }
Tensor div(const Tensor& x, double s) { return scalar_op("div", BinaryOp::Div, x, s); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary_op("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op("ge", BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& x, double s) { return scalar_op("eq", BinaryOp::Eq, x, s); }
Tensor ne(const Tensor& x, double s) { return scalar_op("ne", BinaryOp::Ne, x, s); }
Tensor lt(const Tensor& x, double s) { return scalar_op("lt", BinaryOp::Lt, x, s); }
Tensor le(const Tensor& x, double s) { return scalar_op("le", BinaryOp::Le, x, s); }
Tensor gt(const Tensor& x, double s) { return scalar_op("gt", BinaryOp::Gt, x, s); }
Tensor ge(const Tensor& x, double s) { return scalar_op("ge", BinaryOp::Ge, x, s); }

Tensor logical_not(const Tensor& x) {
  check_defined("logical_not", x);
  // !x is x == 0, compared in x's own dtype (0 is exact in every dtype), so every
  // dtype takes the statically typed kernel.
  Tensor out = empty_elementwise_output(x.sizes(), {kBool, x.device()}, {&x});
  if (out.numel() > 0)
    FRUGAL_DEVICE_DISPATCH("logical_not", x.device(), binary_scalar_kernel, BinaryOp::Eq, x.dtype(), out, x, 0.0);
  return out;
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  check_defined("logical_and", a);
  check_defined("logical_and", b);
  return binary_op("logical_and", BinaryOp::LogicalAnd, truth(a), truth(b));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  check_defined("logical_or", a);
  check_defined("logical_or", b);
  return binary_op("logical_or", BinaryOp::LogicalOr, truth(a), truth(b));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&cond, &a, &b}) check_defined("where", *t);
  FRUGAL_CHECK(cond.dtype() == kBool, "where: condition must be bool, got ", cond.describe());
  check_same_device("where", cond, a);
  check_same_device("where", cond, b);
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  // where() converts a mismatched operand up front (rare, and it keeps one kernel per dtype).
  const DType dtype = promote("where", a, b, {a, &b});
  Tensor out = empty_elementwise_output(shape, {dtype, a.device()}, {&a, &b, &cond});
  if (out.numel() > 0)
    FRUGAL_DEVICE_DISPATCH("where", a.device(), where_kernel, out, cond, as_dtype(a, dtype), as_dtype(b, dtype));
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", x);
  check_defined("masked_fill", mask);
  FRUGAL_CHECK(mask.dtype() == kBool, "masked_fill: mask must be bool, got ", mask.describe());
  check_same_device("masked_fill", x, mask);
  check_fill_value("masked_fill", value, x);  // Note [Integer fill values]
  Tensor out = empty_elementwise_output(broadcast_shapes(x.sizes(), mask.sizes(), "masked_fill"), x.options(), {&x});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH("masked_fill", x.device(), masked_fill_kernel, out, x, mask, value);
  return out;
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  check_lerp("lerp", start, end, &weight);
  const Shape shape = broadcast_shapes(broadcast_shapes(start.sizes(), end.sizes(), "lerp"), weight.sizes(), "lerp");
  Tensor out = empty_elementwise_output(shape, start.options(), {&start, &end, &weight});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH("lerp", start.device(), lerp_kernel, out, start, end, weight);
  return out;
}

Tensor lerp(const Tensor& start, const Tensor& end, double weight) {
  check_lerp("lerp", start, end, nullptr);
  const Shape shape = broadcast_shapes(start.sizes(), end.sizes(), "lerp");
  Tensor out = empty_elementwise_output(shape, start.options(), {&start, &end});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH("lerp", start.device(), lerp_scalar_kernel, out, start, end, weight);
  return out;
}

const Tensor& lerp_(const Tensor& self, const Tensor& end, const Tensor& weight) {
  check_lerp("lerp_", self, end, &weight);
  const Shape shape = broadcast_shapes(broadcast_shapes(self.sizes(), end.sizes(), "lerp_"), weight.sizes(), "lerp_");
  FRUGAL_CHECK(shape == self.sizes(), "lerp_: end ", end.describe(), " and weight ", weight.describe(),
               " do not broadcast to the in-place output ", self.describe());
  check_no_internal_overlap("lerp_", self);
  if (self.numel() > 0)
    FRUGAL_DEVICE_DISPATCH("lerp_", self.device(), lerp_kernel, self, self, safe_input(self, end),
                           safe_input(self, weight));
  self.bump_version();
  return self;
}

const Tensor& lerp_(const Tensor& self, const Tensor& end, double weight) {
  check_lerp("lerp_", self, end, nullptr);
  const Shape shape = broadcast_shapes(self.sizes(), end.sizes(), "lerp_");
  FRUGAL_CHECK(shape == self.sizes(), "lerp_: end ", end.describe(), " does not broadcast to the in-place output ",
               self.describe());
  check_no_internal_overlap("lerp_", self);
  if (self.numel() > 0)
    FRUGAL_DEVICE_DISPATCH("lerp_", self.device(), lerp_scalar_kernel, self, self, safe_input(self, end), weight);
  self.bump_version();
  return self;
}

const Tensor& add_(const Tensor& a, const Tensor& b, double alpha) {
  return binary_inplace("add_", BinaryOp::Add, a, b, alpha);
}
const Tensor& sub_(const Tensor& a, const Tensor& b, double alpha) {
  return binary_inplace("sub_", BinaryOp::Add, a, b, alpha, /*negate=*/true);
}
const Tensor& mul_(const Tensor& a, const Tensor& b) { return binary_inplace("mul_", BinaryOp::Mul, a, b); }
const Tensor& div_(const Tensor& a, const Tensor& b) { return binary_inplace("div_", BinaryOp::Div, a, b); }
const Tensor& add_(const Tensor& x, double s) { return scalar_inplace("add_", BinaryOp::Add, x, s); }
const Tensor& sub_(const Tensor& x, double s) { return scalar_inplace("sub_", BinaryOp::Add, x, s, /*negate=*/true); }
const Tensor& mul_(const Tensor& x, double s) { return scalar_inplace("mul_", BinaryOp::Mul, x, s); }
const Tensor& div_(const Tensor& x, double s) { return scalar_inplace("div_", BinaryOp::Div, x, s); }

const Tensor& masked_fill_(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill_", x);
  check_defined("masked_fill_", mask);
  FRUGAL_CHECK(mask.dtype() == kBool, "masked_fill_: mask must be bool, got ", mask.describe());
  check_same_device("masked_fill_", x, mask);
  check_fill_value("masked_fill_", value, x);  // Note [Integer fill values]
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_fill_");
  FRUGAL_CHECK(shape == x.sizes(), "masked_fill_: mask ", mask.describe(), " does not broadcast to the output ",
               x.describe());
  check_no_internal_overlap("masked_fill_", x);
  if (x.numel() > 0)
    FRUGAL_DEVICE_DISPATCH("masked_fill_", x.device(), masked_fill_kernel, x, x, safe_input(x, mask), value);
  x.bump_version();
  return x;
}

}  // namespace frugal::ops
