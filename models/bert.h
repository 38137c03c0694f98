#pragma once
// BERT (Devlin et al., 2018) as Hugging Face Transformers' modeling_bert.py builds it:
// BertModel, BertForMaskedLM and BertForSequenceClassification, with its parameter names
// ("bert.encoder.layer.0.attention.self.query.weight", "cls.predictions.bias"), so a
// checkpoint written by save_pretrained or save_file loads unchanged
// (models::load_safetensors_into with the model's tied_keys()).
//
//   auto mlm = std::make_shared<models::BertForMaskedLM>(models::bert_base());
//   models::BertMlmOutput out = mlm->forward(input_ids, attention_mask, {}, labels);
//   out.loss.backward();
//
// Note [Tied weights]
// BertForMaskedLM's output projection (cls.predictions.decoder) is the word embedding
// matrix itself, and its bias is cls.predictions.bias, as in Hugging Face (tie_word_
// embeddings). PyTorch lists a tied tensor once in named_parameters() and under both names
// in state_dict() (so does nn::Module: Note [Shared parameters] in nn/module.cpp). The
// decoder registers the two tensors as *buffers* under "weight" and "bias": state_dict()
// then has every key that Hugging Face's has (the same tensor twice, as torch), while
// parameters() holds each tensor once, so an optimizer steps it once and its gradient is
// the sum of both uses.
#include <memory>

#include "autograd/checkpoint.h"
#include "models/pretrained.h"
#include "nn/block_memory.h"
#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"

namespace frugal::json {
struct Value;
}

namespace frugal::models {

/// Hugging Face BertConfig's fields (same names; defaults are bert-base-uncased's).
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  int64_t pad_token_id = 0;  // that word embedding row starts at zero and gets no gradient
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;  // std of the normal init of Linear and Embedding weights
  int64_t num_labels = 2;           // BertForSequenceClassification's classes (1: regression)
  /// Run each encoder layer under autograd::checkpoint (recomputed in backward).
  bool checkpoint_blocks = false;
  /// What a checkpointed layer keeps: Full (its input only) or Selective (also the outputs
  /// of its projections and attention: Note [Selective checkpoint]).
  autograd::CheckpointPolicy checkpoint_policy = autograd::CheckpointPolicy::Full;

  /// Reads a Hugging Face config.json (keys above; "id2label" sets num_labels, over a
  /// num_labels that disagrees, as Hugging Face: Note [num_labels and id2label]; keys
  /// frugal does not use are ignored; hidden_act must be "gelu" and
  /// position_embedding_type "absolute" when present) plus frugal's "checkpoint_blocks" and "checkpoint_policy".
  /// Values out of range (Note [Config ranges]) and a hidden_size that num_attention_heads
  /// does not divide throw, naming the key and `file`, the config's path (if it came from one).
  static BertConfig from_json(const json::Value& config, const std::string& file = "");
};

/// bert-base: 12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522.
BertConfig bert_base();
/// bert-large: 24 layers, hidden 1024, 16 heads, intermediate 4096, vocab 30522.
BertConfig bert_large();

/// word + position + token type embeddings, LayerNorm, dropout.
class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  /// input_ids, token_type_ids (B, T) int -> (B, T, hidden).
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);
  std::string type_name() const override { return "BertEmbeddings"; }

  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

/// Multi-head self-attention with separate query, key and value projections.
class BertSelfAttention : public nn::Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  /// h (B, T, hidden), additive mask (B, 1, 1, T) or undefined -> context (B, T, hidden).
  Tensor forward(const Tensor& h, const Tensor& mask);
  std::string type_name() const override { return "BertSelfAttention"; }

  std::shared_ptr<nn::Linear> query, key, value;
  const int64_t num_heads;
  const double dropout_p;
};

/// dense -> dropout -> LayerNorm(. + residual): BertSelfOutput and BertOutput.
class BertResidualOutput : public nn::Module {
 public:
  BertResidualOutput(int64_t in_features, const BertConfig& c);
  Tensor forward(const Tensor& h, const Tensor& residual);
  std::string type_name() const override { return "BertOutput"; }

  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

/// attention.self, attention.output, intermediate.dense (+ exact GELU), output.
class BertLayer : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& c);
  /// h (B, T, hidden), additive mask (B, 1, 1, T) or undefined -> (B, T, hidden).
  Tensor forward(const Tensor& h, const Tensor& mask);
  std::string type_name() const override { return "BertLayer"; }

  std::shared_ptr<BertSelfAttention> self_attention;     // "attention.self"
  std::shared_ptr<BertResidualOutput> attention_output;  // "attention.output"
  std::shared_ptr<nn::Linear> intermediate_dense;        // "intermediate.dense"
  std::shared_ptr<BertResidualOutput> output;            // "output"
};

