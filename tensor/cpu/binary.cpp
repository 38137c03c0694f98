#include "tensor/ops/binary.h"

#include "tensor/cpu/bit_select.h"
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/binary_math.h"

namespace frugal::ops::cpu {

namespace {

/// Runs f(out, a, b) on raw element pointers over the layout (Note [Dynamic casting]);
/// with two operands (tensor-scalar) b is null.
template <typename Fn>
void dynamic_map(const ElementwiseLayout& L, const Fn& f) {
  parallel_runs(L, [&](char** p, const int64_t* s, int64_t count) {
    for (int64_t i = 0; i < count; ++i)
      f(p[0] + i * s[0], p[1] + i * s[1], L.noperands > 2 ? p[2] + i * s[2] : nullptr);
  });
}

/// where's select without a branch (tensor/cpu/bit_select.h): the same bytes as WhereFn's.
template <typename T>
struct WhereBitsFn {
  T operator()(bool c, T a, T b) const { return bit_select(c, a, b); }
};

}  // namespace

// out: broadcast shape; a, b: broadcastable to out (any dtypes, any strides).
void binary_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  const ElementwiseLayout L = make_elementwise_layout(binary_op_name(op), out, {a, b});
  visit_binary_op(op, [&]<BinaryOp kOp>() {
    dispatch_compute<kOp>(compute, out.device(), [&]<typename C>() {
      using M = opmath_t<C>;
      using Out = binary_out_t<kOp, C>;
      if (a.dtype() == compute && b.dtype() == compute && out.dtype() == dtype_of<Out>()) {
        cpu_map<Out, C, C>(L, BinaryFn<C, kOp>{M(alpha)});
      } else {
        dynamic_map(L, DynamicBinaryFn<C, kOp>{out.dtype(), a.dtype(), b.dtype(), M(alpha), M(0), false});
      }
    });
  });
}

// out, a: same shape (any strides); s: the right-hand scalar.
void binary_scalar_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, double s) {
  const ElementwiseLayout L = make_elementwise_layout(binary_op_name(op), out, {a});
  visit_binary_op(op, [&]<BinaryOp kOp>() {
    dispatch_compute<kOp>(compute, out.device(), [&]<typename C>() {
      using M = opmath_t<C>;
      using Out = binary_out_t<kOp, C>;
      const M rhs = binary_scalar_value<C, kOp>(s);
      if (a.dtype() == compute && out.dtype() == dtype_of<Out>()) {
        cpu_map<Out, C>(L, BinaryScalarFn<C, kOp>{rhs});
      } else {
        dynamic_map(L, DynamicBinaryFn<C, kOp>{out.dtype(), a.dtype(), a.dtype(), M(1), rhs, true});
      }
    });
  });
}

// out: broadcast shape; cond: bool; a, b: out's dtype.
void where_kernel(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const ElementwiseLayout L = make_elementwise_layout("where", out, {cond, a, b});
  dispatch_all(out.dtype(), "where", out.device(), [&]<typename T>() { cpu_map<T, bool, T, T>(L, WhereBitsFn<T>{}); });
}

// out: broadcast shape; x: out's dtype; mask: bool.
void masked_fill_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  const ElementwiseLayout L = make_elementwise_layout("masked_fill", out, {x, mask});
  dispatch_all(out.dtype(), "masked_fill", out.device(),
               [&]<typename T>() { cpu_map<T, T, bool>(L, MaskedFillFn<T>{cast_to<T>(value)}); });
}

// out: broadcast shape; start, end, weight: out's dtype (Note [Lerp formula]).
void lerp_kernel(const Tensor& out, const Tensor& start, const Tensor& end, const Tensor& weight) {
  const ElementwiseLayout L = make_elementwise_layout("lerp", out, {start, end, weight});
  dispatch_floating(out.dtype(), "lerp", out.device(), [&]<typename T>() { cpu_map<T, T, T, T>(L, LerpFn<T>{}); });
}

// out: broadcast shape; start, end: out's dtype; weight: a scalar.
void lerp_scalar_kernel(const Tensor& out, const Tensor& start, const Tensor& end, double weight) {
  const ElementwiseLayout L = make_elementwise_layout("lerp", out, {start, end});
  dispatch_floating(out.dtype(), "lerp", out.device(), [&]<typename T>() {
    using M = opmath_t<T>;
    cpu_map<T, T, T>(L, LerpScalarFn<T>{M(weight)});
  });
}

}  // namespace frugal::ops::cpu
