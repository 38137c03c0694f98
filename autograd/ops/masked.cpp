// masked_select, forward and backward side by side; nonzero forwarded below autograd.
#include "autograd/ops/masked.h"

#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "core/instrument.h"
#include "tensor/ops/masked.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

// out = x[mask] (x, mask broadcast to `shape`)
// grad_x = sum_to(masked_scatter(zeros(shape), mask, g), x's shape)
struct MaskedSelectBackward final : Node {
  SavedTensor mask{this};
  Shape shape, x_sizes;  // the broadcast shape, x's own
  DType x_dtype = kFloat32;
  std::string name() const override { return "MaskedSelectBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor full = ops::masked_select_backward(grads[0], mask.unpack(name()), shape);
    return {in_dtype(autograd::sum_to(full, x_sizes), x_dtype)};
  }
  bool has_graph_backward() const override { return true; }  // linear in g, masked_select its adjoint
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor m = mask.unpack(name());
    const Tensor full = autograd::raw([&] { return ops::masked_select_backward(g, m, shape); });
    auto select = [m](const Tensor& G) { return frugal::masked_select(G, m); };
    const Tensor recorded = autograd::graph::linear_map(full, g, select, "MaskedSelectBackwardBackward");
    return {in_dtype(autograd::graph::sum_to(recorded, x_sizes), x_dtype)};
  }
};

}  // namespace

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  core::OpScope scope("masked_select");
  Tensor out = autograd::raw([&] { return ops::masked_select(x, mask); });
  if (auto node = make_node<MaskedSelectBackward>({x})) {
    node->mask = mask;
    node->shape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_select");
    node->x_sizes = x.sizes();
    node->x_dtype = x.dtype();
    autograd::record(node, {out});
  }
  return out;
}

Tensor nonzero(const Tensor& x) {
  core::OpScope scope("nonzero");
  return autograd::raw([&] { return ops::nonzero(x); });
}

}  // namespace frugal
