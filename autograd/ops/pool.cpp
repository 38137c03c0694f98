// max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and backward side by side.
#include "autograd/ops/pool.h"

#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/index.h"
#include "core/instrument.h"
#include "tensor/memory_format.h"
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
// The trade-off: the backward reads x once more to find the argmax: at ResNet-50's stem
// at batch 128 that is 205 MB more to read (about 50 us at an H200's bandwidth), in the
// one CUDA kernel that also writes grad_x and keeps the argmax in shared memory (Note
// [Fused max-pool backward] in tensor/cuda/pool.cu), while saving the one-byte argmax
// instead would keep 25.7 MB through the whole step that saving x does not. Saving x
// costs more than indices only when no other op keeps x. The forward computes no
// indices at all. The version check on x catches an in-place write to the pool's input
// before backward.
struct MaxPool2dBackward final : Node {
  SavedTensor x{this};
  Int2 kernel;
  MaxPool2dOptions options;
  std::string name() const override { return "MaxPool2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::max_pool2d_backward_from_input(grads[0], x.unpack(name()), kernel, options)};
  }
  // g scattered to the argmax: linear in g (its adjoint gathers at the argmax), constant in x.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor xv = x.unpack(name());
    const Tensor gx = autograd::raw([&] { return ops::max_pool2d_backward_from_input(g, xv, kernel, options); });
    const Tensor argmax = autograd::raw([&] { return ops::max_pool2d(xv, kernel, options).indices; });
    const Shape out_sizes = g.sizes();
    auto gather_at_argmax = [argmax, out_sizes](const Tensor& G) {  // G of x's shape -> out's
      const int64_t planes_dims = G.dim() - 2;
      Shape flat(G.sizes().begin(), G.sizes().begin() + planes_dims), idx_flat = flat;
      flat.push_back(G.size(-2) * G.size(-1));
      idx_flat.push_back(argmax.size(-2) * argmax.size(-1));
      return frugal::gather(G.reshape(flat), planes_dims, argmax.reshape(idx_flat)).reshape(out_sizes);
    };
    const Tensor recorded = autograd::graph::linear_map(gx, g, gather_at_argmax, "MaxPool2dBackwardBackward");
    return {autograd::graph::with_zero_derivative(recorded, *this, 0)};
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
  bool has_graph_backward() const override { return true; }  // linear in g, avg_pool2d its adjoint
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor gx = autograd::raw([&] { return ops::avg_pool2d_backward(g, x_shape, kernel, options); });
    auto pool = [kernel = kernel, options = options](const Tensor& G) { return frugal::avg_pool2d(G, kernel, options); };
    return {autograd::graph::linear_map(gx, g, pool, "AvgPool2dBackwardBackward")};
  }
};

// out = mean over each adaptive window; grad_x[i] = sum over the windows holding i of g / window size
//
// Note [Channels-last global pool backward]
// The raw backward takes grad_x's layout from grad_out's, but global pooling's grad_out
// (N, C, 1, 1) is contiguous and channels-last at once, so it decides nothing (Note
// [Channels-last layout] in tensor/memory_format.h): a channels-last x would get an NCHW
// gradient, which ResNet's last batch norm backward (cuDNN, NHWC) copies back, 25 MB each
// way at batch 128. So the node keeps x's layout, and for a channels-last x asks for the
// same numbers in its memory: that memory is the array (N, H W, C), and its gradient,
// g[n, c] / (H W) in every row, is the backward of pooling each (H W, C) plane of the 3-D
// (N, H W, C) to (1, C) (a window of all rows and one column, so the same division,
// rounded once). The CUDA kernels read that as rows of C channels, 16 bytes at a time.
struct AdaptiveAvgPool2dBackward final : Node {
  Shape x_shape;
  bool channels_last = false;  // x suggested channels-last
  std::string name() const override { return "AdaptiveAvgPool2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (channels_last && g.size(-2) == 1 && g.size(-1) == 1) {  // Note [Channels-last global pool backward]
      const int64_t N = x_shape[0], C = x_shape[1], H = x_shape[2], W = x_shape[3];
      const Tensor rows = ops::adaptive_avg_pool2d_backward(g.reshape({N, 1, C}), {N, H * W, C});
      return {rows.view({N, H, W, C}).permute({0, 3, 1, 2})};
    }
    return {ops::adaptive_avg_pool2d_backward(g, x_shape)};
  }
  bool has_graph_backward() const override { return true; }  // linear in g, the pool its adjoint
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor gx = autograd::raw([&] { return ops::adaptive_avg_pool2d_backward(g, x_shape); });
    const Int2 out_size{g.size(-2), g.size(-1)};
    auto pool = [out_size](const Tensor& G) { return frugal::adaptive_avg_pool2d(G, out_size); };
    return {autograd::graph::linear_map(gx, g, pool, "AdaptiveAvgPool2dBackwardBackward")};
  }
};

}  // namespace

Tensor max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options) {
  core::OpScope scope("max_pool2d");
  Tensor out = autograd::raw([&] { return ops::max_pool2d_values(x, kernel, options); });
  if (auto node = make_node<MaxPool2dBackward>({x})) {
    node->x = x;  // not indices (Note [Max-pool backward from the input])
    node->kernel = kernel;
    node->options = options;
    autograd::record(node, {out});
  }
  return out;
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
    node->channels_last = suggests_channels_last(x);
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
