#pragma once
// Tensor parallelism, Megatron-LM style (Shoeybi et al., 2019): a layer's weight is split
// across the ranks of a tensor-parallel communicator and four conjugate operators move
// activations in and out of the split region (see Note [Tensor-parallel regions] in
// parallel/tensor_parallel.cpp).
//
//   auto tp = groups.tensor;                                   // a Communicator
//   auto fc1 = std::make_shared<parallel::ColumnParallelLinear>(768, 3072, tp,
//                  parallel::ColumnParallelOptions{.gather_output = false});
//   auto fc2 = std::make_shared<parallel::RowParallelLinear>(3072, 768, tp,
//                  parallel::RowParallelOptions{.input_is_parallel = true});
//   Tensor y = fc2->forward(gelu(fc1->forward(x)));            // one all-reduce each way
//
// A null communicator (or one of size 1) makes every operator the identity, so the same
// layers run unsplit on one device.
#include <memory>
#include <optional>

#include "nn/layers.h"
#include "nn/module.h"
#include "parallel/communicator.h"
#include "tensor/random.h"

namespace frugal::parallel {

using CommPtr = std::shared_ptr<Communicator>;

// ---- the conjugate operators (differentiable) --------------------------------------
/// Megatron's f: identity forward, all-reduce (sum) of the gradient backward. Enters a
/// tensor-parallel region whose input is replicated.
Tensor copy_to_region(const Tensor& x, const CommPtr& comm);
/// Megatron's g: all-reduce (sum) forward, identity backward. Leaves a region whose ranks
/// hold partial sums.
Tensor reduce_from_region(const Tensor& x, const CommPtr& comm);
/// All-gather along the last dim forward (rank order), this rank's slice of the gradient
/// backward. x: (..., n) -> (..., size * n).
Tensor gather_from_region(const Tensor& x, const CommPtr& comm);
/// This rank's slice along the last dim forward, all-gather of the gradient backward.
/// x: (..., size * n) -> (..., n).
Tensor scatter_to_region(const Tensor& x, const CommPtr& comm);

/// Rank and size of a possibly null communicator (a null one is a single rank).
int tp_rank(const CommPtr& comm);
int tp_size(const CommPtr& comm);

// ---- layers -------------------------------------------------------------------------
struct ColumnParallelOptions {
  bool bias = true;
  /// Gather the output shards into the full (..., out) on every rank; false leaves each
  /// rank its (..., out / size) slice, ready for a RowParallelLinear.
  bool gather_output = true;
  /// The generator the full weight is drawn from (default: frugal::default_generator()).
  Generator* generator = nullptr;
};

/// y = x W^T + b with W (out, in) split along out: this rank holds rows
/// [rank * out / size, (rank + 1) * out / size) of W and of b. Initialised by drawing the
/// full weight as nn::Linear does (same generator sequence on every rank) and keeping
/// this rank's shard, so the shards put together equal nn::Linear's weight.
class ColumnParallelLinear : public nn::UnaryModule {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, CommPtr comm, ColumnParallelOptions options = {});
  /// x (..., in) replicated -> (..., out) if gather_output else (..., out / size).
  Tensor forward(const Tensor& x) override;
  /// The local product x W_shard^T + b_shard, for an x already inside the region (after
  /// copy_to_region): several layers reading one input share one backward all-reduce.
  Tensor forward_local(const Tensor& x) const;
  /// Copies this rank's shard of a full (out, in) weight and (out) bias.
  void load_full(const Tensor& weight, const Tensor& bias = Tensor());
  std::string type_name() const override { return "ColumnParallelLinear"; }
  std::string extra_repr() const override;

  Tensor weight, bias;  // (out / size, in), (out / size)
  const int64_t in_features, out_features, out_per_rank;
  const bool gather_output;

 private:
  CommPtr comm_;
};

struct RowParallelOptions {
  bool bias = true;
  /// The input is already split along its last dim (a ColumnParallelLinear's output
  /// without gather_output); false scatters a replicated input first.
  bool input_is_parallel = false;
  Generator* generator = nullptr;
};

/// y = x W^T + b with W (out, in) split along in: this rank holds columns
/// [rank * in / size, (rank + 1) * in / size). Each rank's partial product is all-reduced;
/// the (replicated) bias is added once, after the reduce. Initialised as nn::Linear.
class RowParallelLinear : public nn::UnaryModule {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, CommPtr comm, RowParallelOptions options = {});
  /// x (..., in / size) if input_is_parallel else (..., in) -> (..., out), replicated.
  Tensor forward(const Tensor& x) override;
  void load_full(const Tensor& weight, const Tensor& bias = Tensor());
  std::string type_name() const override { return "RowParallelLinear"; }
  std::string extra_repr() const override;

  Tensor weight, bias;  // (out, in / size), (out)
  const int64_t in_features, out_features, in_per_rank;
  const bool input_is_parallel;

 private:
  CommPtr comm_;
};

/// An embedding table (num, dim) split along the vocabulary: this rank holds rows
/// [rank * num / size, (rank + 1) * num / size). Each rank looks up the indices it owns
/// (zeros elsewhere) and the results are all-reduced. Initialised N(0, 1) as nn::Embedding.
class VocabParallelEmbedding : public nn::UnaryModule {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, CommPtr comm, Generator* generator = nullptr);
  /// indices (...) int64 -> (..., dim), replicated.
  Tensor forward(const Tensor& indices) override;
  void load_full(const Tensor& weight);
  std::string type_name() const override { return "VocabParallelEmbedding"; }
  std::string extra_repr() const override;

  Tensor weight;  // (num / size, dim)
  const int64_t num_embeddings, embedding_dim, vocab_start, vocab_end;
  /// A full-vocabulary index whose row gets no gradient (nn::Embedding's padding_idx), or -1.
  int64_t padding_idx = -1;

 private:
  CommPtr comm_;
};

