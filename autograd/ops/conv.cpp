// conv2d, the pools and batch_norm, forward and backward side by side.
#include "autograd/ops/conv.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "memory/op_context.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/reduce.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = conv2d(x, w) + bias  (Note [Convolution as GEMM])
// grad_x = conv2d_backward_input(g, w), grad_w = conv2d_backward_weight(g, x), grad_bias = sum_{N,OH,OW} g
// A channels-last forward runs its backward channels-last too (g converted if it comes
// in NCHW), and grad_w comes back in the weight's own layout (Note [Channels-last convolution]).
struct Conv2dBackward final : Node {
  SavedTensor x, w;  // x only when w needs a gradient, w only when x does
  Shape x_shape, w_shape;
  Conv2dOptions options;
  bool has_bias = false;
  bool channels_last = false;         // the forward's layout
  bool weight_channels_last = false;  // the weight's own layout
  std::string name() const override { return "Conv2dBackward"; }
  void release_saved() override { x.reset(), w.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = channels_last ? to_channels_last(grads[0]) : grads[0];
    TensorList out(3);
    if (wants_grad(*this, 0)) out[0] = ops::conv2d_backward_input(g, x_shape, w.unpack(name()), options);
    if (wants_grad(*this, 1)) {
      const Tensor gw = ops::conv2d_backward_weight(g, x.unpack(name()), w_shape, options);
      out[1] = weight_channels_last ? to_channels_last(gw) : gw.contiguous();
    }
    if (has_bias && wants_grad(*this, 2)) out[2] = ops::sum(g, {0, 2, 3});
    return out;
  }
};

// out[p, oh, ow] = x[p, argmax[p, oh, ow]], argmax recomputed from x in backward
// (Note [Max-pool backward from the input])
// grad_x[p, i] = sum of g[p, oh, ow] over the outputs whose argmax is i
//
// Note [Max-pool backward from the input]
// The node saves the pool's input x, not the forward's argmax indices, and recomputes
// the indices in backward by pooling x again (as TensorFlow's MaxPoolGrad and JAX's
// select_and_scatter work from the input). In a CNN x is a ReLU's (or a fused batch
// norm + ReLU's) output, which that op keeps for its own backward anyway: saving it
// again costs no bytes, while int64 indices cost 8 bytes per output element (196 MiB
// at ResNet-50's stem at batch 128, more than the pooled float16 output itself).
// The trade-off: the backward runs the forward pool once more and holds its output and
// indices transiently; and saving x costs more than the indices only when no other op
// keeps x and x has more than 8 bytes per output element: a float32 input at stride 2
// (16 bytes against 8; float16 is even), or a stride above 2. The version check on x
// catches an in-place write to the pool's input before backward.
struct MaxPool2dBackward final : Node {
  SavedTensor x;
  Int2 kernel;
  MaxPool2dOptions options;
  std::string name() const override { return "MaxPool2dBackward"; }
  void release_saved() override { x.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor input = x.unpack(name());
    const Tensor indices = ops::max_pool2d(input, kernel, options).indices;
    return {ops::max_pool2d_backward(grads[0], indices, input.sizes(), kernel, options)};
  }
};

// out = mean over each window (divisor per Note [Pooling windows])
// grad_x[i] = sum over the windows holding i of g / divisor
struct AvgPool2dBackward final : Node {
  Shape x_shape;
  Int2 kernel;
  AvgPool2dOptions options;
  std::string name() const override { return "AvgPool2dBackward"; }
  void release_saved() override {}
  TensorList apply(TensorList&& grads) override {
    return {ops::avg_pool2d_backward(grads[0], x_shape, kernel, options)};
  }
};

// out = mean over each adaptive window; grad_x[i] = sum over the windows holding i of g / window size
struct AdaptiveAvgPool2dBackward final : Node {
  Shape x_shape;
  std::string name() const override { return "AdaptiveAvgPool2dBackward"; }
  void release_saved() override {}
  TensorList apply(TensorList&& grads) override { return {ops::adaptive_avg_pool2d_backward(grads[0], x_shape)}; }
};

