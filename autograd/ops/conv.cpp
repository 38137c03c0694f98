// conv2d, forward and backward side by side.
#include "autograd/ops/conv.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape_ops.h"
#include "autograd/selective_checkpoint.h"
#include "core/instrument.h"
#include "tensor/memory_format.h"
#include "tensor/ops/reduce.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

Tensor conv_input_grad(const Tensor& g, const Shape& x_shape, const Tensor& w, const Conv2dOptions& options);
Tensor conv_weight_grad(const Tensor& g, const Tensor& x, const Shape& w_shape, const Conv2dOptions& options);

/// A weight gradient in the weight's own layout: channels-last, or contiguous.
Tensor in_layout(const Tensor& grad_w, bool channels_last) {
  return channels_last ? to_channels_last(grad_w) : grad_w.contiguous();
}

/// What the backward of a convolution (conv2d, conv_transpose2d) of x and w keeps. A
/// channels-last forward runs its backward channels-last too (g converted if it comes in NCHW),
/// and grad_w comes back in the weight's own layout (Note [Channels-last convolution]).
template <typename Options>
struct ConvNode : Node {
  SavedTensor x{this}, w{this};  // x only when w needs a gradient, w only when x does
  Shape x_shape, w_shape;
  Options options;
  bool has_bias = false;
  bool channels_last = false;         // the forward's layout
  bool weight_channels_last = false;  // the weight's own layout
  /// The output's gradient in the forward's layout.
  Tensor grad_out(const TensorList& grads) const { return channels_last ? to_channels_last(grads[0]) : grads[0]; }
};

/// Records node type N for out = conv(x, weight) + bias: saves x only if the weight needs a
/// gradient and the weight only if x does.
template <typename N, typename Options>
void record_conv(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Options& options) {
  if (auto node = make_node<N>({x, weight, bias})) {
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
}

// out = conv2d(x, w) + bias  (Note [Convolution as GEMM])
// grad_x = conv2d_backward_input(g, w), grad_w = conv2d_backward_weight(g, x), grad_bias = sum_{N,OH,OW} g
struct Conv2dBackward final : ConvNode<Conv2dOptions> {
  std::string name() const override { return "Conv2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = grad_out(grads);
    TensorList out(3);
    if (wants_grad(*this, 0)) out[0] = ops::conv2d_backward_input(g, x_shape, w.unpack(name()), options);
    if (wants_grad(*this, 1)) {
      out[1] = in_layout(ops::conv2d_backward_weight(g, x.unpack(name()), w_shape, options), weight_channels_last);
    }
    if (has_bias && wants_grad(*this, 2)) out[2] = ops::sum(g, {0, 2, 3});
    return out;
  }
  // Note [Convolution double backward]
  // conv2d's two gradients are linear maps of g, each the adjoint of conv2d in one operand,
  // so their own derivatives are conv2d and each other: <conv_input_grad(g, w), G> = <g, conv2d(G, w)> and
  // <conv_weight_grad(g, x), W> = <g, conv2d(x, W)>. The three ops close under differentiation, to any order.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(3);
    if (wants_grad(*this, 0)) out[0] = conv_input_grad(g, x_shape, autograd::graph::saved_input(*this, 1, w), options);
    if (wants_grad(*this, 1)) out[1] = conv_weight_grad(g, autograd::graph::saved_input(*this, 0, x), w_shape, options);
    if (has_bias && wants_grad(*this, 2)) out[2] = frugal::sum(g, {0, 2, 3});
    return out;
  }
};

// gx = conv_input_grad(g, w) (ops::conv2d_backward_input)
// grad_g = conv2d(G, w), grad_w = conv_weight_grad(g, G), G the gradient of gx
struct ConvInputGradBackward final : Node {
  SavedTensor g{this}, w{this};
  Shape w_shape;
  Conv2dOptions options;
  std::string name() const override { return "ConvolutionBackwardInputBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& G = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = ops::conv2d(G, w.unpack(name()), Tensor(), options);
    if (wants_grad(*this, 1)) out[1] = ops::conv2d_backward_weight(g.unpack(name()), G, w_shape, options).contiguous();
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& G = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = frugal::conv2d(G, autograd::graph::saved_input(*this, 1, w), Tensor(), options);
    if (wants_grad(*this, 1)) out[1] = conv_weight_grad(autograd::graph::saved_input(*this, 0, g), G, w_shape, options);
    return out;
  }
};

// gw = conv_weight_grad(g, x) (ops::conv2d_backward_weight)
// grad_g = conv2d(x, W), grad_x = conv_input_grad(g, W), W the gradient of gw
struct ConvWeightGradBackward final : Node {
  SavedTensor g{this}, x{this};
  Shape x_shape;
  Conv2dOptions options;
  std::string name() const override { return "ConvolutionBackwardWeightBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& W = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = ops::conv2d(x.unpack(name()), W, Tensor(), options);
    if (wants_grad(*this, 1)) out[1] = ops::conv2d_backward_input(g.unpack(name()), x_shape, W, options);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& W = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = frugal::conv2d(autograd::graph::saved_input(*this, 1, x), W, Tensor(), options);
    if (wants_grad(*this, 1)) out[1] = conv_input_grad(autograd::graph::saved_input(*this, 0, g), x_shape, W, options);
    return out;
  }
};

