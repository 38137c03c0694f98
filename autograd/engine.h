#pragma once
// The backward engine: runs the graph from the roots to the leaves.
#include <functional>

#include "autograd/node.h"

namespace frugal::autograd {

/// Accumulates d(roots)/d(leaf) * grad_roots into every leaf's .grad.
/// grad_roots may be empty when every root is a one-element tensor (then 1 is used).
/// Without retain_graph the saved tensors of the graph are freed as it runs.
void backward(const TensorList& roots, const TensorList& grad_roots = {}, bool retain_graph = false);

/// backward() that lets the roots' data go before the graph runs: the engine needs only
/// their edges, so a checkpoint's recomputed outputs are not held through its backward
/// (Note [Checkpoint recompute]). `roots` is emptied.
void backward_releasing_roots(TensorList&& roots, const TensorList& grad_roots);

/// Returns d(outputs)/d(inputs) * grad_outputs without touching any .grad.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false);

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