// out = (x - mean) * invstd * weight + bias  (Note [Batch norm statistics])
// grad_x = weight * invstd * (g - mean_M(g) - xhat * mean_M(g * xhat))  (training; eval: weight * invstd * g)
// grad_weight = sum_M(g * xhat), grad_bias = sum_M(g)
struct BatchNormBackward final : Node {
  SavedTensor x, weight, mean, invstd;  // mean, invstd: (C) in the compute dtype
  ops::BatchNormSaved saved;            // cuDNN's reserve space (Note [Channels-last batch norm]) and eps
  bool training = false;
  DType weight_dtype = kFloat32, bias_dtype = kFloat32;
  std::string name() const override { return "BatchNormBackward"; }
  void release_saved() override { x.reset(), weight.reset(), mean.reset(), invstd.reset(), saved.reserve = Tensor(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    ops::BatchNormGrads g = ops::batch_norm_backward(
        grads[0], x.unpack(name()), wv, mean.unpack(name()), invstd.unpack(name()), training,
        {.x = wants_grad(*this, 0), .weight = wants_grad(*this, 1), .bias = wants_grad(*this, 2)}, saved);
    if (g.weight.defined()) g.weight = g.weight.to(weight_dtype);  // the compute dtype -> the parameter's
    if (g.bias.defined()) g.bias = g.bias.to(bias_dtype);
    return {g.x, g.weight, g.bias};
  }
};

// out = relu(batch_norm(x) + residual), or relu(batch_norm(x))  (Note [Batch norm add ReLU])
// gz = g (out > 0), grad_residual = gz, grad_x/weight/bias = BatchNormBackward's formulas on gz
struct BatchNormAddReluBackward final : Node {
  SavedTensor x, out, weight, bias, mean, invstd;  // out for ReLU's mask; bias for cuDNN's fused backward
  ops::BatchNormSaved saved;
  bool training = false;
  DType weight_dtype = kFloat32, bias_dtype = kFloat32;
  std::string name() const override { return "BatchNormAddReluBackward"; }
  void release_saved() override {
    x.reset(), out.reset(), weight.reset(), bias.reset(), mean.reset(), invstd.reset(), saved.reserve = Tensor();
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const Tensor bv = bias.defined() ? bias.unpack(name()) : Tensor();
    ops::BatchNormGrads g = ops::batch_norm_add_relu_backward(grads[0], x.unpack(name()), out.unpack(name()), wv, bv,
                                                              mean.unpack(name()), invstd.unpack(name()), training,
                                                              {.x = wants_grad(*this, 0),
                                                               .weight = wants_grad(*this, 2),
                                                               .bias = wants_grad(*this, 3),
                                                               .residual = wants_grad(*this, 1)},
                                                              saved);
    if (g.weight.defined()) g.weight = g.weight.to(weight_dtype);
    if (g.bias.defined()) g.bias = g.bias.to(bias_dtype);
    return {g.x, g.residual, g.weight, g.bias};
  }
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options) {
  memory::OpScope scope("conv2d");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &weight, &bias}))
    return conv2d((*c)[0], (*c)[1], (*c)[2], options);
  if (x.defined() && x.dim() == 3) return conv2d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // (C, H, W)
  Tensor out = autograd::raw([&] { return ops::conv2d(x, weight, bias, options); });
  if (auto node = make_node<Conv2dBackward>({x, weight, bias})) {
    if (wants_grad(*node, 1)) node->x = x;
    if (wants_grad(*node, 0)) node->w = weight;
    node->x_shape = x.sizes();
    node->w_shape = weight.sizes();
    node->options = options;
    node->has_bias = bias.defined();
    node->channels_last = suggests_channels_last(out);
    node->weight_channels_last = is_channels_last(weight);
    autograd::record(node, {out});
  }
  return out;
}

Tensor max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options) {
  memory::OpScope scope("max_pool2d");
  ops::MaxPool2dResult r = autograd::raw([&] { return ops::max_pool2d(x, kernel, options); });
  if (auto node = make_node<MaxPool2dBackward>({x})) {
    node->x = x;  // not r.indices (Note [Max-pool backward from the input])
    node->kernel = kernel;
    node->options = options;
    autograd::record(node, {r.out});
  }
  return r.out;
}

Tensor avg_pool2d(const Tensor& x, Int2 kernel, const AvgPool2dOptions& options) {
  memory::OpScope scope("avg_pool2d");
  Tensor out = autograd::raw([&] { return ops::avg_pool2d(x, kernel, options); });
  if (auto node = make_node<AvgPool2dBackward>({x})) {
    node->x_shape = x.sizes();
    node->kernel = kernel;
    node->options = options;
    autograd::record(node, {out});
  }
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  memory::OpScope scope("adaptive_avg_pool2d");
  Tensor out = autograd::raw([&] { return ops::adaptive_avg_pool2d(x, output_size); });
  if (auto node = make_node<AdaptiveAvgPool2dBackward>({x})) {
    node->x_shape = x.sizes();
    autograd::record(node, {out});
  }
  return out;
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  memory::OpScope scope("batch_norm");  // keeps a low-precision input (Note [Autocast])
  ops::BatchNormResult r = autograd::raw(
      [&] { return ops::batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps); });
  if (auto node = make_node<BatchNormBackward>({x, weight, bias})) {
    node->x = x;
    if (weight.defined()) {
      node->weight = weight;
      node->weight_dtype = weight.dtype();
    }
    if (bias.defined()) node->bias_dtype = bias.dtype();
    node->mean = r.mean;
    node->invstd = r.invstd;
    node->saved = {r.reserve, eps};
    node->training = training;
    autograd::record(node, {r.out});
  }
  return r.out;
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps) {
  FRUGAL_CHECK(residual.defined(), "batch_norm_add_relu: residual is undefined (batch_norm_relu takes none)");
  return batch_norm_relu(x, running_mean, running_var, weight, bias, training, momentum, eps, residual);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, const Tensor& residual) {
  // Keeps low-precision inputs, as batch_norm (Note [Autocast]).
  memory::OpScope scope(residual.defined() ? "batch_norm_add_relu" : "batch_norm_relu");
  ops::BatchNormResult r = autograd::raw([&] {
    return ops::batch_norm_add_relu(x, residual, running_mean, running_var, weight, bias, training, momentum, eps);
  });
  if (auto node = make_node<BatchNormAddReluBackward>({x, residual, weight, bias})) {
    node->x = x;
    node->out = r.out;
    if (weight.defined()) {
      node->weight = weight;
      node->weight_dtype = weight.dtype();
    }
    if (bias.defined()) {
      if (r.reserve.defined()) node->bias = bias;  // only cuDNN's fused backward reads it
      node->bias_dtype = bias.dtype();
    }
    node->mean = r.mean;
    node->invstd = r.invstd;
    node->saved = {r.reserve, eps, residual.defined()};
    node->training = training;
    autograd::record(node, {r.out});
  }
  return r.out;
}

}  // namespace frugal
