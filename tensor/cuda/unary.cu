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
    if constexpr (unary_op_allows_integers(kOp))
      dispatch_numeric(x.dtype(), name, x.device(), run);
    else
      dispatch_floating(x.dtype(), name, x.device(), run);
  });
}

}  // namespace frugal::ops::cuda
