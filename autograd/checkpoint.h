#pragma once
// Recompute checkpointing: trade compute for activation memory
// (see Note [Checkpoint recompute] in autograd/checkpoint.cpp).
//
//   // Activations inside `block` are not kept; they are recomputed in backward.
//   Tensor y = autograd::checkpoint([&](const Tensor& h) { return block->forward(h); }, x);
//
//   // Selective: the block's GEMM/conv/attention outputs are kept, the rest is recomputed.
//   Tensor z = autograd::checkpoint(block_fn, x, autograd::CheckpointPolicy::Selective);
//
// nn/checkpoint.h builds checkpoint_sequential on top of this.
#include <functional>
#include <optional>
#include <string_view>

#include "autograd/node.h"
#include "autograd/selective_checkpoint.h"

namespace frugal::autograd {

/// What a checkpointed block keeps from its forward (Note [Selective checkpoint] in
/// autograd/selective_checkpoint.cpp).
enum class CheckpointPolicy : uint8_t {
  Full,       ///< only its inputs: every op runs again in backward
  Selective,  ///< also the outputs of matmul, linear, gelu_mlp, conv2d and flash_attention (is_expensive_op):
              ///< only the cheap ops run again
};

/// "full" or "selective".
const char* to_string(CheckpointPolicy policy);
/// The policy named "full" or "selective"; nullopt for anything else.
std::optional<CheckpointPolicy> parse_checkpoint_policy(std::string_view name);

/// Runs fn(inputs) without recording a graph (no activations are saved) and records one
/// CheckpointBackward node instead, which saves only `inputs` (with version checks) and the
/// state of every generator fn draws from (frugal::default_generator() and any Generator
/// given to a random op). Its backward restores those generator states, re-runs
/// fn with grad enabled on detached copies of the inputs, and backpropagates through the
/// recomputed graph: input gradients flow on to the outer graph, and leaves that fn captured
/// (a module's parameters) accumulate their .grad once, during that recompute.
///
/// fn must be deterministic given its inputs and those generators, draw its random numbers on
/// the calling thread (and no other thread may draw from those generators while fn or its
/// backward runs: the replay moves them back for a while), and not destroy a generator it
/// drew from before backward (the replay refuses then). fn may not write its inputs in place
/// (a clear error), nor, unless guarded by in_checkpoint_recompute(), a tensor it captures
/// (the recompute refuses to write it again), and an output that aliases an input, another
/// output or a captured parameter may not be written in place while that tensor lives (Note
/// [Aliases of transform outputs]). fn's forward runs without grad, so a register_hook inside
/// fn must be guarded by `if (h.requires_grad())` (it then registers during the recompute),
/// as with PyTorch's reentrant checkpoint.
/// Nothing is recorded or held when no input requires grad and fn hands no tensor that
/// requires grad to an op outside fn's own NoGradGuard (a frozen region on data): the
/// outputs are then plain tensors.
/// Inside an autograd::grad call the recompute touches no .grad: captured leaves get their
/// share only if they are among grad()'s inputs (unlike PyTorch's reentrant checkpoint, which
/// accumulates into them; see nested_gradients in autograd/engine.h).
///
/// With CheckpointPolicy::Selective, or a KeepPredicate over op names, the outputs of the
/// selected ops are kept from the forward and taken again by the recompute, which skips
/// their kernels (Note [Selective checkpoint]); the gradients are those of a full checkpoint.
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                      CheckpointPolicy policy = CheckpointPolicy::Full);
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                      KeepPredicate keep);

/// True while a checkpoint's backward re-runs its function on this thread. Ops whose forward
/// updates state (batch norm's running statistics, nn::BatchNorm2d's batch count) skip the
/// update then: the forward made it once, and the recompute only rebuilds the graph
/// (Note [Checkpoint recompute], "State updated in the forward").
bool in_checkpoint_recompute();

/// Called by every recorded in-place op before it writes: inside a checkpoint's recompute on
/// this thread, throws, naming `op`, when `self` was not made by the recompute (a buffer the
/// checkpointed function captures and writes: the forward wrote it once already).
void check_recompute_write(const char* op, const Tensor& self);

/// The single-input, single-output form of checkpoint.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                  CheckpointPolicy policy = CheckpointPolicy::Full);
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, KeepPredicate keep);

/// The KeepPredicate of a policy: empty for Full, is_expensive_op for Selective.
KeepPredicate keep_predicate(CheckpointPolicy policy);

}  // namespace frugal::autograd

namespace frugal {
using autograd::checkpoint;
using autograd::CheckpointPolicy;
}  // namespace frugal
