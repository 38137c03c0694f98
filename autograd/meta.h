#pragma once
// Per-tensor autograd state, kept behind TensorImpl::autograd_meta (the tensor
// layer treats it as opaque; see Note [Tensor handle]).
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"

namespace frugal::autograd {

namespace recompute {
struct Recipe;
}  // namespace recompute

struct AutogradMeta {
  bool requires_grad = false;       // leaves: set by the user; non-leaves: true when grad_fn is set
  Tensor grad;                      // accumulated gradient (leaves, or non-leaves with retain_grad)
  std::shared_ptr<Node> grad_fn;    // the node that produced this tensor (null for leaves)
  uint32_t output_nr = 0;           // which output of grad_fn this tensor is
  std::weak_ptr<Node> accumulator;  // a leaf's AccumulateGrad, shared by every graph that uses it
  bool retains_grad = false;
  /// Run by AccumulateGrad after each accumulation into `grad` (leaves only), with an id
  /// for removal. See register_post_accumulate_grad_hook.
  std::vector<std::pair<uint64_t, std::function<void(const Tensor&)>>> post_accumulate_grad_hooks;
  /// A leaf's register_hook hooks (an op output's live on its grad_fn: Node::tensor_hooks).
  std::vector<std::pair<uint64_t, TensorHook>> tensor_hooks;
  /// How to regenerate this op output from its node's saved tensors, when it was made under a
  /// RecomputeCheapOutputs guard (Note [Recomputable outputs] in autograd/recompute_cheap.cpp).
  std::shared_ptr<const recompute::Recipe> recipe;
};

/// The meta of t, or nullptr when t has none (never required grad).
AutogradMeta* meta_of(const Tensor& t);
/// The meta of t, created if absent.
AutogradMeta& ensure_meta(const Tensor& t);

/// True when t participates in autograd (a leaf with requires_grad or an op output).
bool requires_grad(const Tensor& t);
/// The edge a gradient for t must flow into: t's grad_fn, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);
/// As torch.Tensor.register_post_accumulate_grad_hook: hook(leaf) runs during backward,
/// right after the leaf's .grad has received this backward's contribution (DDP launches a
/// bucket's all-reduce from here). `leaf` must be a leaf that requires grad. Returns an id
/// for remove_post_accumulate_grad_hook. The hook runs on the thread running backward.
uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook);
/// Removes a hook registered on `leaf` (no-op when it is gone).
void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id);
/// As torch.Tensor.register_hook: hook(grad) runs each time a backward or grad() computes
/// the gradient with respect to t, before it is used: for a leaf before it is accumulated
/// into .grad or returned by grad(), for an op's output before its node's backward (and
/// before a retain_grad .grad takes it). A defined result, of grad's shape, replaces the
/// gradient (converted to its dtype); an undefined one leaves it. Hooks run in the order
/// they were registered; a hook on an op's output stays with the node that made it, so a
/// later in-place write to t does not move it. Returns an id for remove_hook.
uint64_t register_hook(const Tensor& t, TensorHook hook);
/// Removes a hook register_hook returned (no-op when it is gone already).
void remove_hook(const Tensor& t, uint64_t id);
/// Makes t an output of `fn` (output number nr).
void set_history(const Tensor& t, const std::shared_ptr<Node>& fn, uint32_t nr);

}  // namespace frugal::autograd
