#pragma once
// Recompute checkpointing for Sequential models (see Note [Checkpoint recompute]
// in autograd/checkpoint.cpp for the mechanism).
#include <cstdint>

#include "autograd/checkpoint.h"
#include "nn/container.h"

namespace frugal::nn {

/// Runs seq on x in `segments` contiguous chunks of modules, as
/// torch.utils.checkpoint.checkpoint_sequential: every chunk but the last is wrapped in
/// autograd::checkpoint (only its input is kept; its activations are recomputed in
/// backward); the last chunk runs normally, since backward needs its activations at once.
/// Chunks hold size() / segments modules each, the last one the rest. segments must be in
/// [1, size()] (any value for an empty Sequential, which returns x). With segments ~
/// sqrt(size()) activation memory drops from O(n) to O(sqrt(n)) layers.
/// Batch norm's running statistics and batch count are updated once, in the forward, not
/// again when the chunk is recomputed (unlike PyTorch's; Note [Checkpoint recompute]). `policy` is each chunk's
/// checkpoint policy (Selective keeps the chunk's GEMM and convolution outputs: Note [Selective checkpoint]).
Tensor checkpoint_sequential(Sequential& seq, int64_t segments, const Tensor& x,
                             autograd::CheckpointPolicy policy = autograd::CheckpointPolicy::Full);

}  // namespace frugal::nn
