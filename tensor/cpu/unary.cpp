#include "tensor/ops/unary.h"

#include "tensor/cpu/gelu_kernel.h"
#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the GELU kernels too
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/unary_math.h"

namespace frugal::ops::cpu {

namespace {

// Exact GELU on float32 tensors whose operands are all dense (Note [Vectorized GELU] in
// tensor/cpu/gelu_kernel.cpp): the level's kernel on each of cpu_map's chunks, so the threading
// is the same; any other layout or dtype takes the generic path (unary_apply, glibc's erfc).
bool dense_float32(const ElementwiseLayout& L) {
  for (int k = 0; k < L.noperands; ++k)
    if (L.dtypes[k] != DType::Float32) return false;
  return L.contiguous;
}

void gelu_float32(const ElementwiseLayout& L) {  // out, x
  parallel_runs(L, [](char** p, const int64_t*, int64_t count) {
    float* y = reinterpret_cast<float*>(p[0]);
    const float* x = reinterpret_cast<const float*>(p[1]);
    switch (gemm_isa()) {
      case GemmIsa::X86_64_V4: return v4::gelu_f32(y, x, count);
      case GemmIsa::X86_64_V3: return v3::gelu_f32(y, x, count);
      case GemmIsa::X86_64_V2: return v2::gelu_f32(y, x, count);
    }
  });
}

void gelu_backward_float32(const ElementwiseLayout& L) {  // grad_in, grad, x
  parallel_runs(L, [](char** p, const int64_t*, int64_t count) {
    float* gi = reinterpret_cast<float*>(p[0]);
    const float* g = reinterpret_cast<const float*>(p[1]);
    const float* x = reinterpret_cast<const float*>(p[2]);
    switch (gemm_isa()) {
      case GemmIsa::X86_64_V4: return v4::gelu_backward_f32(gi, g, x, count);
      case GemmIsa::X86_64_V3: return v3::gelu_backward_f32(gi, g, x, count);
      case GemmIsa::X86_64_V2: return v2::gelu_backward_f32(gi, g, x, count);
    }
  });
}

}  // namespace

// out, x: same shape (any strides); see Note [One formula, two backends].
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, out, {x});
  if (op == UnaryOp::Gelu && dense_float32(L)) return gelu_float32(L);
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
  if (op == UnaryOp::Gelu && dense_float32(L)) return gelu_backward_float32(L);
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
