#pragma once
// What the tensor-parallel models (models/bert_tp.h, models/vit_tp.h) share: how each
// state-dict tensor is laid out across the ranks, cutting a rank's shard out of a full
// tensor, putting the full tensor back together from the shards, and strict loading of a
// full (single-process) state dict.
//
// Note [Tensor-parallel block memory]
// The tensor-parallel BERT and ViT run each encoder layer through nn::run_block, as the
// plain models do (Note [Block memory plan]), so checkpoint_blocks, checkpoint_policy and a
// memory_plan that nn::BlockPlanner chose all apply to them. What a replayed layer needs:
//  - Its dropout masks again. A layer draws from its TensorParallelRng's streams, not the
//    default generator; a checkpoint notes every generator its function drew from, rewinds
//    each for the replay and puts it back after (Note [Draws under a record] in
//    tensor/random.h), so the replay draws the forward's masks and the streams go on as in
//    a run without checkpoints: same losses, gradients and weights, bit for bit.
//  - Its collectives paired. A Checkpoint or Selective layer (and the checkpoint-* choices)
//    issues its forward all-reduces again in backward, between the backward all-reduces of
//    the layers after it. Each rank's engine runs the same graph in the same order (Note
//    [Engine order] in autograd/engine.cpp), so the ranks replay the same layers in the same
//    order and their collectives pair up, provided every rank runs the same plan: agree on
//    one with parallel::agree_on_plan. Recompute, Offload and Compress replay no collective.
//  - Nothing that differs per rank from the host. A layer reads no device value on the host
//    and branches only on the model's training mode; the attention mask is made before the
//    layers and captured by each layer's closure.
#include <functional>
#include <map>
#include <string>

#include "nn/module.h"
#include "parallel/tensor_parallel.h"

namespace frugal::models {

/// How a state-dict tensor is laid out across the ranks: whole on every rank (dim < 0), or
/// split along `dim`. With blocks > 1 the full tensor is that many equal blocks along dim,
/// each split on its own, and a rank's shard is its slice of every block, concatenated:
/// MultiheadAttention's in_proj_weight (3E, E) = [q; k; v] gives rank r the rows of its
/// heads in each of q, k and v.
struct TensorSplit {
  int64_t dim = -1;
  int64_t blocks = 1;
};

/// The full shape of a tensor laid out as `split` over `size` ranks, from a local shard.
Shape tp_full_shape(const Tensor& local, TensorSplit split, int size);
/// Rank `rank`'s shard of `full` (of `size` ranks), or `full` itself when not split.
Tensor tp_shard_of(const Tensor& full, TensorSplit split, int rank, int size);
/// The full tensor from this rank's `local` shard: an all-gather when split, a copy
/// otherwise. Collective: every rank of `comm` calls it for the same tensor.
Tensor tp_gather_full(const Tensor& local, TensorSplit split, const parallel::CommPtr& comm);
/// heads / the tensor-parallel size, checking that it divides (`what` names the config
/// field in the error, after `model`).
int64_t tp_heads_per_rank(int64_t heads, const parallel::CommPtr& comm, const char* model, const char* what);
/// The split of every ColumnParallelLinear (weight and bias along 0) and RowParallelLinear
/// (weight along 1; its bias is replicated) under `model`, by state-dict key.
std::map<std::string, TensorSplit> tp_linear_splits(const nn::Module& model);
/// Copies this rank's shard of every tensor of `full` into `state` (a model's
/// state_dict()). Strict: every key of `state` must be in `full` with its full shape and
/// `full` may hold no other key; the error lists every missing, unexpected and mismatched
/// key and names `model` (the model's type).
void tp_load_full(const nn::NamedTensors& state, const std::map<std::string, Tensor>& full,
                  const std::function<TensorSplit(const std::string&)>& split_of, const parallel::CommPtr& comm,
                  const char* model);

}  // namespace frugal::models
