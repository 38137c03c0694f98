#pragma once
// A node whose backward is one formula of g and its saved input x, written once in the
// differentiable ops (Note [Double backward] in autograd/graph_backward.h): apply() runs it
// below autograd on the saved values, apply_graph() on x joined to its history, recorded.
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/saved_tensor.h"

namespace frugal::autograd {

class FormulaNode : public Node {
 public:
  SavedTensor x{this};

  /// x's gradient from g, x's saved value or (graph) x joined to its history.
  virtual Tensor grad_from(const Tensor& g, const Tensor& xv, bool graph) const = 0;

  TensorList apply(TensorList&& grads) final {
    const Tensor xv = x.unpack(name());
    return {raw([&] { return grad_from(grads[0], xv, false); })};
  }
  bool has_graph_backward() const final { return true; }
  TensorList apply_graph(TensorList&& grads) final {
    return {grad_from(grads[0], graph::saved_input(*this, 0, x), true)};
  }
};

}  // namespace frugal::autograd
