#pragma once
// torch.autograd.functional: vjp, hvp, jacobian and hessian of a function of tensors, built on
// grad() (with create_graph for the second derivatives: Note [Double backward] in
// autograd/graph_backward.h). As PyTorch's, each takes detached copies of the inputs that
// require grad, so the caller's tensors and their graphs are untouched, and returns detached
// results.
//
//   Tensor H = autograd::functional::hessian([](const Tensor& w) { return loss(w); }, w);
#include <functional>

#include "autograd/node.h"

namespace frugal::autograd::functional {

using Function = std::function<Tensor(const TensorList&)>;

struct VjpResult {
  Tensor output;  // f(inputs)
  TensorList vjp;  // v^T J per input: the gradient of <f(inputs), v> (zeros for an input f does not use)
};
/// f(inputs) and v^T J. v has f's output shape; it may be left undefined for a one-element output.
VjpResult vjp(const Function& f, const TensorList& inputs, const Tensor& v = Tensor());

struct HvpResult {
  Tensor output;  // f(inputs), one element
  TensorList hvp;  // H v per input, H the Hessian of f in every input together
};
/// f(inputs), a one-element tensor, and the Hessian-vector product H v (v: one per input).
HvpResult hvp(const Function& f, const TensorList& inputs, const TensorList& v);

/// The Jacobian of f at x, of shape f(x).sizes() + x.sizes(): one backward per output element.
Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);
/// The Hessian of a one-element f at x, of shape x.sizes() + x.sizes(): the Jacobian of its
/// gradient, taken with create_graph.
Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);

}  // namespace frugal::autograd::functional
