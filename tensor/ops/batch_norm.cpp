// batch_norm front-end: validation, the compute-dtype views of the (C) tensors, dispatch
// (Note [Batch norm statistics]).
#include "tensor/ops/batch_norm.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/unary.h"

namespace frugal::ops {

namespace {

/// float32 for float32/float16/bfloat16, float64 for float64.
DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

struct Dims {
  int64_t N, C, HW;
};

Dims check_input(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
  FRUGAL_CHECK(x.dim() >= 2, op, ": expected an input (N, C, *) of at least 2 dims, got ", x.describe());
  const int64_t N = x.size(0), C = x.size(1);
  return {N, C, N * C == 0 ? 0 : x.numel() / (N * C)};
}

/// A (C) tensor of x's dtype or the compute dtype, on x's device (or undefined).
void check_channel_tensor(const char* op, const char* what, const Tensor& t, const Tensor& x, int64_t C) {
  if (!t.defined()) return;
  FRUGAL_CHECK(t.dim() == 1 && t.size(0) == C, op, ": ", what, " ", t.describe(), " must have shape [", C,
               "] (the channels of input ", x.describe(), ")");
  const DType compute = compute_dtype(x.dtype());
  FRUGAL_CHECK(t.dtype() == x.dtype() || t.dtype() == compute, op, ": ", what, " ", t.describe(), " must be ",
               dtype_name(x.dtype()), x.dtype() == compute ? "" : detail::str_cat(" or ", dtype_name(compute)),
               " for input ", x.describe());
  check_same_device(op, x, t);
}

/// `t` in the compute dtype, contiguous (itself when it already is), or undefined.
Tensor in_compute(const Tensor& t, DType compute) { return t.defined() ? t.to(compute).contiguous() : t; }

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                           const Tensor& bias, bool training, double momentum, double eps) {
  constexpr const char* op = "batch_norm";
  const Dims d = check_input(op, x);
  check_channel_tensor(op, "running_mean", running_mean, x, d.C);
  check_channel_tensor(op, "running_var", running_var, x, d.C);
  check_channel_tensor(op, "weight", weight, x, d.C);
  check_channel_tensor(op, "bias", bias, x, d.C);
  FRUGAL_CHECK(running_mean.defined() == running_var.defined(), op,
               ": running_mean and running_var must both be given or both be undefined");
  FRUGAL_CHECK(training || running_mean.defined(), op, ": running_mean and running_var must be given in eval mode");
  FRUGAL_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
  const DType compute = compute_dtype(x.dtype());
  BatchNormResult r;
  r.out = empty(x.sizes(), x.options());
  if (training) {
    FRUGAL_CHECK(d.N * d.HW > 1, op, ": expected more than 1 value per channel when training, got input ",
                 x.describe());
    r.mean = empty({d.C}, {compute, x.device()});
    r.invstd = empty({d.C}, {compute, x.device()});
    // The kernel updates compute-dtype, contiguous running statistics in place; others go through a copy.
    const bool in_place = running_mean.defined() && running_mean.dtype() == compute && running_var.dtype() == compute &&
                          running_mean.is_contiguous() && running_var.is_contiguous();
    const Tensor rm = in_place ? running_mean : in_compute(running_mean, compute);
    const Tensor rv = in_place ? running_var : in_compute(running_var, compute);
    FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_stats_kernel, r.mean, r.invstd, rm, rv, x.contiguous(), d.N, d.C,
                           d.HW, momentum, eps);
    if (running_mean.defined()) {
      if (in_place) {
        running_mean.bump_version();
        running_var.bump_version();
      } else {
        running_mean.copy_(rm);
        running_var.copy_(rv);
      }
    }
  } else {
    r.mean = empty({d.C}, {compute, x.device()});
    r.mean.copy_(running_mean);
    r.invstd = rsqrt(add(running_var.to(compute), eps));
  }
  if (r.out.numel() == 0) return r;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_apply_kernel, r.out, x.contiguous(), r.mean, r.invstd,
                         in_compute(weight, compute), in_compute(bias, compute), d.N, d.C, d.HW);
  return r;
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool training, BatchNormGradMask mask) {
  constexpr const char* op = "batch_norm_backward";
  const Dims d = check_input(op, x);
  check_channel_tensor(op, "weight", weight, x, d.C);
  FRUGAL_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes() && grad_out.dtype() == x.dtype(), op, ": grad_out ",
               grad_out.defined() ? grad_out.describe() : "undefined", " must match the input ", x.describe());
  check_same_device(op, x, grad_out);
  const DType compute = compute_dtype(x.dtype());
  for (const Tensor* s : {&mean, &invstd}) {
    FRUGAL_CHECK(s->defined() && s->dim() == 1 && s->size(0) == d.C && s->dtype() == compute, op,
                 ": mean and invstd must be the forward's statistics of shape [", d.C, "] and dtype ",
                 dtype_name(compute), ", got ", s->defined() ? s->describe() : "undefined");
    check_same_device(op, x, *s);
  }
  BatchNormGrads g;
  if (mask.x) g.x = empty(x.sizes(), x.options());
  if (mask.weight) g.weight = empty({d.C}, {compute, x.device()});
  if (mask.bias) g.bias = empty({d.C}, {compute, x.device()});
  if (x.numel() == 0) {  // the parameter gradients are sums over nothing
    if (g.weight.defined()) zero_(g.weight);
    if (g.bias.defined()) zero_(g.bias);
    return g;
  }
  if (!g.x.defined() && !g.weight.defined() && !g.bias.defined()) return g;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_backward_kernel, g.x, g.weight, g.bias, grad_out.contiguous(),
                         x.contiguous(), mean.contiguous(), invstd.contiguous(), in_compute(weight, compute), training,
                         d.N, d.C, d.HW);
  return g;
}

}  // namespace frugal::ops
