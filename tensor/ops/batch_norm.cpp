// batch_norm front-end: validation, the compute-dtype views of the (C) tensors, dispatch
// (Note [Batch norm statistics]).
#include "tensor/ops/batch_norm.h"

#include <cmath>
#include <limits>
#include <optional>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/conv_bn.h"
#include "tensor/ops/copy.h"
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

/// A backward's grad_out: x's shape and dtype, on x's device.
void check_grad_out(const char* op, const Tensor& grad_out, const Tensor& x) {
  FRUGAL_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes() && grad_out.dtype() == x.dtype(), op, ": grad_out ",
               grad_out.defined() ? grad_out.describe() : "undefined", " must match the input ", x.describe());
  check_same_device(op, x, grad_out);
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

/// The checks of a backward's (C) arguments: weight as in the forward, mean and invstd the
/// forward's statistics ((C) in the compute dtype), all on x's device.
void check_statistics(const char* op, const Tensor& x, int64_t C, const Tensor& weight, const Tensor& mean,
                      const Tensor& invstd) {
  check_channel_tensor(op, "weight", weight, x, C);
  const DType compute = compute_dtype(x.dtype());
  for (const Tensor* s : {&mean, &invstd}) {
    FRUGAL_CHECK(s->defined() && s->dim() == 1 && s->size(0) == C && s->dtype() == compute, op,
                 ": mean and invstd must be the forward's statistics of shape [", C, "] and dtype ",
                 dtype_name(compute), ", got ", s->defined() ? s->describe() : "undefined");
    check_same_device(op, x, *s);
  }
}

/// The checks every batch norm forward makes; returns x's dims.
Dims check_forward(const char* op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                   const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  const Dims d = check_input(op, x);
  check_channel_tensor(op, "running_mean", running_mean, x, d.C);
  check_channel_tensor(op, "running_var", running_var, x, d.C);
  check_channel_tensor(op, "weight", weight, x, d.C);
  check_channel_tensor(op, "bias", bias, x, d.C);
  FRUGAL_CHECK(running_mean.defined() == running_var.defined(), op,
               ": running_mean and running_var must both be given or both be undefined");
  FRUGAL_CHECK(training || running_mean.defined(), op, ": running_mean and running_var must be given in eval mode");
  FRUGAL_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps must be finite and >= 0, got ", eps);
  // NaN or inf would reach the running statistics (Note [Finite hyperparameters] in optim/step_util.h).
  FRUGAL_CHECK(std::isfinite(momentum), op, ": momentum must be finite, got ", momentum);
  // Exactly one value has no variance; none (a size-0 batch) is an empty step, as PyTorch's
  // _verify_batch_size and its numel() == 0 path: Note [Size-0 batch norm].
  if (training)
    FRUGAL_CHECK(d.N * d.HW != 1, op, ": expected more than 1 value per channel when training, got input ",
                 x.describe());
  return d;
}

/// The running statistics as the kernels update them: compute-dtype and contiguous, the
/// caller's own tensors when they already are (updated in place), else copies that
/// finish() writes back.
struct RunningStats {
  Tensor mean, var;
  bool in_place = false;
  RunningStats(const Tensor& running_mean, const Tensor& running_var, DType compute)
      : in_place(running_mean.defined() && running_mean.dtype() == compute && running_var.dtype() == compute &&
                 running_mean.is_contiguous() && running_var.is_contiguous()) {
    mean = in_place ? running_mean : in_compute(running_mean, compute);
    var = in_place ? running_var : in_compute(running_var, compute);
  }
  void finish(const Tensor& running_mean, const Tensor& running_var) const {
    if (!running_mean.defined()) return;
    if (!in_place) {
      copy_into(running_mean, mean);
      copy_into(running_var, var);
    }
    running_mean.bump_version();
    running_var.bump_version();
  }
};

