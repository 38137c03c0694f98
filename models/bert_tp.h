#pragma once
// A tensor-parallel BertForMaskedLM (Megatron-LM layout, see Note [Tensor-parallel regions]
// in parallel/tensor_parallel.cpp) whose module tree and state-dict keys are exactly
// models::BertForMaskedLM's, i.e. Hugging Face's; each rank holds only its shard of the
// split tensors:
//   bert.embeddings.word_embeddings          vocabulary-parallel (rows split)
//   ...attention.self.query / key / value    column-parallel (heads split)
//   ...attention.output.dense, output.dense  row-parallel (input columns split)
//   ...intermediate.dense                    column-parallel
//   cls.predictions.bias and the decoder     vocabulary-parallel, tied to the word shard
//   position / token type embeddings, every LayerNorm, transform.dense: replicated.
// The MLM loss is vocab_parallel_cross_entropy: the full logits are never gathered.
//
//   TensorParallelBertForMaskedLM tp(config, comm);
//   load_full_state_dict(tp, reference.state_dict());       // or load_full_safetensors
//   auto out = tp.forward(ids, mask, {}, labels);           // out.local_logits: (B, T, V / size)
//   out.loss.backward();
//
// Dropout where BertForMaskedLM has it (embeddings, attention probabilities, both hidden
// outputs; training mode only), Megatron-style from the model's TensorParallelRng: the
// replicated stream on the replicated activations, each rank's split stream on its heads'
// attention probabilities (Note [Tensor-parallel dropout] in parallel/tensor_parallel.cpp).
// Each encoder layer runs as memory_plan says, as BertModel's: checkpoint_blocks and
// checkpoint_policy, or a plan from nn::BlockPlanner, the same on every rank (Note
// [Tensor-parallel block memory] in models/tp_util.h).
#include <map>
#include <memory>
#include <string>

#include "models/bert.h"
#include "nn/block_memory.h"
#include "parallel/tensor_parallel.h"

namespace frugal::models {

/// One BERT encoder layer with its heads and MLP split across the ranks; Hugging Face names
/// (attention.self.query, attention.output.dense, intermediate.dense, output.LayerNorm, ...).
class TensorParallelBertLayer : public nn::Module {
 public:
  /// Weights drawn from `gen`; dropout from `rng` (shared by the model's layers).
  TensorParallelBertLayer(const BertConfig& c, parallel::CommPtr comm, Generator* gen, parallel::RngPtr rng);
  /// h (B, T, hidden) replicated, additive mask (B, 1, 1, T) or undefined -> (B, T, hidden).
  Tensor forward(const Tensor& h, const Tensor& mask);
  std::string type_name() const override { return "TensorParallelBertLayer"; }

  std::shared_ptr<parallel::ColumnParallelLinear> query, key, value, intermediate_dense;
  std::shared_ptr<parallel::RowParallelLinear> attention_output_dense, output_dense;
  std::shared_ptr<nn::LayerNorm> attention_output_LayerNorm, output_LayerNorm;
  const int64_t heads_per_rank, head_dim;
  const parallel::TensorParallelDropout dropout;

 private:
  parallel::CommPtr comm_;
};

struct TensorParallelMlmOutput {
  Tensor local_logits;  // (B, T, vocab_size / size): this rank's vocabulary slice
  Tensor loss;          // mean cross entropy over labels != -100, replicated; undefined without labels
};

class TensorParallelBertForMaskedLM : public nn::Module {
 public:
  /// vocab_size, num_attention_heads and intermediate_size must divide by comm's size.
  /// Initialised as Hugging Face's _init_weights from a generator seeded with `seed` on
  /// every rank (the full tensors are drawn and each rank keeps its shard). Dropout draws
  /// from TensorParallelRng(dropout_seed, comm).
  TensorParallelBertForMaskedLM(const BertConfig& c, parallel::CommPtr comm, uint64_t seed = 0,
                                uint64_t dropout_seed = 1234);
  /// As BertForMaskedLM::forward; labels (B, T) int64 with -100 where nothing is predicted.
  TensorParallelMlmOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                                  const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  /// The full (B, T, vocab_size) logits on every rank (an all-gather; differentiable).
  Tensor gather_logits(const Tensor& local_logits) const;
  std::string type_name() const override { return "TensorParallelBertForMaskedLM"; }
  /// As BertForMaskedLM::tied_keys().
  TiedKeys tied_keys() const;

  /// The dim along which the state-dict tensor `key` is split across the ranks, or -1 when
  /// every rank holds it whole.
  int64_t split_dim(const std::string& key) const;
  /// The full tensor for `key` from this rank's `local` shard of it (an all-gather when
  /// split, a copy otherwise). Collective: every rank calls it with the same key. Works on
  /// gradients too (a parameter's .grad has the parameter's layout).
  Tensor gather_full(const std::string& key, const Tensor& local) const;
  const parallel::CommPtr& comm() const { return comm_; }

  std::shared_ptr<parallel::VocabParallelEmbedding> word_embeddings;  // "bert.embeddings.word_embeddings"
  std::shared_ptr<nn::Embedding> position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> embeddings_LayerNorm;              // "bert.embeddings.LayerNorm"
  std::shared_ptr<nn::ModuleList<TensorParallelBertLayer>> layers;  // "bert.encoder.layer"
  std::shared_ptr<nn::Linear> transform_dense;                      // "cls.predictions.transform.dense"
  std::shared_ptr<nn::LayerNorm> transform_LayerNorm;               // "cls.predictions.transform.LayerNorm"
  Tensor decoder_bias;                                              // "cls.predictions.bias", (vocab / size)
  const BertConfig config;
  /// What each encoder layer keeps for backward (Note [Block memory plan]); starts as
  /// config.checkpoint_blocks and checkpoint_policy say. nn::BlockPlanner sets it; every
  /// rank must hold the same plan (parallel::agree_on_plan): a checkpointed layer issues its
  /// collectives again in backward (Note [Tensor-parallel block memory]).
  nn::BlockMemoryPlan memory_plan;
  int64_t num_blocks() const { return static_cast<int64_t>(layers->size()); }
  /// The dropout streams of this rank (reseed with rng->replicated / split.manual_seed).
  const parallel::RngPtr rng;

 private:
  parallel::CommPtr comm_;
  std::map<std::string, int64_t> split_dims_;
};

/// Copies this rank's shard of every tensor of a full BertForMaskedLM state dict (as
/// models::BertForMaskedLM::state_dict() or a Hugging Face checkpoint holds it) into `model`.
/// Strict: every key must be there (either key of a tied pair suffices), no unknown keys,
/// full shapes must match.
void load_full_state_dict(TensorParallelBertForMaskedLM& model, const std::map<std::string, Tensor>& full);
/// The same from a safetensors file (written by PyTorch / save_pretrained or by frugal).
void load_full_safetensors(TensorParallelBertForMaskedLM& model, const std::string& path);
/// The full state dict (every key of BertForMaskedLM's, full shapes) on every rank, e.g. to
/// save with nn::save_safetensors. Collective.
nn::NamedTensors gather_full_state_dict(const TensorParallelBertForMaskedLM& model);

}  // namespace frugal::models
