#pragma once
// The backward engine: runs the graph from the roots to the leaves.
#include "autograd/node.h"

namespace frugal::autograd {

/// Accumulates d(roots)/d(leaf) * grad_roots into every leaf's .grad.
/// grad_roots may be empty when every root is a one-element tensor (then 1 is used).
/// Without retain_graph the saved tensors of the graph are freed as it runs.
void backward(const TensorList& roots, const TensorList& grad_roots = {}, bool retain_graph = false);

/// Returns d(outputs)/d(inputs) * grad_outputs without touching any .grad.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false);

}  // namespace frugal::autograd
