#pragma once
// The backward engine: runs the graph from the roots to the leaves.
#include <functional>

#include "autograd/node.h"

namespace frugal::autograd {

/// Accumulates d(roots)/d(leaf) * grad_roots into every leaf's .grad.
/// grad_roots may be empty when every root is a one-element tensor (then 1 is used).
/// Without retain_graph the saved tensors of the graph are freed as it runs.
void backward(const TensorList& roots, const TensorList& grad_roots = {}, bool retain_graph = false);

/// backward()'s flags with create_graph (PyTorch's loss.backward(create_graph=True)): .grad
/// gets the gradients with their history (Note [Double backward] in autograd/graph_backward.h),
/// so a loss built from them can be differentiated again; every node on the way must have a
/// differentiable backward. grad() with create_graph is usually what is wanted: it touches no .grad.
struct BackwardOptions {
  bool retain_graph = false;  // create_graph implies it
  bool create_graph = false;
};
void backward(const TensorList& roots, const TensorList& grad_roots, const BackwardOptions& options);

/// Returns d(outputs)/d(inputs) * grad_outputs without touching any .grad (leaves' and
/// retained ones alike): only the nodes on a path to an input run (Note [Gradients
/// without .grad]). An input the outputs do not depend on throws, unless allow_unused:
/// then its entry is an undefined tensor (PyTorch's None).
/// The gradients returned have no history; for ones that do, see GradOptions.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = false);

/// grad()'s flags, as PyTorch's torch.autograd.grad keywords:
///   auto [gx] = grad({y}, {x}, {}, {.create_graph = true});  // gx has history
struct GradOptions {
  bool retain_graph = false;  // keep the graph's saved tensors for another backward (create_graph implies it)
  /// Record the backward itself, so the gradients returned can be differentiated again (a
  /// gradient penalty, second derivatives, a Hessian-vector product). Every node on the way
  /// must have a differentiable backward, or grad() throws naming those that have none
  /// (Note [Double backward] in autograd/graph_backward.h).
  bool create_graph = false;
  bool allow_unused = false;  // an input no gradient reaches gets an undefined tensor instead of an error
};
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                const GradOptions& options);

/// For a node whose apply runs a nested backward over a graph of its own (a checkpoint's
/// replay, Node::runs_nested_backward): the gradients of `roots` w.r.t. `leaves` (undefined
/// where none arrives). Inside a backward() run the nested run accumulates into .grad as
/// backward() does (the leaves' .grad included, read back); inside a grad() run it touches
/// no .grad and hands the outer run's requested inputs their share. `roots` is emptied
/// before the run, so their data can go (Note [Checkpoint recompute]).
TensorList nested_gradients(TensorList&& roots, const TensorList& grad_roots, const TensorList& leaves);

/// Which engine run a queued callback belongs to (Note [Backward callbacks] in engine.cpp).
enum class CallbackRun {
  Current,    // the innermost run executing on this thread (a checkpoint recompute's own run)
  Outermost,  // the run the user started (its backward() returns after the callback)
};

/// Callable only from inside a backward (a hook or a node's apply): runs `callback` once the
/// chosen engine run has finished all its nodes, before that backward()/grad() returns, in
/// FIFO order with the run's other callbacks (as PyTorch's Engine::queue_callback). A throwing
/// callback propagates out of backward and the run's remaining callbacks are dropped.
void queue_callback(std::function<void()> callback, CallbackRun run = CallbackRun::Current);

/// True while an engine run executes on this thread (inside a hook, a node's apply or a callback).
bool in_backward();

}  // namespace frugal::autograd
