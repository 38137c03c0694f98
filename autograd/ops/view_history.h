#pragma once
// The nodes of view ops remember which tensor they view, so that a view whose base was
// rewritten in place afterwards is refused instead of silently giving a stale gradient.
//
// Note [Views of a tensor written in place]
// h = x * 2; v = h.view(...); mul_(h, 3.0): v now holds 6x, but its history still reads
// "a view of 2x" (frugal does not track views, Note [In-place ops and autograd]): the write
// rebased h's history, not v's. PyTorch regenerates v's grad_fn on its next use; frugal
// refuses that use instead, naming the view and the write. A view node records its root
// base - the first tensor up its chain of views that is not itself a view op's output - and
// that tensor's grad_fn when the view was taken (a view of a view inherits both, so the
// check is one comparison however long the chain). When the view is used again (an op's
// input, a backward root, a grad() input: everything asks gradient_edge), the root base's
// grad_fn must still be the one recorded; a recorded in-place op on it (or copy_ into it)
// changed it. A leaf base cannot be written in place while autograd records, and a write
// under NoGradGuard (an optimizer step) keeps its history true, so a view of a parameter
// stays usable across steps. A view used before the write is fine: the ops that consumed it
// read the old values, which is what its history describes. The check needs the root base
// alive: once it is gone, so is any handle that could be written to rebase it.
//
// Note [Views without history]
// A view taken while its base needed no grad (buf = zeros(...); row = buf[0]), or under
// NoGradGuard, has no view node, so the check above cannot see it: after a recorded write
// to its storage (add_(buf, w), buf.copy_(x) with w, x requiring grad) it holds values with
// a history while it itself looks like a constant, and a loss that used it would silently
// miss w's gradient through it (PyTorch regenerates its grad_fn). Each storage counts its
// recorded writes (history_rewrites, bumped by rebase_history); a view stamps the count
// when the first view of its chain is taken (make_view). With grad mode on, such a view
// whose stamp is behind is refused where an op takes it (needs_grad) or a Tensor method
// derives from it: take the view after the write, or use it under NoGradGuard. A view
// with a view node is left to the check above; a detach()ed handle is not a view and
// stays a constant, as in PyTorch.
// The same stamp marks a view taken under NoGradGuard of a tensor that requires grad: with
// grad mode on it may not be written in place (a write through it would change its base
// behind the base's history, or overwrite a leaf), as PyTorch refuses it too.
#include <memory>

#include "autograd/node.h"

namespace frugal::autograd {

/// A node whose outputs are views of its one input (view ops, split). saves_tensors() is
/// false: it needs only sizes, so it may run again after a backward without retain_graph.
class ViewNode : public Node {
 public:
  bool saves_tensors() const override { return false; }
  /// Records `base` (the viewed tensor) as this view's origin, or base's own origin when
  /// base is itself a view op's output (Note [Views of a tensor written in place]).
  void set_base(const Tensor& base);

  std::weak_ptr<TensorImpl> root_base;  // the first non-view tensor up the chain
  const Node* root_fn = nullptr;        // its grad_fn then (null for a leaf); kept alive by the edges
  bool tracks_base = false;             // set_base was called (not for a copy such as to() or clone())
};

/// Throws if `t`, whose grad_fn is `fn`, is a view whose root base was modified in place
/// (its history rebased) after the view was taken (Note [Views of a tensor written in place]).
void check_view_history(const Tensor& t, const Node& fn);

// check_untracked_view (Note [Views without history]) is declared in autograd/function.h,
// which every op's make_node reaches.

}  // namespace frugal::autograd
