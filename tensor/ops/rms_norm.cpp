// rms_norm: validation, then layer norm's kernels with no mean (Note [RMS norm is layer norm
// around zero]).
#include "tensor/ops/rms_norm.h"

#include <cmath>
#include <limits>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/norm.h"

namespace frugal::ops {

namespace {


/// Checks x against normalized_shape and weight; returns the leading dims (the rows' shape).
Shape check_rms_norm_input(const char* op, const Tensor& x, const Shape& normalized_shape, const Tensor& weight) {
  const Shape rows = check_normalized_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape, "normalized_shape");
  return rows;
}

void check_rstd(const char* op, const Tensor& rstd, const Tensor& x, const Shape& rows) {
  FRUGAL_CHECK(rstd.defined() && rstd.sizes() == rows && rstd.dtype() == norm_stats_dtype(x.dtype()), op,
               ": rstd must be the forward's statistics of shape ", shape_str(rows), " and dtype ",
               dtype_name(norm_stats_dtype(x.dtype())), " for input ", x.describe(), ", got ",
               rstd.defined() ? rstd.describe() : "undefined");
  check_same_device(op, x, rstd);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

}  // namespace

double rms_norm_default_eps(DType x) {
  return x == kFloat64 ? std::numeric_limits<double>::epsilon() : double(std::numeric_limits<float>::epsilon());
}

RmsNormResult rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                       std::optional<double> eps) {
  constexpr const char* op = "rms_norm";
  const Shape rows = check_rms_norm_input(op, x, normalized_shape, weight);
  const double e = eps.value_or(rms_norm_default_eps(x.dtype()));
  FRUGAL_CHECK(e >= 0.0 && std::isfinite(e), op, ": eps must be finite and >= 0, got ", e);
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  RmsNormResult r{empty(x.sizes(), x.options()), empty(rows, {norm_stats_dtype(x.dtype()), x.device()})};
  if (M == 0) return r;
  if (N == 0) {  // the mean of no squares: NaN, as torch's mean() of nothing
    r.rstd = full(rows, std::numeric_limits<double>::quiet_NaN(), r.rstd.options());
    return r;
  }
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_kernel, r.out, /*mean=*/Tensor(), r.rstd, x.contiguous(),
                         contiguous_or_undefined(weight), /*bias=*/Tensor(), M, N, e);
  return r;
}

Tensor rms_norm_apply(const Tensor& x, const Shape& normalized_shape, const Tensor& rstd, const Tensor& weight) {
  constexpr const char* op = "rms_norm_apply";
  const Shape rows = check_rms_norm_input(op, x, normalized_shape, weight);
  check_rstd(op, rstd, x, rows);
  Tensor out = empty(x.sizes(), x.options());
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  if (M * N == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_apply_kernel, out, x.contiguous(), /*mean=*/Tensor(),
                         rstd.contiguous(), contiguous_or_undefined(weight), /*bias=*/Tensor(), M, N);
  return out;
}

RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                               const Tensor& rstd, const Tensor& weight, RmsNormGradMask mask) {
  constexpr const char* op = "rms_norm_backward";
  const Shape rows = check_rms_norm_input(op, x, normalized_shape, weight);
  FRUGAL_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes() && grad_out.dtype() == x.dtype(), op, ": grad_out ",
               grad_out.defined() ? grad_out.describe() : "undefined", " must match the input ", x.describe());
  check_same_device(op, x, grad_out);
  check_rstd(op, rstd, x, rows);
  const int64_t M = numel_of(rows), N = numel_of(normalized_shape);
  RmsNormGrads g;
  if (mask.x) g.x = empty(x.sizes(), x.options());
  if (mask.weight && weight.defined()) g.weight = empty(normalized_shape, x.options());
  if (M == 0 || N == 0) {  // nothing flows: dweight is a sum over no rows
    if (g.weight.defined()) g.weight = zeros(normalized_shape, x.options());
    return g;
  }
  if (!g.x.defined() && !g.weight.defined()) return g;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), layer_norm_backward_kernel, g.x, g.weight, /*grad_bias=*/Tensor(),
                         grad_out.contiguous(), x.contiguous(), /*mean=*/Tensor(), rstd.contiguous(),
                         contiguous_or_undefined(weight), M, N);
  return g;
}

}  // namespace frugal::ops
