#pragma once
// What the tensor-parallel models (models/bert_tp.h, models/vit_tp.h) share: how each
// state-dict tensor is laid out across the ranks, cutting a rank's shard out of a full
// tensor, putting the full tensor back together from the shards, and strict loading of a
// full (single-process) state dict.
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
