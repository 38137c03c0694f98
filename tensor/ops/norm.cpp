#include "tensor/ops/norm.h"

#include <cmath>
#include <limits>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

void check_norm_param(const char* op, const char* what, const Tensor& p, const Tensor& x, const Shape& shape,
                      const char* shape_name) {
  if (!p.defined()) return;
  FRUGAL_CHECK(p.sizes() == shape, op, ": ", what, " ", p.describe(), " must have ", shape_name, " ", shape_str(shape),
               " (input ", x.describe(), ")");
  FRUGAL_CHECK(p.dtype() == x.dtype(), op, ": ", what, " ", p.describe(), " must have the input's dtype (input ",
               x.describe(), ")");
  check_same_device(op, x, p);
}

DType norm_stats_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

Shape check_normalized_input(const char* op, const Tensor& x, const Shape& normalized_shape) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
  FRUGAL_CHECK(!normalized_shape.empty(), op, ": normalized_shape must have at least one dim, input ", x.describe());
  const int64_t k = int64_t(normalized_shape.size());
  bool ok = x.dim() >= k;
  for (int64_t d = 0; ok && d < k; ++d) ok = x.size(x.dim() - k + d) == normalized_shape[size_t(d)];
  FRUGAL_CHECK(ok, op, ": input ", x.describe(), " does not end with normalized_shape ", shape_str(normalized_shape));
  return Shape(x.sizes().begin(), x.sizes().end() - k);
}

LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                           double eps) {
  constexpr const char* op = "layer_norm";
  const Shape rows = check_normalized_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape, "normalized_shape");
  check_norm_param(op, "bias", bias, x, normalized_shape, "normalized_shape");
  FRUGAL_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps must be finite and >= 0, got ", eps);
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  LayerNormResult r{empty(x.sizes(), x.options()), empty(rows, {norm_stats_dtype(x.dtype()), x.device()}),
                    empty(rows, {norm_stats_dtype(x.dtype()), x.device()})};
  if (M == 0) return r;
  if (N == 0) {  // statistics of an empty row: NaN, as mean() of nothing
    r.mean = full(rows, std::numeric_limits<double>::quiet_NaN(), r.mean.options());
    r.rstd = full(rows, std::numeric_limits<double>::quiet_NaN(), r.rstd.options());
    return r;
  }
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_kernel, r.out, r.mean, r.rstd, x.contiguous(),
                         weight.defined() ? weight.contiguous() : weight, bias.defined() ? bias.contiguous() : bias, M,
                         N, eps);
  return r;
}

Tensor layer_norm_apply(const Tensor& x, const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                        const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "layer_norm_apply";
  const Shape rows = check_normalized_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape, "normalized_shape");
  check_norm_param(op, "bias", bias, x, normalized_shape, "normalized_shape");
  for (const Tensor* s : {&mean, &rstd}) {
    FRUGAL_CHECK(s->defined() && s->sizes() == rows && s->dtype() == norm_stats_dtype(x.dtype()), op,
                 ": mean and rstd must be statistics of shape ", shape_str(rows), " and dtype ",
                 dtype_name(norm_stats_dtype(x.dtype())), " for input ", x.describe(), ", got ",
                 s->defined() ? s->describe() : "undefined");
    check_same_device(op, x, *s);
  }
  Tensor out = empty(x.sizes(), x.options());
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  if (M * N == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_apply_kernel, out, x.contiguous(), mean.contiguous(),
                         rstd.contiguous(), weight.defined() ? weight.contiguous() : weight,
                         bias.defined() ? bias.contiguous() : bias, M, N);
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight, bool has_bias,
                                   LayerNormGradMask mask) {
  constexpr const char* op = "layer_norm_backward";
  const Shape rows = check_normalized_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape, "normalized_shape");
  FRUGAL_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes() && grad_out.dtype() == x.dtype(), op, ": grad_out ",
               grad_out.defined() ? grad_out.describe() : "undefined", " must match the input ", x.describe());
  check_same_device(op, x, grad_out);
  for (const Tensor* s : {&mean, &rstd}) {
    FRUGAL_CHECK(s->defined() && s->sizes() == rows && s->dtype() == norm_stats_dtype(x.dtype()), op,
                 ": mean and rstd must be the forward's statistics of shape ", shape_str(rows), " and dtype ",
                 dtype_name(norm_stats_dtype(x.dtype())), ", got ", s->defined() ? s->describe() : "undefined");
    check_same_device(op, x, *s);
  }
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  LayerNormGrads g;
  if (mask.x) g.x = empty(x.sizes(), x.options());
  if (mask.weight && weight.defined()) g.weight = empty(normalized_shape, x.options());
  if (mask.bias && has_bias) g.bias = empty(normalized_shape, x.options());
  if (M == 0 || N == 0) {  // nothing flows: the parameter grads are sums over no rows
    if (g.weight.defined()) g.weight = zeros(normalized_shape, x.options());
    if (g.bias.defined()) g.bias = zeros(normalized_shape, x.options());
    return g;
  }
  if (!g.x.defined() && !g.weight.defined() && !g.bias.defined()) return g;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_backward_kernel, g.x, g.weight, g.bias, grad_out.contiguous(),
                         x.contiguous(), mean.contiguous(), rstd.contiguous(),
                         weight.defined() ? weight.contiguous() : weight, M, N);
  return g;
}

}  // namespace frugal::ops