/// Mean cross entropy of logits split along the vocabulary (Megatron's
/// vocab_parallel_cross_entropy): local_logits (..., V / size) is this rank's slice
/// [rank * V / size, ...) of the full logits, target (...) int64 in [0, V) or ignore_index.
/// Three all-reduces of (...)-shaped tensors (max, sum of exp, target logit); the full
/// logits are never gathered. Returns the mean over non-ignored targets, replicated.
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& target, const CommPtr& comm,
                                    int64_t ignore_index = -100);

// ---- dropout ----------------------------------------------------------------------------
/// The two dropout streams of one tensor-parallel rank (Megatron-LM's model-parallel RNG
/// tracker; see Note [Tensor-parallel dropout] in parallel/tensor_parallel.cpp):
///   replicated  Generator(seed) on every rank, for activations every rank holds whole
///               (hidden states, embeddings): all ranks drop the same elements;
///   split       Generator(seed + 2718 + tp_rank), for each rank's own slice (its heads'
///               attention probabilities, its columns of the MLP): the ranks' masks differ.
/// Every rank must run the same replicated dropouts, with the same shapes, in the same
/// order, so the replicated streams stay in step. Share one between the layers of a model
/// (one object per rank): layers with separate ones of the same seed would repeat masks.
struct TensorParallelRng {
  TensorParallelRng(uint64_t seed, const CommPtr& comm);
  Generator replicated, split;
};
using RngPtr = std::shared_ptr<TensorParallelRng>;

/// A tensor-parallel layer's dropout: its probabilities and its rank's streams. Each
/// applies in training mode only and draws nothing when its probability is 0.
struct TensorParallelDropout {
  double hidden = 0.0, attention = 0.0;
  RngPtr rng;
  /// dropout(x, hidden) of an activation every rank holds whole, from the replicated stream.
  Tensor replicated(const Tensor& x, bool training) const;
  /// dropout(x, hidden) of this rank's slice of an activation, from its split stream.
  Tensor split(const Tensor& x, bool training) const;
  /// Attention over this rank's heads, dropping attention probabilities from its split
  /// stream (scaled_dot_product_attention's arguments otherwise).
  Tensor attention_over_heads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                              std::optional<double> scale, bool training) const;
};

// ---- transformer encoder layer ------------------------------------------------------
struct TensorParallelEncoderOptions {
  /// Pre-norm (ViT: x + attn(ln(x)), x + mlp(ln(x))) or post-norm (BERT: ln(x + attn(x)),
  /// ln(x + mlp(x))).
  bool pre_norm = false;
  double layer_norm_eps = 1e-12;
  /// GELU (erf) or its tanh approximation in the MLP.
  bool gelu_tanh = false;
  /// The generator the weights are drawn from (default: frugal::default_generator()).
  Generator* generator = nullptr;
  /// Dropout probabilities, in training mode only: hidden_dropout on the attention's and
  /// the MLP's outputs after their all-reduce (and, pre-norm, on the MLP's activation, as
  /// torchvision's ViT), attention_dropout on the attention probabilities.
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  /// The dropout streams; null makes the layer its own TensorParallelRng(dropout_seed, comm).
  RngPtr rng = nullptr;
  uint64_t dropout_seed = 1234;  // Megatron-LM's default --seed
};

/// A transformer encoder layer with its heads split across the tensor-parallel ranks:
/// query/key/value column-parallel (heads / size per rank), the attention output
/// row-parallel; the MLP column- then row-parallel. One all-reduce forward and one
/// backward per half (see Note [Tensor-parallel regions]). Dropout as BERT's (post-norm)
/// or torchvision ViT's (pre-norm) layer places it, Megatron-style: replicated activations
/// from the replicated stream, each rank's heads (and pre-norm MLP columns) from its split
/// stream (Note [Tensor-parallel dropout]). With a null communicator it is the plain
/// (unsplit) layer. Linear weights initialised as nn::Linear, in registration order.
class TensorParallelEncoderLayer : public nn::Module {
 public:
  TensorParallelEncoderLayer(int64_t hidden, int64_t heads, int64_t intermediate, CommPtr comm,
                             TensorParallelEncoderOptions options = {});
  /// x (B, T, hidden) replicated; attn_mask: undefined, or bool (B, 1, 1, T) / (B, 1, T, T)
  /// with true = attend (scaled_dot_product_attention's convention).
  Tensor forward(const Tensor& x, const Tensor& attn_mask = Tensor());
  std::string type_name() const override { return "TensorParallelEncoderLayer"; }
  std::string extra_repr() const override;

  std::shared_ptr<ColumnParallelLinear> query, key, value, intermediate;
  std::shared_ptr<RowParallelLinear> attention_output, output;
  std::shared_ptr<nn::LayerNorm> attention_norm, output_norm;
  const int64_t hidden, heads, heads_per_rank;
  const bool pre_norm, gelu_tanh;
  const TensorParallelDropout dropout;

 private:
  Tensor attention(const Tensor& h, const Tensor& attn_mask);
  Tensor mlp(const Tensor& h);
  CommPtr comm_;
};

}  // namespace frugal::parallel