/// Whether a training forward goes to cuDNN (Note [Channels-last batch norm]).
bool cudnn_takes(const Tensor& x, const Tensor& weight, const Tensor& bias, bool training) {
#ifdef FRUGAL_WITH_CUDA
  return training && x.device().is_cuda() && x.dim() == 4 && x.numel() > 0 && suggests_channels_last(x) &&
         (x.dtype() == kFloat16 || x.dtype() == kBFloat16) && weight.defined() && bias.defined() &&
         weight.dtype() == kFloat32 && bias.dtype() == kFloat32;
#else
  (void)x, (void)weight, (void)bias, (void)training;
  return false;
#endif
}

/// The training forward on cuDNN, or nullopt when cuDNN declines the problem (having written nothing).
std::optional<BatchNormResult> cudnn_forward(const Tensor& x, const Tensor& residual, bool relu,
                                             const Tensor& running_mean, const Tensor& running_var,
                                             const Tensor& weight, const Tensor& bias, double momentum, double eps) {
#ifdef FRUGAL_WITH_CUDA
  const RunningStats stats(running_mean, running_var, kFloat32);
  BatchNormResult r;
  r.out = empty_channels_last(x.sizes(), x.options());
  r.mean = empty({x.size(1)}, {kFloat32, x.device()});
  r.invstd = empty({x.size(1)}, {kFloat32, x.device()});
  r.reserve = cuda::batch_norm_cudnn_forward(
      r.out, r.mean, r.invstd, x, residual.defined() ? to_channels_last(residual) : residual, relu, weight.contiguous(),
      bias.contiguous(), stats.mean, stats.var, momentum, eps);
  if (!r.reserve.defined()) return std::nullopt;
  stats.finish(running_mean, running_var);
  return r;
#else
  (void)x, (void)residual, (void)relu, (void)running_mean, (void)running_var, (void)weight, (void)bias, (void)momentum,
      (void)eps;
  return std::nullopt;
#endif
}

/// The backward on cuDNN of a forward it ran (saved.reserve defined): with ReLU when `out`
/// is given, and grad_residual when the forward had a residual.
BatchNormGrads cudnn_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& weight,
                              const Tensor& bias, const Tensor& mean, const Tensor& invstd, BatchNormGradMask mask,
                              const BatchNormSaved& saved) {
#ifdef FRUGAL_WITH_CUDA
  FRUGAL_CHECK(x.device().is_cuda() && is_channels_last(x) && weight.defined() && weight.dtype() == kFloat32,
               "batch_norm_backward: ", "a cuDNN reserve space was given, but the forward's input ", x.describe(),
               " and weight ", weight.defined() ? weight.describe() : "undefined", " are not a cuDNN batch norm's");
  const int64_t C = x.size(1);
  BatchNormGrads g;
  g.x = empty_channels_last(x.sizes(), x.options());
  g.weight = empty({C}, {kFloat32, x.device()});
  g.bias = empty({C}, {kFloat32, x.device()});
  if (out.defined() && saved.residual) g.residual = empty_channels_last(x.sizes(), x.options());
  cuda::batch_norm_cudnn_backward(g.x, g.residual, g.weight, g.bias, to_channels_last(grad_out), x,
                                  out.defined() ? to_channels_last(out) : out, out.defined(), weight.contiguous(),
                                  bias.defined() ? bias.contiguous() : bias, mean, invstd, saved.reserve, saved.eps);
  if (!mask.x) g.x = Tensor();
  if (!mask.weight) g.weight = Tensor();
  if (!mask.bias) g.bias = Tensor();
  if (!mask.residual || !out.defined() || !saved.residual) g.residual = Tensor();
  return g;
#else
  (void)grad_out, (void)x, (void)out, (void)weight, (void)bias, (void)mean, (void)invstd, (void)mask, (void)saved;
  FRUGAL_FAIL("batch_norm_backward: a cuDNN reserve space was given, but frugal was built without CUDA");
#endif
}

/// Whether a backward without cuDNN's reserve space runs on x in place, channels-last
/// (Note [Channels-last batch norm]).
bool channels_last_backward_takes(const Tensor& x) {
#ifdef FRUGAL_WITH_CUDA
  return x.device().is_cuda() && x.dim() == 4 && suggests_channels_last(x);
#else
  (void)x;
  return false;
#endif
}

