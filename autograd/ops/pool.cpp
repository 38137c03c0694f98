// max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and backward side by side.
#include "autograd/ops/pool.h"

#include "autograd/function.h"
#include "core/instrument.h"
#include "tensor/ops/pool.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

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
  SavedTensor x{this};
  Int2 kernel;
  MaxPool2dOptions options;
  std::string name() const override { return "MaxPool2dBackward"; }
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
  TensorList apply(TensorList&& grads) override {
    return {ops::avg_pool2d_backward(grads[0], x_shape, kernel, options)};
  }
};

// out = mean over each adaptive window; grad_x[i] = sum over the windows holding i of g / window size
struct AdaptiveAvgPool2dBackward final : Node {
  Shape x_shape;
  std::string name() const override { return "AdaptiveAvgPool2dBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::adaptive_avg_pool2d_backward(grads[0], x_shape)}; }
};

}  // namespace

Tensor max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options) {
  core::OpScope scope("max_pool2d");
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
  core::OpScope scope("avg_pool2d");
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
  core::OpScope scope("adaptive_avg_pool2d");
  Tensor out = autograd::raw([&] { return ops::adaptive_avg_pool2d(x, output_size); });
  if (auto node = make_node<AdaptiveAvgPool2dBackward>({x})) {
    node->x_shape = x.sizes();
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
