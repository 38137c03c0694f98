// Convolution + batch-norm fusions: validation, the fused graph where it runs, the same
// arithmetic as separate ops elsewhere (Note [Convolution batch-norm fusion]).
#include "tensor/ops/conv_bn.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/reduce.h"

namespace frugal::ops {

namespace {

DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

void check_input(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined() && x.dim() == 4 && is_floating(x.dtype()), op,
               ": expects a floating-point input (N, C, H, W), got ", x.defined() ? x.describe() : "undefined");
}

/// Whether the fused cuDNN graph may take conv(x, w) (the Note's conditions that the
/// front-end can see; conv_bn_graph checks alignment and whether an engine plans it).
bool graph_takes(const Tensor& x, const Tensor& w, const Conv2dOptions& options) {
#ifdef FRUGAL_WITH_CUDA
  return x.device().is_cuda() && (x.dtype() == kFloat16 || x.dtype() == kBFloat16) && w.dtype() == x.dtype() &&
         x.device() == w.device() && w.dim() == 4 && suggests_channels_last(x) && options.groups == 1 &&
         x.size(1) % 8 == 0 && w.size(0) % 8 == 0 && x.numel() > 0 && w.numel() > 0;
#else
  (void)x, (void)w, (void)options;
  return false;
#endif
}

/// Runs the fused graph; nullopt-like (out undefined) when it did not run.
ConvStats try_graph(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& w,
                    const Conv2dOptions& options, bool stats) {
  ConvStats r;
#ifdef FRUGAL_WITH_CUDA
  Conv2dGeometry g = conv2d_geometry("conv2d_stats", x.sizes(), w.sizes(), options);
  if (g.OH == 0 || g.OW == 0) return r;
  g.channels_last = true;
  const Tensor xs = to_channels_last(x), ws = to_channels_last(w);
  Tensor y = empty_channels_last(g.output_shape(), x.options());
  Tensor sum, sq_sum;
  if (stats) {
    sum = empty({g.K}, {kFloat32, x.device()});
    sq_sum = empty({g.K}, {kFloat32, x.device()});
  }
  if (cuda::conv_bn_graph(g, y, sum, sq_sum, xs, scale, shift, ws)) r = {y, sum, sq_sum};
#else
  (void)x, (void)scale, (void)shift, (void)w, (void)options, (void)stats;
#endif
  return r;
}

}  // namespace

void check_affine_map(const char* op, const char* what, const Tensor& t, const Tensor& x) {
  const DType compute = compute_dtype(x.dtype());
  FRUGAL_CHECK(t.defined() && t.dim() == 1 && t.size(0) == x.size(1) && t.dtype() == compute, op, ": ", what, " ",
               t.defined() ? t.describe() : "undefined", " must have shape [", x.size(1), "] and dtype ",
               dtype_name(compute), " (the compute dtype of input ", x.describe(), ")");
  check_same_device(op, x, t);
}

ConvStats channel_sums(const Tensor& y) {
  check_input("channel_sums", y);
  // Summed in float64, then rounded to the compute dtype: the variance E[y^2] - E[y]^2 cancels,
  // so the sums carry one rounding, not a float32 accumulation's. (detach: sum's strided views
  // of a tensor that requires grad would record autograd views.)
  const DType compute = compute_dtype(y.dtype());
  const Tensor yd = y.detach().to(kFloat64);
  return {y, sum(yd, {0, 2, 3}).to(compute), sum(mul(yd, yd), {0, 2, 3}).to(compute)};
}

ConvStats conv2d_stats(const Tensor& x, const Tensor& weight, const Conv2dOptions& options, bool stats) {
  check_input("conv2d_stats", x);
  if (graph_takes(x, weight, options))
    if (ConvStats r = try_graph(x, Tensor(), Tensor(), weight, options, stats); r.out.defined()) return r;
  const Tensor y = conv2d(x, weight, Tensor(), options);
  return stats ? channel_sums(y) : ConvStats{y, {}, {}};
}

