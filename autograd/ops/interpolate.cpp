// interpolate, forward and backward side by side.
#include "autograd/ops/interpolate.h"

#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "core/instrument.h"
#include "tensor/ops/interpolate.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

// out[p, oh, ow] = sum over the taps (ih, iw) of output (oh, ow) of w * x[p, ih, iw]
// grad_x[p, ih, iw] = sum over the outputs with tap (ih, iw) of w * g[p, oh, ow]
// (the nearest modes: one tap of weight 1; 'area' pools; Note [Interpolation source indices])
struct InterpolateBackward final : Node {
  Shape x_shape;
  InterpolateOptions options;
  std::string name() const override { return "InterpolateBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::interpolate_backward(grads[0], x_shape, options)}; }
  bool has_graph_backward() const override { return true; }  // linear in g, interpolate its adjoint
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor gx = autograd::raw([&] { return ops::interpolate_backward(g, x_shape, options); });
    auto resample = [options = options](const Tensor& G) { return frugal::interpolate(G, options); };
    return {autograd::graph::linear_map(gx, g, resample, "InterpolateBackwardBackward")};
  }
};

}  // namespace

Tensor interpolate(const Tensor& x, const InterpolateOptions& options) {
  core::OpScope scope("interpolate");
  Tensor out = autograd::raw([&] { return ops::interpolate(x, options); });
  if (auto node = make_node<InterpolateBackward>({x})) {
    node->x_shape = x.sizes();
    node->options = options;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