// out = conv_transpose2d(x, w) + bias = conv2d_backward_input(x', w) + bias, x' = x with
// conv_transpose2d_input_padding's zeros (Note [Transposed convolution])
// grad_x = conv2d(g, w) cut to x's size, grad_w = conv2d_backward_weight(grad_out = x', input = g),
// grad_bias = sum_{N,OH,OW} g; laid out as Conv2dBackward's.
struct ConvTranspose2dBackward final : ConvNode<ConvTranspose2dOptions> {
  std::string name() const override { return "ConvTranspose2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = grad_out(grads);
    TensorList out(3);
    if (wants_grad(*this, 0)) out[0] = cut_to_input(ops::conv2d(g, w.unpack(name()), Tensor(), options.conv()));
    if (wants_grad(*this, 1)) {
      const Tensor xp = ops::conv_transpose2d_padded_input(x.unpack(name()), options);
      out[1] = in_layout(ops::conv2d_backward_weight(xp, g, w_shape, options.conv()), weight_channels_last);
    }
    if (has_bias && wants_grad(*this, 2)) out[2] = ops::sum(g, {0, 2, 3});
    return out;
  }
  // The two products are conv2d and conv_weight_grad, differentiable to any order (Note
  // [Convolution double backward]); the padding and the cut are a pad and a view.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Int2 extra = ops::conv_transpose2d_input_padding(options);
    TensorList out(3);
    if (wants_grad(*this, 0))
      out[0] = cut_to_input(frugal::conv2d(g, autograd::graph::saved_input(*this, 1, w), Tensor(), options.conv()));
    if (wants_grad(*this, 1)) {
      Tensor xp = autograd::graph::saved_input(*this, 0, x);
      if (extra != Int2(0)) xp = frugal::pad(xp, {0, extra.w, 0, extra.h});
      out[1] = conv_weight_grad(xp, g, w_shape, options.conv());
    }
    if (has_bias && wants_grad(*this, 2)) out[2] = frugal::sum(g, {0, 2, 3});
    return out;
  }
  /// conv2d(g, w) has the padded input's size: the rows and columns past x's are no input's.
  Tensor cut_to_input(const Tensor& gx) const {
    return gx.size(2) == x_shape[2] && gx.size(3) == x_shape[3]
               ? gx
               : gx.narrow(2, 0, x_shape[2]).narrow(3, 0, x_shape[3]).contiguous();
  }
};

/// conv2d's input gradient as a differentiable op (recorded under create_graph).
Tensor conv_input_grad(const Tensor& g, const Shape& x_shape, const Tensor& w, const Conv2dOptions& options) {
  Tensor out = autograd::raw([&] { return ops::conv2d_backward_input(g, x_shape, w, options); });
  if (auto node = make_node<ConvInputGradBackward>({g, w})) {
    node->g = g;
    node->w = w;
    node->w_shape = w.sizes();
    node->options = options;
    autograd::record(node, {out});
  }
  return out;
}

/// conv2d's weight gradient as a differentiable op (recorded under create_graph).
Tensor conv_weight_grad(const Tensor& g, const Tensor& x, const Shape& w_shape, const Conv2dOptions& options) {
  Tensor out = autograd::raw([&] { return ops::conv2d_backward_weight(g, x, w_shape, options).contiguous(); });
  if (auto node = make_node<ConvWeightGradBackward>({g, x})) {
    node->g = g;
    node->x = x;
    node->x_shape = x.sizes();
    node->options = options;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options) {
  core::OpScope scope("conv2d");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &weight, &bias}))
    return conv2d((*c)[0], (*c)[1], (*c)[2], options);
  if (x.defined() && x.dim() == 3) return conv2d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // (C, H, W)
  Tensor out =  // Note [Selective checkpoint]
      autograd::kept_or_run("conv2d", {x, weight, bias}, [&] { return ops::conv2d(x, weight, bias, options); });
  record_conv2d(out, x, weight, bias, options);
  return out;
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dOptions& options) {
  core::OpScope scope("conv_transpose2d");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &weight, &bias}))
    return conv_transpose2d((*c)[0], (*c)[1], (*c)[2], options);
  if (x.defined() && x.dim() == 3) return conv_transpose2d(x.unsqueeze(0), weight, bias, options).squeeze(0);
  Tensor out = autograd::kept_or_run("conv_transpose2d", {x, weight, bias},  // Note [Selective checkpoint]
                                     [&] { return ops::conv_transpose2d(x, weight, bias, options); });
  record_conv<ConvTranspose2dBackward>(out, x, weight, bias, options);
  return out;
}

void record_conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Conv2dOptions& options) {
  record_conv<Conv2dBackward>(out, x, weight, bias, options);
}

}  // namespace frugal
