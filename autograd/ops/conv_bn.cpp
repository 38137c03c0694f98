// conv2d_stats and bn_relu_conv2d, forward and backward side by side
// (Note [Convolution batch-norm fusion] in tensor/ops/conv_bn.h).
#include "autograd/ops/conv_bn.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "core/instrument.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/conv_bn.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// z = conv2d(a, w), a = relu(x scale + shift), scale = bn_weight invstd, shift = bn_bias - mean scale
// grad_w = conv2d_backward_weight(g, a), with a recomputed from x, scale and shift
// grad_a = conv2d_backward_input(g, w); then ReLU's mask (recomputed the same way) and batch
// norm's backward: grad_x, grad_bn_weight, grad_bn_bias = batch_norm_relu_backward_affine(grad_a, x, ...)
struct BnReluConv2dBackward final : Node {
  SavedTensor x{this}, w{this};  // w only when x or the batch norm's parameters need a gradient
  SavedTensor bn_weight{this}, mean{this}, invstd{this}, scale{this}, shift{this};  // (C), compute dtype
  Shape w_shape;
  Conv2dOptions options;
  bool training = true;
  bool channels_last = false;         // the forward's layout
  bool weight_channels_last = false;  // the convolution weight's own layout
  DType bn_weight_dtype = kFloat32, bn_bias_dtype = kFloat32;
  std::string name() const override { return "BnReluConv2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = channels_last ? to_channels_last(grads[0]) : grads[0];
    const Tensor xv = x.unpack(name()), sc = scale.unpack(name()), sh = shift.unpack(name());
    TensorList out(4);  // x, bn weight, bn bias, w
    if (wants_grad(*this, 3)) {
      const Tensor gw = ops::conv2d_backward_weight(g, ops::scale_bias_relu(xv, sc, sh), w_shape, options);
      out[3] = weight_channels_last ? to_channels_last(gw) : gw.contiguous();
    }
    const bool x_grad = wants_grad(*this, 0), weight_grad = wants_grad(*this, 1), bias_grad = wants_grad(*this, 2);
    if (x_grad || weight_grad || bias_grad) {
      const Tensor ga = ops::conv2d_backward_input(g, xv.sizes(), w.unpack(name()), options);
      const Tensor bw = bn_weight.defined() ? bn_weight.unpack(name()) : Tensor();
      ops::BatchNormGrads bg =
          ops::batch_norm_relu_backward_affine(ga, xv, sc, sh, bw, mean.unpack(name()), invstd.unpack(name()), training,
                                               {.x = x_grad, .weight = weight_grad, .bias = bias_grad});
      out[0] = bg.x;
      if (bg.weight.defined()) out[1] = bg.weight.to(bn_weight_dtype);  // the compute dtype -> the parameter's
      if (bg.bias.defined()) out[2] = bg.bias.to(bn_bias_dtype);
    }
    return out;
  }
};

void check_input(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined() && x.dim() == 4, op, ": expects an input (N, C, H, W), got ",
               x.defined() ? x.describe() : "undefined");
}

}  // namespace

ConvWithStats conv2d_stats(const Tensor& x, const Tensor& weight, const Conv2dOptions& options, bool stats) {
  core::OpScope scope("conv2d_stats");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &weight}))
    return conv2d_stats((*c)[0], (*c)[1], options, stats);
  check_input("conv2d_stats", x);
  const ops::ConvStats r = ops::conv2d_stats(x, weight, options, stats);
  record_conv2d(r.out, x, weight, Tensor(), options);
  return {r.out, r.sum, r.sq_sum, r.out.version()};
}

ConvWithStats bn_relu_conv2d(const ConvWithStats& x, const BatchNormArgs& bn, const Tensor& weight,
                             const Conv2dOptions& options, bool stats) {
  constexpr const char* op = "bn_relu_conv2d";
  core::OpScope scope(op);
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x.out, &weight})) {
    // A cast input is another tensor: its statistics are taken afresh.
    const bool same = (*c)[0].impl_ptr() == x.out.impl_ptr();
    const ConvWithStats cast{(*c)[0], same ? x.sum : Tensor(), same ? x.sq_sum : Tensor(), x.version};
    return bn_relu_conv2d(cast, bn, (*c)[1], options, stats);
  }
  check_input(op, x.out);
  note_batch_norm_mode(op, bn.training, bn.running_mean, bn.running_var);
  const Tensor& in = x.out;
  Tensor sum = x.sum, sq_sum = x.sq_sum;
  if (bn.training && (!sum.defined() || !sq_sum.defined() || x.version != in.version())) {
    const ops::ConvStats s = ops::channel_sums(in);
    sum = s.sum, sq_sum = s.sq_sum;
  }
  const int64_t count = in.size(0) * in.size(2) * in.size(3);
  // A float16 input's scale and shift are rounded to float16 on every path, as cuDNN's fused
  // prologue takes them (Note [Convolution batch-norm fusion]): forward, backward and devices agree.
  const ops::BatchNormAffine f =
      ops::batch_norm_finalize(sum, sq_sum, count, in.dtype(), running_stat_to_update(bn.running_mean, bn.training),
                               running_stat_to_update(bn.running_var, bn.training), bn.weight, bn.bias, bn.training,
                               bn.momentum, bn.eps, in.dtype() == kFloat16);
  const Tensor &scale = f.scale, &shift = f.shift;
  const ops::ConvStats r = ops::scale_bias_relu_conv2d(in, scale, shift, weight, options, stats);
  if (auto node = make_node<BnReluConv2dBackward>({in, bn.weight, bn.bias, weight})) {
    node->x = in;
    if (wants_grad(*node, 0) || wants_grad(*node, 1) || wants_grad(*node, 2)) node->w = weight;
    if (bn.weight.defined()) node->bn_weight = bn.weight.to(f.mean.dtype());
    node->mean = f.mean, node->invstd = f.invstd, node->scale = scale, node->shift = shift;
    node->w_shape = weight.sizes();
    node->options = options;
    node->training = bn.training;
    node->channels_last = suggests_channels_last(r.out);
    node->weight_channels_last = is_channels_last(weight);
    if (bn.weight.defined()) node->bn_weight_dtype = bn.weight.dtype();
    if (bn.bias.defined()) node->bn_bias_dtype = bn.bias.dtype();
    autograd::record(node, {r.out});
  }
  return {r.out, r.sum, r.sq_sum, r.out.version()};
}

}  // namespace frugal
