#pragma once
// Helpers every differentiable op uses to record itself (see Note [Backward graph]):
//
//   Tensor out = raw([&] { return ops::mul(a, b); }); // the raw op, below autograd
//   if (auto node = make_node<MulBackward>({a, b})) {
//     node->a = a; node->b = b;                     // SavedTensors
//     record(node, {out});
//   }
//   return out;
#include <initializer_list>
#include <memory>

#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/saved_tensor.h"

namespace frugal::autograd {

/// Runs a raw op "below autograd": the views and copies it makes of its inputs
/// internally are not recorded (see Note [Derived tensors]); only the wrapper's
/// own node is.
template <typename F>
auto raw(F&& f) {
  NoGradGuard below;
  return f();
}

/// True when grad mode is on and some input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const TensorList& inputs);

/// With grad mode on, throws if `t` is a view without a view node whose storage had a
/// recorded in-place write after the view was taken (Note [Views without history] in
/// autograd/ops/view_history.h; defined in autograd/ops/view.cpp). Inline: most inputs
/// are not views.
void check_stale_view(const char* op, const Tensor& t);
inline void check_untracked_view(const char* op, const Tensor& t) {
  if (t.impl().is_view) check_stale_view(op, t);
}

/// Ops whose values depend on a mode flag (batch norm's and dropout's `training`, attention's
/// dropout) call this with the flag: a checkpoint's forward notes it, and its replay refuses
/// to run the op under another (Note [What a replay must find unchanged] in
/// autograd/checkpoint.cpp).
void note_mode(const char* op, bool flag);

namespace detail {
/// Under a checkpoint's forward: notes that an op read `x` (defined in autograd/checkpoint.cpp).
void note_checkpoint_read(const Tensor& x);

/// With grad mode off under a GradUseProbe: notes every input a checkpoint's replay will read
/// again, and whether one requires grad.
template <typename Inputs>
void probe_inputs(const Inputs& inputs) {
  for (const Tensor& x : inputs) {
    if (!x.defined()) continue;
    note_checkpoint_read(x);
    if (requires_grad(x)) note_grad_use();
  }
}

template <typename N, typename Inputs>
std::shared_ptr<N> make_node_from(const Inputs& inputs) {
  if (!is_grad_enabled()) {
    if (probing_grad_use()) probe_inputs(inputs);
    return nullptr;
  }
  bool any = false;
  for (const Tensor& x : inputs) {
    if (x.defined()) check_untracked_view("an operation", x);  // every input, not up to the first
    any = any || requires_grad(x);
  }
  if (!any) return nullptr;
  auto node = std::make_shared<N>();
  node->next_edges.reserve(inputs.size());
  for (const Tensor& x : inputs) node->next_edges.push_back(x.defined() ? gradient_edge(x) : Edge{});
  return node;
}
}  // namespace detail

/// A new N wired to the inputs' gradient edges, or nullptr when nothing needs grad
/// (then the op records nothing and costs nothing).
template <typename N>
std::shared_ptr<N> make_node(const TensorList& inputs) {
  return detail::make_node_from<N>(inputs);
}
/// The same for make_node<N>({a, b}): the braced list stays on the stack, where a
/// TensorList would be a heap allocation on every op.
template <typename N>
std::shared_ptr<N> make_node(std::initializer_list<Tensor> inputs) {
  return detail::make_node_from<N>(inputs);
}

/// Makes `outputs` the outputs of `node` (their grad_fn) and records their metadata.
void record(const std::shared_ptr<Node>& node, const TensorList& outputs);

/// The dims of `sizes` that broadcasting `shape` to it added or stretched.
std::vector<int64_t> stretched_dims(const Shape& sizes, const Shape& shape);
/// Sums `grad` over the dims that broadcasting added or stretched, so it has `shape`
/// (the backward of every broadcasting op).
Tensor sum_to(const Tensor& grad, const Shape& shape);

/// `g` in `dtype`, itself when it already is: a gradient goes back in its input's dtype.
inline Tensor in_dtype(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

/// True when input i of node needs a gradient (skip computing it otherwise).
inline bool wants_grad(const Node& node, size_t i) { return i < node.next_edges.size() && node.next_edges[i].valid(); }

}  // namespace frugal::autograd
