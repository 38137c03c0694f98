#pragma once
// A tensor-parallel VisionTransformer (Megatron-LM layout, see Note [Tensor-parallel
// regions] in parallel/tensor_parallel.cpp) whose module tree and state-dict keys are
// exactly models::VisionTransformer's, i.e. torchvision's; each rank holds only its shard
// of the split tensors:
//   ...self_attention.in_proj_weight / in_proj_bias   column-parallel (heads split): the
//       rows of this rank's heads in each of the q, k and v blocks of the fused (3E, E)
//       weight, concatenated: (3E / size, E)
//   ...self_attention.out_proj, mlp.3                  row-parallel (input columns split)
//   ...mlp.0                                           column-parallel
//   conv_proj, class_token, encoder.pos_embedding, every LayerNorm, heads.head: replicated.
// The logits come out whole on every rank (the head is replicated).
//
//   TensorParallelVisionTransformer tp(config, comm);
//   load_full_state_dict(tp, reference.state_dict());   // or load_full_safetensors
//   Tensor logits = tp.forward(images);                  // (N, num_classes), replicated
//   cross_entropy(logits, labels).backward();
//
// Dropout where VisionTransformer has it (after the position embedding, on the attention
// probabilities, after the attention, and mlp.2 / mlp.4; training mode only),
// Megatron-style from the model's TensorParallelRng: the replicated stream on the
// replicated activations, each rank's split stream on its heads' attention probabilities
// and its columns of the MLP activation (Note [Tensor-parallel dropout] in
// parallel/tensor_parallel.cpp). Each encoder block runs as memory_plan says, as
// VisionTransformer's: checkpoint_blocks and checkpoint_policy, or a plan from
// nn::BlockPlanner, the same on every rank (Note [Tensor-parallel block memory] in
// models/tp_util.h).
#include <map>
#include <memory>
#include <string>

#include "models/tp_util.h"
#include "models/vit.h"
#include "nn/block_memory.h"
#include "parallel/tensor_parallel.h"

namespace frugal::models {

/// torchvision's EncoderBlock with its heads and MLP split across the ranks: x +
/// attn(ln_1(x)), then y + mlp(ln_2(y)); one all-reduce forward and one backward per half.
/// Children ln_1, self_attention (in_proj_weight, in_proj_bias, out_proj), ln_2, mlp (0, 3).
class TensorParallelEncoderBlock : public nn::UnaryModule {
 public:
  /// Weights drawn from `gen`; dropout from `rng` (shared by the model's blocks).
  TensorParallelEncoderBlock(const ViTConfig& c, parallel::CommPtr comm, Generator* gen, parallel::RngPtr rng);
  /// x (N, S, hidden) replicated -> (N, S, hidden) replicated.
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "TensorParallelEncoderBlock"; }

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  Tensor in_proj_weight, in_proj_bias;  // (3 hidden / size, hidden), (3 hidden / size): [q; k; v] of this rank's heads
  std::shared_ptr<parallel::RowParallelLinear> out_proj;  // "self_attention.out_proj"
  std::shared_ptr<parallel::ColumnParallelLinear> mlp_0;  // "mlp.0"
  std::shared_ptr<parallel::RowParallelLinear> mlp_3;     // "mlp.3"
  const int64_t heads_per_rank, head_dim;
  const parallel::TensorParallelDropout dropout;

 private:
  parallel::CommPtr comm_;
};

class TensorParallelVisionTransformer : public nn::UnaryModule {
 public:
  /// num_heads and mlp_dim must divide by comm's size. Initialised as torchvision (see
  /// models::VisionTransformer) from a generator seeded with `seed` on every rank (the full
  /// tensors are drawn and each rank keeps its shard). Dropout draws from
  /// TensorParallelRng(dropout_seed, comm).
  TensorParallelVisionTransformer(const ViTConfig& c, parallel::CommPtr comm, uint64_t seed = 0,
                                  uint64_t dropout_seed = 1234);
  /// x (N, in_channels, image_size, image_size) -> logits (N, num_classes), replicated.
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "TensorParallelVisionTransformer"; }

  /// How the state-dict tensor `key` is laid out across the ranks (TensorSplit{} when
  /// every rank holds it whole).
  TensorSplit split(const std::string& key) const;
  /// The dim along which `key` is split, or -1 when every rank holds it whole.
  int64_t split_dim(const std::string& key) const { return split(key).dim; }
  /// The full tensor for `key` from this rank's `local` shard of it (an all-gather when
  /// split, a copy otherwise). Collective: every rank calls it with the same key. Works on
  /// gradients too (a parameter's .grad has the parameter's layout).
  Tensor gather_full(const std::string& key, const Tensor& local) const;
  const parallel::CommPtr& comm() const { return comm_; }

  Tensor class_token;    // (1, 1, hidden)
  Tensor pos_embedding;  // "encoder.pos_embedding", (1, patches + 1, hidden)
  std::shared_ptr<nn::Conv2d> conv_proj;
  std::vector<std::shared_ptr<TensorParallelEncoderBlock>> blocks;  // "encoder.layers.encoder_layer_N"
  std::shared_ptr<nn::LayerNorm> encoder_ln;                        // "encoder.ln"
  std::shared_ptr<nn::Linear> head;                                 // "heads.head"
  const ViTConfig config;
  /// What each encoder block keeps for backward (Note [Block memory plan]); starts as
  /// config.checkpoint_blocks and checkpoint_policy say. nn::BlockPlanner sets it; every
  /// rank must hold the same plan (parallel::agree_on_plan): a checkpointed block issues its
  /// collectives again in backward (Note [Tensor-parallel block memory]).
  nn::BlockMemoryPlan memory_plan;
  int64_t num_blocks() const { return static_cast<int64_t>(blocks.size()); }
  /// The dropout streams of this rank (reseed with rng->replicated / split.manual_seed).
  const parallel::RngPtr rng;

 private:
  parallel::CommPtr comm_;
  std::map<std::string, TensorSplit> splits_;
};

/// Copies this rank's shard of every tensor of a full VisionTransformer state dict (as
/// models::VisionTransformer::state_dict() or a torchvision checkpoint holds it) into
/// `model`. Strict: every key must be there, no unknown keys, full shapes must match.
void load_full_state_dict(TensorParallelVisionTransformer& model, const std::map<std::string, Tensor>& full);
/// The same from a safetensors file (written by PyTorch or by frugal).
void load_full_safetensors(TensorParallelVisionTransformer& model, const std::string& path);
/// The full state dict (every key of VisionTransformer's, full shapes) on every rank, e.g.
/// to save with nn::save_safetensors. Collective.
nn::NamedTensors gather_full_state_dict(const TensorParallelVisionTransformer& model);

}  // namespace frugal::models
