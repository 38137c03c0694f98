#include "tensor/ops/unary.h"

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/unary_math.h"

namespace frugal::ops::cpu {

// out, x: same shape (any strides); see Note [One formula, two backends].
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, out, {x});
  visit_unary_op(op, [&]<UnaryOp kOp>() {
    auto run = [&]<typename T>() {
      using M = opmath_t<T>;
      cpu_map<T, T>(L, UnaryFn<T, kOp>{M(a), M(b)});
    };
    if constexpr (unary_op_allows_integers(kOp)) dispatch_numeric(x.dtype(), name, x.device(), run);
    else dispatch_floating(x.dtype(), name, x.device(), run);
  });
}

// grad_in, grad, v: same shape (grad, v any strides); one pass of unary_grad (unary_math.h).
void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad, const Tensor& v, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, grad_in, {grad, v});
  visit_unary_op(op, [&]<UnaryOp kOp>() {
    if constexpr (unary_grad_from(kOp) == UnaryGradFrom::Nothing) {
      FRUGAL_FAIL(name, "_backward: a constant factor, computed by the affine kernel");
    } else {
      dispatch_floating(grad.dtype(), name, grad.device(), [&]<typename T>() {
        using M = opmath_t<T>;
        cpu_map<T, T, T>(L, UnaryBackwardFn<T, kOp>{M(a), M(b)});
      });
    }
  });
}

}  // namespace frugal::ops::cpu
