// softmax and log_softmax, forward and backward side by side.
#include "autograd/ops/softmax.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/ops/softmax.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

// y = softmax(x, dim):     grad_x = y (g - sum(g y, dim))
// y = log_softmax(x, dim): grad_x = g - exp(y) sum(g, dim)
// (one fused kernel each: ops::softmax_backward / ops::log_softmax_backward)
struct SoftmaxBackward final : Node {
  SavedTensor out{this};
  int64_t dim = 0;
  bool log = false;
  std::string name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor y = out.unpack(name());
    const Tensor g = in_dtype(grads[0], y.dtype());
    return {log ? ops::log_softmax_backward(g, y, dim) : ops::softmax_backward(g, y, dim)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor y = autograd::graph::saved_output(*this, 0, out);
    const Tensor g = in_dtype(grads[0], y.dtype());
    if (log) return {frugal::sub(g, frugal::mul(frugal::exp(y), frugal::sum(g, {dim}, /*keepdim=*/true)))};
    return {frugal::mul(y, frugal::sub(g, frugal::sum(frugal::mul(g, y), {dim}, /*keepdim=*/true)))};
  }
};

Tensor softmax_op(bool log, const Tensor& x, int64_t dim) {
  core::OpScope scope(log ? "log_softmax" : "softmax");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return softmax_op(log, (*c)[0], dim);
  Tensor y = autograd::raw([&] { return log ? ops::log_softmax(x, dim) : ops::softmax(x, dim); });
  if (auto node = make_node<SoftmaxBackward>({x})) {
    node->out = y;
    node->dim = dim;
    node->log = log;
    autograd::record(node, {y});
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op(false, x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op(true, x, dim); }

}  // namespace frugal
