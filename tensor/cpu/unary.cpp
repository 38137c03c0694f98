#include "tensor/ops/unary.h"

#include <type_traits>

#include "tensor/cpu/bit_select.h"
#include "tensor/cpu/gelu_kernel.h"
#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the GELU kernels too
#include "tensor/cpu/loops.h"
#include "tensor/cpu/via_float32.h"
#include "tensor/dispatch.h"
#include "tensor/ops/unary_math.h"

namespace frugal::ops::cpu {

namespace {

// Exact GELU on float32 tensors whose operands are all dense (Note [Vectorized GELU] in
// tensor/cpu/gelu_kernel.cpp): the level's kernel on each of cpu_map's chunks, so the threading
// is the same; any other layout or dtype (float64) takes the generic path (unary_apply, glibc's erfc).
// float16 and bfloat16 go through the same kernel a chunk at a time (via_float32.h): GELU in
// float32 rounded once, as the generic path computes it.
bool dense_same_floating(const ElementwiseLayout& L, DType dtype) {
  if (dtype != DType::Float32 && dtype != DType::Float16 && dtype != DType::BFloat16) return false;
  for (int k = 0; k < L.noperands; ++k)
    if (L.dtypes[k] != dtype) return false;
  return L.contiguous;
}

void gelu_f32(float* y, const float* x, int64_t count) {
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return v4::gelu_f32(y, x, count);
    case GemmIsa::X86_64_V3: return v3::gelu_f32(y, x, count);
    case GemmIsa::X86_64_V2: return v2::gelu_f32(y, x, count);
  }
}

void gelu_backward_f32(float* gi, const float* g, const float* x, int64_t count) {
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return v4::gelu_backward_f32(gi, g, x, count);
    case GemmIsa::X86_64_V3: return v3::gelu_backward_f32(gi, g, x, count);
    case GemmIsa::X86_64_V2: return v2::gelu_backward_f32(gi, g, x, count);
  }
}

void gelu_dense(const ElementwiseLayout& L, DType dtype) {  // out, x
  dispatch_floating(dtype, "gelu", kCPU, [&]<typename T>() {
    parallel_runs(L, [](char** p, const int64_t*, int64_t count) {
      T* y = reinterpret_cast<T*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      if constexpr (std::is_same_v<T, float>) {
        gelu_f32(y, x, count);
      } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        via_float32<T, 1>(y, {x}, count,
                          [](float* out, const auto& in, int64_t n, int64_t) { gelu_f32(out, in[0], n); });
      }
    });
  });
}

void gelu_backward_dense(const ElementwiseLayout& L, DType dtype) {  // grad_in, grad, x
  dispatch_floating(dtype, "gelu_backward", kCPU, [&]<typename T>() {
    parallel_runs(L, [](char** p, const int64_t*, int64_t count) {
      T* gi = reinterpret_cast<T*>(p[0]);
      const T* g = reinterpret_cast<const T*>(p[1]);
      const T* x = reinterpret_cast<const T*>(p[2]);
      if constexpr (std::is_same_v<T, float>) {
        gelu_backward_f32(gi, g, x, count);
      } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        via_float32<T, 2>(gi, {g, x}, count, [](float* out, const auto& in, int64_t n, int64_t) {
          gelu_backward_f32(out, in[0], in[1], n);
        });
      }
    });
  });
}

// leaky_relu on dense float32: unary_math.h's select, x > 0 ? x : x slope (forward) and
// x > 0 ? g : g slope (backward), without its branch (tensor/cpu/bit_select.h): the product
// is always taken and the sign picks bits, the same values in a third of the time.
void leaky_relu_select_f32(float* out, const float* v, const float* g, float slope, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bit_select(v[i] > 0.0f, g[i], g[i] * slope);
}

/// Runs leaky_relu's select over L's dense float32 operands: out, v (the sign), g (the value
/// scaled): the forward is (y, x, x), the backward (grad_in, x, grad).
void leaky_relu_dense_f32(const ElementwiseLayout& L, int v_operand, int g_operand, double slope) {
  parallel_runs(L, [&](char** p, const int64_t*, int64_t count) {
    leaky_relu_select_f32(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[v_operand]),
                          reinterpret_cast<const float*>(p[g_operand]), float(slope), count);
  });
}

}  // namespace

// out, x: same shape (any strides); see Note [One formula, two backends].
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  const char* name = unary_op_name(op);
  const ElementwiseLayout L = make_elementwise_layout(name, out, {x});
  if (op == UnaryOp::Gelu && dense_same_floating(L, x.dtype())) return gelu_dense(L, x.dtype());
  if (op == UnaryOp::LeakyRelu && x.dtype() == kFloat32 && dense_same_floating(L, kFloat32))
    return leaky_relu_dense_f32(L, 1, 1, a);
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
  if (op == UnaryOp::Gelu && dense_same_floating(L, grad.dtype())) return gelu_backward_dense(L, grad.dtype());
  if (op == UnaryOp::LeakyRelu && grad.dtype() == kFloat32 && dense_same_floating(L, kFloat32))
    return leaky_relu_dense_f32(L, 2, 1, a);
  visit_unary_op(op, [&]<UnaryOp kOp>() {
    if constexpr (unary_grad_from(kOp) == UnaryGradFrom::Nothing || unary_grad_from(kOp) == UnaryGradFrom::Zero) {
      FRUGAL_FAIL(name, "_backward: a constant (zeros, or the gradient scaled by the affine kernel)");
    } else {
      dispatch_floating(grad.dtype(), name, grad.device(), [&]<typename T>() {
        using M = opmath_t<T>;
        cpu_map<T, T, T>(L, UnaryBackwardFn<T, kOp>{M(a), M(b)});
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
      case FloatClass::Nan: return cpu_map<bool, T>(L, FloatClassFn<T, FloatClass::Nan>{});
      case FloatClass::Inf: return cpu_map<bool, T>(L, FloatClassFn<T, FloatClass::Inf>{});
      case FloatClass::Finite: return cpu_map<bool, T>(L, FloatClassFn<T, FloatClass::Finite>{});
    }
  });
}

}  // namespace frugal::ops::cpu
