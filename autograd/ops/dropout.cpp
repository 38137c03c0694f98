// dropout, forward and backward side by side (Note [Dropout mask from counters]).
#include "autograd/ops/dropout.h"

#include "autograd/function.h"
#include "core/instrument.h"
#include "tensor/ops/dropout.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

// out = x * mask(range) / (1 - p)
// grad_x = g * mask(range) / (1 - p): the same mask, re-created from the 16-byte range
struct DropoutBackward final : Node {
  double p = 0.0;
  Generator::Range range{0, 0};  // all that is saved: no tensor
  std::string name() const override { return "DropoutBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::dropout_with_range(grads[0], p, range)}; }
  // g times the same mask: recorded as a dropout of g with the same range, its own backward.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor out = autograd::raw([&] { return ops::dropout_with_range(g, p, range); });
    if (auto node = make_node<DropoutBackward>({g})) {
      node->p = p;
      node->range = range;
      autograd::record(node, {out});
    }
    return {out};
  }
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  core::OpScope scope("dropout");
  FRUGAL_CHECK(x.defined(), "dropout: undefined input");  // also where p == 0 or eval returns x itself
  FRUGAL_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p,
               x.defined() ? " (input " + x.describe() + ")" : std::string());
  autograd::note_mode("dropout", training && p > 0.0);
  if (!training || p == 0.0) return x;
  ops::DropoutResult r = autograd::raw([&] { return ops::dropout(x, p, gen); });
  if (auto node = make_node<DropoutBackward>({x})) {
    node->p = p;
    node->range = r.range;
    autograd::record(node, {r.out});
  }
  return r.out;
}

}  // namespace frugal
