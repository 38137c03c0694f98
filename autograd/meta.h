#pragma once
// Per-tensor autograd state, kept behind TensorImpl::autograd_meta (the tensor
// layer treats it as opaque; see Note [Tensor handle]).
#include <memory>

#include "autograd/node.h"

namespace frugal::autograd {

struct AutogradMeta {
  bool requires_grad = false;       // leaves: set by the user; non-leaves: true when grad_fn is set
  Tensor grad;                      // accumulated gradient (leaves, or non-leaves with retain_grad)
  std::shared_ptr<Node> grad_fn;    // the node that produced this tensor (null for leaves)
  uint32_t output_nr = 0;           // which output of grad_fn this tensor is
  std::weak_ptr<Node> accumulator;  // a leaf's AccumulateGrad, shared by every graph that uses it
  bool retains_grad = false;
};

/// The meta of t, or nullptr when t has none (never required grad).
AutogradMeta* meta_of(const Tensor& t);
/// The meta of t, created if absent.
AutogradMeta& ensure_meta(const Tensor& t);

/// True when t participates in autograd (a leaf with requires_grad or an op output).
bool requires_grad(const Tensor& t);
/// The edge a gradient for t must flow into: t's grad_fn, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);
/// Makes t an output of `fn` (output number nr).
void set_history(const Tensor& t, const std::shared_ptr<Node>& fn, uint32_t nr);

}  // namespace frugal::autograd
