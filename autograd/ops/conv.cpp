// conv2d, forward and backward side by side.
#include "autograd/ops/conv.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
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

// out = conv2d(x, w) + bias  (Note [Convolution as GEMM])
// grad_x = conv2d_backward_input(g, w), grad_w = conv2d_backward_weight(g, x), grad_bias = sum_{N,OH,OW} g
// A channels-last forward runs its backward channels-last too (g converted if it comes
// in NCHW), and grad_w comes back in the weight's own layout (Note [Channels-last convolution]).
struct Conv2dBackward final : Node {
  SavedTensor x{this}, w{this};  // x only when w needs a gradient, w only when x does
  Shape x_shape, w_shape;
  Conv2dOptions options;
  bool has_bias = false;
  bool channels_last = false;         // the forward's layout
  bool weight_channels_last = false;  // the weight's own layout
  std::string name() const override { return "Conv2dBackward"; }
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

void record_conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Conv2dOptions& options) {
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
}

}  // namespace frugal
