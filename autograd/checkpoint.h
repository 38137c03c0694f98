#pragma once
// Recompute checkpointing: trade compute for activation memory
// (see Note [Checkpoint recompute] in autograd/checkpoint.cpp).
//
//   // Activations inside `block` are not kept; they are recomputed in backward.
//   Tensor y = autograd::checkpoint([&](const Tensor& h) { return block->forward(h); }, x);
//
// nn/checkpoint.h builds checkpoint_sequential on top of this.
#include <functional>

#include "autograd/node.h"

namespace frugal::autograd {

/// Runs fn(inputs) without recording a graph (no activations are saved) and records one
/// CheckpointBackward node instead, which saves only `inputs` (with version checks) and the
/// state of frugal::default_generator(). Its backward restores that generator state, re-runs
/// fn with grad enabled on detached copies of the inputs, and backpropagates through the
/// recomputed graph: input gradients flow on to the outer graph, and leaves that fn captured
/// (a module's parameters) accumulate their .grad once, during that recompute.
///
/// fn must be deterministic given its inputs and the default generator: random ops that are
/// given an explicit Generator are not replayed. Inside an autograd::grad call, captured
/// leaves still accumulate .grad (as PyTorch's reentrant checkpoint).
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs);

/// The single-input, single-output form of checkpoint.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace frugal::autograd

namespace frugal {
using autograd::checkpoint;
}