BatchNormAffine batch_norm_finalize(const Tensor& sum, const Tensor& sq_sum, int64_t count, DType dtype,
                                    const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                    const Tensor& bias, bool training, double momentum, double eps, bool half_affine) {
  constexpr const char* op = "batch_norm_finalize";
  const DType compute = compute_dtype(dtype);
  const Tensor& ref = training ? sum : running_mean;
  FRUGAL_CHECK(ref.defined() && ref.dim() == 1, op, ": needs ", training ? "the sums" : "running statistics",
               " of shape (C) in ", training ? "training" : "eval", ", got ",
               ref.defined() ? ref.describe() : "undefined");
  const int64_t C = ref.size(0);
  const Device device = ref.device();
  auto check = [&](const Tensor& t, const char* what, bool compute_only) {
    if (!t.defined()) return;
    FRUGAL_CHECK(t.dim() == 1 && t.size(0) == C && (t.dtype() == compute || (!compute_only && t.dtype() == dtype)), op,
                 ": ", what, " ", t.describe(), " must have shape [", C, "] and dtype ", dtype_name(compute),
                 compute_only || dtype == compute ? "" : detail::str_cat(" or ", dtype_name(dtype)));
    FRUGAL_CHECK(t.device() == device, op, ": ", what, " ", t.describe(), " is on ", t.device().str(), ", expected ",
                 device.str());
  };
  check(sum, "sum", true), check(sq_sum, "sq_sum", true);
  check(running_mean, "running_mean", false), check(running_var, "running_var", false);
  check(weight, "weight", false), check(bias, "bias", false);
  FRUGAL_CHECK(running_mean.defined() == running_var.defined(), op,
               ": running_mean and running_var must both be given or both be undefined");
  FRUGAL_CHECK(!training || (sq_sum.defined() && count > 1), op,
               ": expected more than 1 value per channel when training, got ", count);
  FRUGAL_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);

  BatchNormAffine r;
  for (Tensor* t : {&r.mean, &r.invstd, &r.scale, &r.shift}) *t = empty({C}, {compute, device});
  // The kernel updates compute-dtype running statistics in place; others go through a copy.
  auto compute_copy = [&](const Tensor& t) { return t.defined() ? t.to(compute).contiguous() : t; };
  const Tensor rm = compute_copy(running_mean), rv = compute_copy(running_var);
  FRUGAL_DEVICE_DISPATCH(op, device, batch_norm_finalize_kernel, r, training ? sum.contiguous() : Tensor(),
                         training ? sq_sum.contiguous() : Tensor(), count, rm, rv, compute_copy(weight),
                         compute_copy(bias), training, momentum, eps, half_affine);
  if (training && running_mean.defined()) {
    if (rm.impl_ptr() != running_mean.impl_ptr()) copy_into(running_mean, rm);
    if (rv.impl_ptr() != running_var.impl_ptr()) copy_into(running_var, rv);
    running_mean.bump_version();
    running_var.bump_version();
  }
  return r;
}

Tensor scale_bias_relu(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  constexpr const char* op = "scale_bias_relu";
  check_input(op, x);
  check_affine_map(op, "scale", scale, x);
  check_affine_map(op, "shift", shift, x);
  // batch_norm_apply's (x - 0) * scale * 1 + shift, with ReLU: one pass, rounded once.
  const Tensor zero = zeros({x.size(1)}, scale.options());
  return batch_norm_apply(x, Tensor(), true, zero, scale, Tensor(), shift);
}

ConvStats scale_bias_relu_conv2d(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& weight,
                                 const Conv2dOptions& options, bool stats) {
  constexpr const char* op = "scale_bias_relu_conv2d";
  check_input(op, x);
  check_affine_map(op, "scale", scale, x);
  check_affine_map(op, "shift", shift, x);
  // cuDNN's fused prologue takes scale and shift in the data type (float32 ones plan no engine).
  if (x.dtype() == kFloat16 && graph_takes(x, weight, options))
    if (ConvStats r = try_graph(x, scale.to(kFloat16), shift.to(kFloat16), weight, options, stats); r.out.defined())
      return r;
  return conv2d_stats(scale_bias_relu(x, scale, shift), weight, options, stats);
}

}  // namespace frugal::ops