/// The gradients `mask` asks for: grad_x (and grad_residual when `residual`) of x's shape,
/// channels-last when `channels_last`; grad_weight, grad_bias (C) in the compute dtype. For an
/// empty x the parameter gradients are sums over nothing: zeros.
BatchNormGrads allocate_grads(const Tensor& x, int64_t C, const BatchNormGradMask& mask, bool residual,
                              bool channels_last) {
  auto like_x = [&] {
    return channels_last ? empty_channels_last(x.sizes(), x.options()) : empty(x.sizes(), x.options());
  };
  BatchNormGrads g;
  if (mask.x) g.x = like_x();
  if (residual) g.residual = like_x();
  for (auto [wanted, t] : {std::pair{mask.weight, &g.weight}, std::pair{mask.bias, &g.bias}}) {
    if (!wanted) continue;
    *t = empty({C}, {compute_dtype(x.dtype()), x.device()});
    if (x.numel() == 0) zero_(*t);
  }
  return g;
}

/// The backward on the channels-last kernels (Note [Channels-last batch norm backward] in
/// tensor/cuda/batch_norm_channels_last.cu), grads channels-last: gz = grad_out, masked by
/// ReLU's output `out` or by relu(x scale + shift) when either is given; grad_residual = gz
/// when `residual`. Inputs already checked.
BatchNormGrads channels_last_backward(const Dims& d, const Tensor& grad_out, const Tensor& x, const Tensor& out,
                                      const Tensor& scale, const Tensor& shift, const Tensor& weight,
                                      const Tensor& mean, const Tensor& invstd, bool training, BatchNormGradMask mask,
                                      bool residual) {
  BatchNormGrads g = allocate_grads(x, d.C, mask, residual, true);
  if (x.numel() == 0 || (!g.x.defined() && !g.residual.defined() && !g.weight.defined() && !g.bias.defined())) return g;
#ifdef FRUGAL_WITH_CUDA
  cuda::batch_norm_backward_channels_last_kernel(
      g.x, g.residual, g.weight, g.bias, to_channels_last(grad_out), x, out.defined() ? to_channels_last(out) : out,
      scale.defined() ? scale.contiguous() : scale, shift.defined() ? shift.contiguous() : shift, mean.contiguous(),
      invstd.contiguous(), in_compute(weight, compute_dtype(x.dtype())), training, d.N * d.HW, d.C);
  return g;
#else
  (void)grad_out, (void)out, (void)scale, (void)shift, (void)weight, (void)mean, (void)invstd, (void)training;
  FRUGAL_FAIL("batch_norm_backward: the channels-last CUDA kernels were asked for, but frugal was built without CUDA");
#endif
}

