#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/unary.h"
#include "tensor/ops/unary_math.h"

namespace frugal::ops::cuda {

// out, x: same shape (any strides); see Note [One formula, two backends]. UnaryFn is a
// functor with a __host__ __device__ operator(), as nvcc requires inside dispatch lambdas.
// Contiguous f32/f16/bf16 take cuda_map's 16-byte vectorized path (Note [Vectorized elementwise]).
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, out, {x});
  visit_unary_op(op, [&]<UnaryOp kOp>() {
    auto run = [&]<typename T>() {
      using M = opmath_t<T>;
      cuda_map<T, T>(L, out.device(), UnaryFn<T, kOp>{M(a), M(b)});
    };
    if constexpr (unary_op_allows_integers(kOp)) dispatch_numeric(x.dtype(), name, x.device(), run);
    else dispatch_floating(x.dtype(), name, x.device(), run);
  });
}

// grad_in, grad, v: same shape (grad, v any strides); one pass of unary_grad (unary_math.h),
// the whole backward of gelu & co. in one kernel (16-byte vectors when dense).
void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad, const Tensor& v, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, grad_in, {grad, v});
  visit_unary_op(op, [&]<UnaryOp kOp>() {
    if constexpr (unary_grad_from(kOp) == UnaryGradFrom::Nothing || unary_grad_from(kOp) == UnaryGradFrom::Zero) {
      FRUGAL_FAIL(name, "_backward: a constant (zeros, or the gradient scaled by the affine kernel)");
    } else {
      dispatch_floating(grad.dtype(), name, grad.device(), [&]<typename T>() {
        using M = opmath_t<T>;
        cuda_map<T, T, T>(L, grad_in.device(), UnaryBackwardFn<T, kOp>{M(a), M(b)});
      });
    }
  });
}

// out: bool, x: floating, same shape (any strides): the elementwise loop of every unary op,
// with a bool store.
void float_class_kernel(FloatClass c, const Tensor& out, const Tensor& x) {
  const char* name = float_class_name(c);
  const ElementwiseLayout L = make_elementwise_layout(name, out, {x});
  dispatch_floating(x.dtype(), name, x.device(), [&]<typename T>() {
    switch (c) {
      case FloatClass::Nan: return cuda_map<bool, T>(L, out.device(), FloatClassFn<T, FloatClass::Nan>{});
      case FloatClass::Inf: return cuda_map<bool, T>(L, out.device(), FloatClassFn<T, FloatClass::Inf>{});
      case FloatClass::Finite: return cuda_map<bool, T>(L, out.device(), FloatClassFn<T, FloatClass::Finite>{});
    }
  });
}

}  // namespace frugal::ops::cuda