struct BertModelOutput {
  Tensor last_hidden_state;  // (B, T, hidden)
  Tensor pooler_output;      // (B, hidden): tanh(dense(h[:, 0])); undefined without a pooler
};

/// embeddings, encoder.layer.N, and (with add_pooling_layer) pooler.dense.
class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& c, bool add_pooling_layer = true);
  /// input_ids (B, T) int; attention_mask (B, T) of 0/1 (1 = attend; undefined: all ones);
  /// token_type_ids (B, T) (undefined: all zeros).
  BertModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                          const Tensor& token_type_ids = Tensor());
  std::string type_name() const override { return "BertModel"; }

  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<nn::ModuleList<BertLayer>> layers;  // "encoder.layer"
  std::shared_ptr<nn::Linear> pooler_dense;           // "pooler.dense"; null without a pooler
  const BertConfig config;
  /// What each encoder layer keeps for backward (Note [Block memory plan]); starts as
  /// config.checkpoint_blocks and checkpoint_policy say. nn::BlockPlanner sets it.
  nn::BlockMemoryPlan memory_plan;
  int64_t num_blocks() const { return static_cast<int64_t>(layers->size()); }
};

/// The additive attention mask: (B, T) of 0/1 -> (B, 1, 1, T) holding 0 where 1 and the
/// lowest finite value of `dtype` where 0, as Hugging Face's get_extended_attention_mask.
Tensor bert_additive_mask(const Tensor& attention_mask, DType dtype);
/// An additive mask (bert_additive_mask's) converted to `dtype`, the attention scores',
/// saturating: values beyond dtype's range become its lowest (highest) finite value, never
/// -inf (Note [BERT mask in low precision] in models/bert.cpp). Undefined stays undefined.
Tensor bert_mask_in(const Tensor& additive_mask, DType dtype);

struct BertMlmOutput {
  Tensor logits;  // (B, T, vocab_size); with labels only when asked (MlmForwardOptions::logits)
  Tensor loss;    // cross entropy over the labels != -100; undefined without labels
};

struct MlmForwardOptions {
  /// With labels, also return the logits and take the loss from them (cross_entropy of the
  /// logits). By default a forward with labels returns only the loss, from
  /// linear_cross_entropy, which never holds the (B, T, vocab) logits or their gradient
  /// (Note [Fused linear cross entropy]): the largest tensors of a BERT step.
  bool logits = false;
};

/// BertModel without pooler ("bert.*") and the masked-LM head "cls.predictions": transform
/// (dense, exact GELU, LayerNorm), then the decoder tied to the word embeddings plus
/// cls.predictions.bias (Note [Tied weights]).
class BertForMaskedLM : public nn::Module {
 public:
  explicit BertForMaskedLM(const BertConfig& c);
  /// labels (B, T) int64: the token to predict, or -100 where nothing is predicted.
  BertMlmOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                        const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor(),
                        const MlmForwardOptions& options = {});
  std::string type_name() const override { return "BertForMaskedLM"; }
  /// The state-dict keys that alias another (for load_safetensors_into).
  TiedKeys tied_keys() const;

  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Linear> transform_dense;         // "cls.predictions.transform.dense"
  std::shared_ptr<nn::LayerNorm> transform_LayerNorm;  // "cls.predictions.transform.LayerNorm"
  Tensor decoder_bias;                                 // "cls.predictions.bias", (vocab_size)
};

struct BertClassifierOutput {
  Tensor logits;  // (B, num_labels)
  Tensor loss;    // cross entropy (num_labels > 1) or MSE (num_labels == 1); undefined without labels
};

/// BertModel with pooler ("bert.*"), dropout, and "classifier" (hidden -> num_labels).
class BertForSequenceClassification : public nn::Module {
 public:
  explicit BertForSequenceClassification(const BertConfig& c);
  /// labels: (B) int64 class indices, or (B) floating targets when num_labels == 1; (B, 1)
  /// is read as (B), as Hugging Face (Note [Classifier labels] in models/bert.cpp).
  BertClassifierOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                               const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  std::string type_name() const override { return "BertForSequenceClassification"; }

  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Linear> classifier;
};

}  // namespace frugal::models