/// The own kernels' forward: bn(x), + residual when defined, then ReLU when `relu`, all in
/// one pass in the compute dtype (Note [Batch norm add ReLU]); inputs already checked.
BatchNormResult own_forward(const char* op, const Dims& d, const Tensor& x, const Tensor& residual, bool relu,
                            const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                            const Tensor& bias, bool training, double momentum, double eps) {
  const DType compute = compute_dtype(x.dtype());
  BatchNormResult r;
  r.out = empty(x.sizes(), x.options());
  if (training && x.numel() == 0) {
    // Note [Size-0 batch norm]
    // A size-0 batch in training has no statistics: the output is empty, the running
    // statistics stay as they are (PyTorch's batch norm returns early the same way), and
    // the saved mean and invstd are NaN rather than the 0 / 0 the kernel would write
    // into the running statistics too.
    r.mean = full({d.C}, std::numeric_limits<double>::quiet_NaN(), {compute, x.device()});
    r.invstd = full({d.C}, std::numeric_limits<double>::quiet_NaN(), {compute, x.device()});
  } else if (training) {
    r.mean = empty({d.C}, {compute, x.device()});
    r.invstd = empty({d.C}, {compute, x.device()});
    const RunningStats stats(running_mean, running_var, compute);
    FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_stats_kernel, r.mean, r.invstd, stats.mean, stats.var,
                           x.contiguous(), d.N, d.C, d.HW, momentum, eps);
    stats.finish(running_mean, running_var);
  } else {
    r.mean = empty({d.C}, {compute, x.device()});
    copy_into(r.mean, running_mean);
    r.invstd = rsqrt(add(running_var.to(compute), eps));
  }
  if (r.out.numel() > 0)
    FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_apply_kernel, r.out, x.contiguous(),
                           residual.defined() ? residual.contiguous() : residual, relu, r.mean, r.invstd,
                           in_compute(weight, compute), in_compute(bias, compute), d.N, d.C, d.HW);
  if (suggests_channels_last(x)) r.out = to_channels_last(r.out);  // Note [Channels-last batch norm]
  return r;
}

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                           const Tensor& bias, bool training, double momentum, double eps) {
  constexpr const char* op = "batch_norm";
  const Dims d = check_forward(op, x, running_mean, running_var, weight, bias, training, momentum, eps);
  if (cudnn_takes(x, weight, bias, training))
    if (auto r = cudnn_forward(x, Tensor(), false, running_mean, running_var, weight, bias, momentum, eps)) return *r;
  return own_forward(op, d, x, Tensor(), false, running_mean, running_var, weight, bias, training, momentum, eps);
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool training, BatchNormGradMask mask,
                                   const BatchNormSaved& saved) {
  constexpr const char* op = "batch_norm_backward";
  const Dims d = check_input(op, x);
  check_grad_out(op, grad_out, x);
  check_statistics(op, x, d.C, weight, mean, invstd);
  const DType compute = compute_dtype(x.dtype());
  mask.residual = false;
  if (saved.reserve.defined())
    return cudnn_backward(grad_out, x, Tensor(), weight, Tensor(), mean, invstd, mask, saved);
  if (channels_last_backward_takes(x))  // Note [Channels-last batch norm]
    return channels_last_backward(d, grad_out, x, Tensor(), Tensor(), Tensor(), weight, mean, invstd, training, mask,
                                  false);
  BatchNormGrads g = allocate_grads(x, d.C, mask, false, false);
  if (x.numel() == 0 || (!g.x.defined() && !g.weight.defined() && !g.bias.defined())) return g;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_backward_kernel, g.x, g.weight, g.bias, grad_out.contiguous(),
                         x.contiguous(), mean.contiguous(), invstd.contiguous(), in_compute(weight, compute), training,
                         d.N, d.C, d.HW);
  if (g.x.defined() && suggests_channels_last(x)) g.x = to_channels_last(g.x);  // Note [Channels-last batch norm]
  return g;
}

BatchNormResult batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                                    const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                                    double momentum, double eps) {
  const char* op = residual.defined() ? "batch_norm_add_relu" : "batch_norm_relu";  // the caller's name
  const Dims d = check_forward(op, x, running_mean, running_var, weight, bias, training, momentum, eps);
  if (residual.defined()) {
    FRUGAL_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype(), op, ": residual ", residual.describe(),
                 " must have the shape and dtype of the input ", x.describe());
    check_same_device(op, x, residual);
  }
  if (cudnn_takes(x, weight, bias, training))
    if (auto r = cudnn_forward(x, residual, true, running_mean, running_var, weight, bias, momentum, eps)) return *r;
  return own_forward(op, d, x, residual, true, running_mean, running_var, weight, bias, training, momentum, eps);
}

