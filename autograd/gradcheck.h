#pragma once
// Finite-difference gradient checking in float64 (as torch.autograd.gradcheck).
#include <functional>
#include <string>

#include "autograd/node.h"

namespace frugal::autograd {

struct GradcheckOptions {
  double eps = 1e-6;  // central-difference step
  double atol = 1e-7;
  double rtol = 1e-5;
  uint64_t seed = 0;  // for the random projection of the outputs
};

struct GradcheckResult {
  bool ok = true;
  std::string report;  // a table of the worst mismatches when !ok
};

/// Checks backward of `f` against central differences at `inputs` (float64 CPU
/// tensors; those with requires_grad are checked). f may return any shape: its
/// output is projected on a fixed random vector v, and the check compares
/// v^T J from one backward with (v^T f(x + eps e_i) - v^T f(x - eps e_i)) / 2 eps
/// for every input element i.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          const GradcheckOptions& options = {});

/// Checks the double backward of `f` (as torch.autograd.gradgradcheck): gradcheck of the
/// function (inputs, u) -> grad(f(inputs), inputs, u) taken with create_graph, u a fixed
/// random float64 gradient for f's output. It compares the backward of f's backward
/// (Note [Double backward] in autograd/graph_backward.h), with respect to the inputs and
/// to u, with central differences of first-order gradients.
GradcheckResult gradgradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                              const GradcheckOptions& options = {});

}  // namespace frugal::autograd
