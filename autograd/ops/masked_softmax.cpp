// masked_softmax, forward and backward side by side (Note [Masked softmax]).
#include "autograd/ops/masked_softmax.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "core/instrument.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/softmax.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// y = softmax(scale * scores + mask), dz = softmax_backward(g, y) = y * (g - sum(g * y))
// grad_scores = scale * dz, grad_mask = sum_to(dz, mask) (a float mask; a bool mask has none)
struct MaskedSoftmaxBackward final : Node {
  SavedTensor out{this};  // y only: the softmax gradient needs nothing else (Note [Masked softmax])
  double scale = 1.0;
  Shape mask_sizes;
  std::string name() const override { return "MaskedSoftmaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor dz = ops::softmax_backward(grads[0], out.unpack(name()), -1);
    TensorList result(2);
    if (wants_grad(*this, 0)) result[0] = scale == 1.0 ? dz : ops::mul(dz, scale);
    if (wants_grad(*this, 1)) result[1] = autograd::sum_to(dz, mask_sizes);
    return result;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor y = autograd::graph::saved_output(*this, 0, out);
    const Tensor& g = grads[0];
    const Tensor dz = frugal::mul(y, frugal::sub(g, frugal::sum(frugal::mul(g, y), {-1}, /*keepdim=*/true)));
    TensorList result(2);
    if (wants_grad(*this, 0)) result[0] = scale == 1.0 ? dz : frugal::mul(dz, scale);
    if (wants_grad(*this, 1)) result[1] = autograd::graph::sum_to(dz, mask_sizes);
    return result;
  }
};

}  // namespace

Tensor masked_softmax(const Tensor& scores, const Tensor& mask, bool is_causal, double scale) {
  core::OpScope scope("masked_softmax");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&scores, &mask}))
    return masked_softmax((*c)[0], (*c)[1], is_causal, scale);
  Tensor out = autograd::raw([&] { return ops::masked_softmax(scores, mask, is_causal, scale); });
  if (auto node = make_node<MaskedSoftmaxBackward>({scores, mask})) {
    node->out = out;
    node->scale = scale;
    if (mask.defined()) node->mask_sizes = mask.sizes();
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