BatchNormGrads batch_norm_add_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out,
                                            const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                            const Tensor& invstd, bool training, BatchNormGradMask mask,
                                            const BatchNormSaved& saved) {
  constexpr const char* op = "batch_norm_add_relu_backward";
  const Dims d = check_input(op, x);
  for (const Tensor* t : {&grad_out, &out}) {
    FRUGAL_CHECK(t->defined() && t->sizes() == x.sizes() && t->dtype() == x.dtype(), op, ": grad_out ",
                 grad_out.defined() ? grad_out.describe() : "undefined", " and out ",
                 out.defined() ? out.describe() : "undefined", " must match the input ", x.describe());
    check_same_device(op, x, *t);
  }
  if (saved.reserve.defined()) return cudnn_backward(grad_out, x, out, weight, bias, mean, invstd, mask, saved);
  if (channels_last_backward_takes(x)) {  // ReLU's mask and grad_residual in the kernels' passes
    check_statistics(op, x, d.C, weight, mean, invstd);
    return channels_last_backward(d, grad_out, x, out, Tensor(), Tensor(), weight, mean, invstd, training, mask,
                                  mask.residual && saved.residual);
  }
  const Tensor gz = unary_backward(UnaryOp::Relu, grad_out, out);  // g (out > 0)
  BatchNormGrads g = batch_norm_backward(gz, x, weight, mean, invstd, training, mask);
  if (mask.residual && saved.residual) g.residual = gz;
  return g;
}

BatchNormGrads batch_norm_relu_backward_affine(const Tensor& grad_out, const Tensor& x, const Tensor& scale,
                                               const Tensor& shift, const Tensor& weight, const Tensor& mean,
                                               const Tensor& invstd, bool training, BatchNormGradMask mask) {
  constexpr const char* op = "batch_norm_relu_backward_affine";
  const Dims d = check_input(op, x);
  check_grad_out(op, grad_out, x);
  check_statistics(op, x, d.C, weight, mean, invstd);
  check_affine_map(op, "scale", scale, x);
  check_affine_map(op, "shift", shift, x);
  const DType compute = compute_dtype(x.dtype());
  mask.residual = false;
  if (channels_last_backward_takes(x))  // the mask recomputed in the kernels' passes
    return channels_last_backward(d, grad_out, x, Tensor(), scale, shift, weight, mean, invstd, training, mask, false);
  // gz = g where ReLU passes it: x * scale + shift formed in the compute dtype, a multiply then
  // an add (separate ops: no FMA), as the kernels form it, so the masks agree bit for bit.
  Shape channel(size_t(x.dim()), 1);
  channel[1] = d.C;
  const Tensor a = add(mul(x.to(compute), scale.reshape(channel)), shift.reshape(channel));
  const Tensor gz = masked_fill(grad_out, le(a, 0.0), 0.0);  // relu's backward: NaN passes g
  return batch_norm_backward(gz, x, weight, mean, invstd, training, mask);
}

Tensor batch_norm_apply(const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "batch_norm_apply";
  const Dims d = check_input(op, x);
  check_channel_tensor(op, "weight", weight, x, d.C);
  check_channel_tensor(op, "bias", bias, x, d.C);
  const DType compute = compute_dtype(x.dtype());
  for (const Tensor* s : {&mean, &invstd}) {
    FRUGAL_CHECK(s->defined() && s->dim() == 1 && s->size(0) == d.C && s->dtype() == compute, op,
                 ": mean and invstd must be statistics of shape [", d.C, "] and dtype ", dtype_name(compute),
                 " for input ", x.describe(), ", got ", s->defined() ? s->describe() : "undefined");
    check_same_device(op, x, *s);
  }
  if (residual.defined()) {
    FRUGAL_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype(), op, ": residual ", residual.describe(),
                 " must have the shape and dtype of the input ", x.describe());
    check_same_device(op, x, residual);
  }
  // A channels-last x is dense (N, H, W, C) memory: the kernel's (N, C, HW) with N*H*W rows
  // of C channels and HW = 1, read and written in place (no NCHW copy, unlike own_forward).
  const bool channels_last = suggests_channels_last(x);
  const Tensor xs = channels_last ? to_channels_last(x) : x.contiguous();
  const Tensor rs = !residual.defined() ? residual : channels_last ? to_channels_last(residual) : residual.contiguous();
  Tensor out = channels_last ? empty_channels_last(x.sizes(), x.options()) : empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  const int64_t rows = channels_last ? d.N * d.HW : d.N, hw = channels_last ? 1 : d.HW;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), batch_norm_apply_kernel, out, xs, rs, relu, mean.contiguous(),
                         invstd.contiguous(), in_compute(weight, compute), in_compute(bias, compute), rows, d.C, hw);
  return out;
}

}  // namespace frugal::ops
