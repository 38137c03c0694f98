#include "models/bert.h"

#include <cmath>
#include <limits>

#include "autograd/checkpoint.h"
#include "autograd/ops/all.h"
#include "core/instrument.h"
#include "models/config_json.h"
#include "models/group.h"
#include "nn/attention.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::models {

namespace {

// Hugging Face's _init_weights: Linear and Embedding weights N(0, initializer_range),
// biases zero, the padding row zero; LayerNorm keeps 1 and 0.
std::shared_ptr<nn::Linear> linear_layer(int64_t in, int64_t out, const BertConfig& c) {
  auto l = std::make_shared<nn::Linear>(in, out);
  nn::init::normal_(l->weight, 0.0, c.initializer_range);
  nn::init::zeros_(l->bias);
  return l;
}

std::shared_ptr<nn::Embedding> embedding_layer(int64_t n, const BertConfig& c, int64_t padding_idx = -1) {
  auto e = std::make_shared<nn::Embedding>(
      n, c.hidden_size,
      nn::EmbeddingOptions{.padding_idx = padding_idx >= 0 ? std::optional<int64_t>(padding_idx) : std::nullopt});
  nn::init::normal_(e->weight, 0.0, c.initializer_range);
  if (padding_idx >= 0) nn::init::zeros_(e->weight.select(0, padding_idx));
  return e;
}

std::shared_ptr<nn::LayerNorm> layer_norm_layer(const BertConfig& c) {
  return std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, nn::LayerNormOptions{.eps = c.layer_norm_eps});
}

double lowest_of(DType dtype) {
  switch (dtype) {
    case DType::Float16: return -65504.0;
    case DType::BFloat16: return -3.3895313892515355e38;
    case DType::Float32: return double(std::numeric_limits<float>::lowest());
    case DType::Float64: return std::numeric_limits<double>::lowest();
    default: FRUGAL_FAIL("bert_additive_mask: the mask dtype must be floating, got ", dtype_name(dtype));
  }
}

void check_ids(const char* op, const char* name, const Tensor& ids, const Tensor& input_ids) {
  if (!ids.defined()) return;
  FRUGAL_CHECK(ids.sizes() == input_ids.sizes(), op, ": ", name, " must have input_ids' shape ",
               shape_str(input_ids.sizes()), ", got ", ids.describe());
  check_same_device(op, input_ids, ids);
}

}  // namespace

// ---- config ------------------------------------------------------------------------

BertConfig bert_base() { return BertConfig{}; }
BertConfig bert_large() {
  return BertConfig{.hidden_size = 1024, .num_hidden_layers = 24, .num_attention_heads = 16, .intermediate_size = 4096};
}

BertConfig BertConfig::from_json(const json::Value& j, const std::string& file) {
  const std::string what = config_name("BERT", file);
  BertConfig c;
  c.vocab_size = json_int(j, "vocab_size", c.vocab_size, what, 1, kMaxConfigDim);
  c.hidden_size = json_int(j, "hidden_size", c.hidden_size, what, 1, kMaxConfigDim);
  c.num_hidden_layers = json_int(j, "num_hidden_layers", c.num_hidden_layers, what, 1, kMaxConfigLayers);
  c.num_attention_heads = json_int(j, "num_attention_heads", c.num_attention_heads, what, 1, kMaxConfigDim);
  c.intermediate_size = json_int(j, "intermediate_size", c.intermediate_size, what, 1, kMaxConfigDim);
  c.max_position_embeddings = json_int(j, "max_position_embeddings", c.max_position_embeddings, what, 1, kMaxConfigDim);
  c.type_vocab_size = json_int(j, "type_vocab_size", c.type_vocab_size, what, 1, kMaxConfigDim);
  c.pad_token_id = json_int(j, "pad_token_id", c.pad_token_id, what, 0, c.vocab_size - 1);  // a row of the embedding
  c.hidden_dropout_prob = json_double(j, "hidden_dropout_prob", c.hidden_dropout_prob, what, 0.0, 1.0);
  c.attention_probs_dropout_prob =
      json_double(j, "attention_probs_dropout_prob", c.attention_probs_dropout_prob, what, 0.0, 1.0);
  c.layer_norm_eps = json_double(j, "layer_norm_eps", c.layer_norm_eps, what, std::numeric_limits<double>::min(), 1.0);
  c.initializer_range = json_double(j, "initializer_range", c.initializer_range, what, 0.0, 1e6);
  // Note [num_labels and id2label]
  // As transformers' PretrainedConfig.__init__: when id2label is given it decides the number
  // of classes, and a num_labels that disagrees is overwritten by len(id2label) (Hugging Face
  // logs "You passed along `num_labels=3` with an incompatible id to label map ... will be
  // overwritten to 2"). Reading num_labels last built a classifier of a different width than
  // Hugging Face's for the same config.json. num_labels is still checked when present.
  c.num_labels = json_int(j, "num_labels", c.num_labels, what, 1, kMaxConfigDim);
  if (const json::Value* labels = j.find("id2label"); labels && labels->is_object()) {
    FRUGAL_CHECK(!labels->members.empty(), what, ": 'id2label' must name at least one label");
    c.num_labels = int64_t(labels->members.size());
  }
  c.checkpoint_blocks = json_bool(j, "checkpoint_blocks", c.checkpoint_blocks, what);
  c.checkpoint_policy = json_checkpoint_policy(j, c.checkpoint_policy, what);
  const std::string act = json_string(j, "hidden_act", "gelu", what);
  FRUGAL_CHECK(act == "gelu", what, ": hidden_act '", act, "' is not supported (only exact 'gelu')");
  const std::string pos = json_string(j, "position_embedding_type", "absolute", what);
  FRUGAL_CHECK(pos == "absolute", what, ": position_embedding_type '", pos, "' is not supported (only 'absolute')");
  FRUGAL_CHECK(c.hidden_size % c.num_attention_heads == 0, what, ": 'hidden_size' (", c.hidden_size,
               ") must be divisible by 'num_attention_heads' (", c.num_attention_heads, ")");
  return c;
}

// ---- embeddings -----------------------------------------------------------------------

BertEmbeddings::BertEmbeddings(const BertConfig& c) {
  word_embeddings = register_module("word_embeddings", embedding_layer(c.vocab_size, c, c.pad_token_id));
  position_embeddings = register_module("position_embeddings", embedding_layer(c.max_position_embeddings, c));
  token_type_embeddings = register_module("token_type_embeddings", embedding_layer(c.type_vocab_size, c));
  LayerNorm = register_module("LayerNorm", layer_norm_layer(c));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  const int64_t T = input_ids.size(1);
  const int64_t max_t = position_embeddings->weight.size(0);
  FRUGAL_CHECK(T <= max_t, "BertEmbeddings: sequence length ", T, " exceeds max_position_embeddings ", max_t);
  const Tensor positions = arange(T, {kInt64, input_ids.device()});  // (T)
  Tensor h = (*word_embeddings)(input_ids) + (*token_type_embeddings)(token_type_ids);
  h = h + (*position_embeddings)(positions);  // (B, T, C) + (T, C)
  return (*dropout)((*LayerNorm)(h));
}

// ---- encoder layer ---------------------------------------------------------------------

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : num_heads(c.num_attention_heads), dropout_p(c.attention_probs_dropout_prob) {
  query = register_module("query", linear_layer(c.hidden_size, c.hidden_size, c));
  key = register_module("key", linear_layer(c.hidden_size, c.hidden_size, c));
  value = register_module("value", linear_layer(c.hidden_size, c.hidden_size, c));
}

Tensor BertSelfAttention::forward(const Tensor& h, const Tensor& mask) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  const int64_t D = h.size(2) / num_heads;
  const Tensor q = nn::split_heads((*query)(h), num_heads), k = nn::split_heads((*key)(h), num_heads),
               v = nn::split_heads((*value)(h), num_heads);  // (B, H, T, D)
  // The mask is made in the scores' dtype (the projections' output: float16 under autocast),
  // saturating (Note [BERT mask in low precision]).
  const Tensor m = bert_mask_in(mask, q.dtype());
  const Tensor ctx = scaled_dot_product_attention(q, k, v, m, false, is_training() ? dropout_p : 0.0,
                                                  1.0 / std::sqrt(double(D)));  // (B, H, T, D)
  return nn::merge_heads(ctx);                                                  // (B, T, C)
}

BertResidualOutput::BertResidualOutput(int64_t in_features, const BertConfig& c) {
  dense = register_module("dense", linear_layer(in_features, c.hidden_size, c));
  LayerNorm = register_module("LayerNorm", layer_norm_layer(c));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
}

Tensor BertResidualOutput::forward(const Tensor& h, const Tensor& residual) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  return (*LayerNorm)((*dropout)((*dense)(h)) + residual);
}

BertLayer::BertLayer(const BertConfig& c) {
  auto attention = register_module("attention", std::make_shared<Group>("BertAttention"));
  self_attention = attention->add("self", std::make_shared<BertSelfAttention>(c));
  attention_output = attention->add("output", std::make_shared<BertResidualOutput>(c.hidden_size, c));
  auto intermediate = register_module("intermediate", std::make_shared<Group>("BertIntermediate"));
  intermediate_dense = intermediate->add("dense", linear_layer(c.hidden_size, c.intermediate_size, c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.intermediate_size, c));
}

Tensor BertLayer::forward(const Tensor& h, const Tensor& mask) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  const Tensor a = attention_output->forward(self_attention->forward(h, mask), h);
  return output->forward(gelu((*intermediate_dense)(a)), a);
}

// ---- model -----------------------------------------------------------------------------

// Note [BERT mask in low precision]
// Hugging Face adds finfo(dtype).min where attention_mask is 0 (get_extended_attention_mask):
// a finite value, so a sequence that is all padding still attends to its (padding) keys, and
// in float32 uniformly, since the scores vanish next to -3.4e38. BertModel makes the mask once
// in float32 and each layer converts it to its scores' dtype. A plain conversion rounds
// float32's lowest to -inf in float16 and bfloat16, and a row whose every key is -inf gets
// zero weights (the attention ops' rule for rows without keys): the same weights gave
// different outputs at all-padding sequences in float32 and in float16, bfloat16 or under
// autocast. bert_mask_in saturates instead, to the lowest finite value of the scores' dtype:
// Hugging Face's mask for a model of that dtype. Rows with at least one real key do not change
// (their masked keys' weights underflow to 0 either way).
Tensor bert_mask_in(const Tensor& additive_mask, DType dtype) {
  if (!additive_mask.defined() || additive_mask.dtype() == dtype) return additive_mask;
  const double lowest = lowest_of(dtype);
  return clamp(additive_mask, lowest, -lowest).to(dtype);
}

Tensor bert_additive_mask(const Tensor& attention_mask, DType dtype) {
  FRUGAL_CHECK(attention_mask.dim() == 2, "bert_additive_mask: attention_mask must be (B, T), got ",
               attention_mask.describe());
  const double lowest = lowest_of(dtype);
  const Tensor keep = attention_mask.to(dtype);
  return ((1.0 - keep) * lowest).view({attention_mask.size(0), 1, 1, attention_mask.size(1)});
}

BertModel::BertModel(const BertConfig& c, bool add_pooling_layer)
    : config(c), memory_plan(nn::BlockMemoryPlan::from_checkpoint(c.checkpoint_blocks, c.checkpoint_policy)) {
  FRUGAL_CHECK(c.num_hidden_layers >= 0 && c.hidden_size > 0 && c.num_attention_heads > 0 &&
                   c.hidden_size % c.num_attention_heads == 0,
               "BertModel: need hidden_size > 0 divisible by num_attention_heads > 0, got ", c.hidden_size, " and ",
               c.num_attention_heads);
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  auto encoder = register_module("encoder", std::make_shared<Group>("BertEncoder"));
  layers = encoder->add("layer", std::make_shared<nn::ModuleList<BertLayer>>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<BertLayer>(c));
  if (add_pooling_layer) {
    auto pooler = register_module("pooler", std::make_shared<Group>("BertPooler"));
    pooler_dense = pooler->add("dense", linear_layer(c.hidden_size, c.hidden_size, c));
  }
}

BertModelOutput BertModel::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                   const Tensor& token_type_ids) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  constexpr const char* op = "BertModel";
  FRUGAL_CHECK(input_ids.defined() && input_ids.dim() == 2 && !is_floating(input_ids.dtype()), op,
               ": input_ids must be (B, T) integers, got ", input_ids.defined() ? input_ids.describe() : "undefined");
  check_ids(op, "attention_mask", attention_mask, input_ids);
  check_ids(op, "token_type_ids", token_type_ids, input_ids);
  // Hugging Face raises IndexError there (hidden_states[:, 0]); without a pooler (B, 0, C) is fine.
  FRUGAL_CHECK(!pooler_dense || input_ids.size(1) > 0, op,
               ": the pooler reads the first token, so the sequence length must be positive, got input_ids ",
               input_ids.describe());
  const Tensor types =
      token_type_ids.defined() ? token_type_ids : zeros(input_ids.sizes(), {kInt64, input_ids.device()});
  Tensor h = embeddings->forward(input_ids, types);
  // float32 here; each layer converts it to its scores' dtype.
  const Tensor mask = attention_mask.defined() ? bert_additive_mask(attention_mask, kFloat32) : Tensor();
  memory_plan.check_fits(num_blocks(), "BertModel");
  size_t index = 0;
  for (const auto& layer : *layers)
    h = nn::run_block(
        memory_plan, index++, [layer, mask](const Tensor& x) { return layer->forward(x, mask); }, h);
  BertModelOutput out{h, Tensor()};
  if (pooler_dense) out.pooler_output = tanh((*pooler_dense)(h.select(1, 0)));
  return out;
}

// ---- heads -----------------------------------------------------------------------------

BertForMaskedLM::BertForMaskedLM(const BertConfig& c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  auto cls = register_module("cls", std::make_shared<Group>("BertOnlyMLMHead"));
  auto predictions = cls->add("predictions", std::make_shared<Group>("BertLMPredictionHead"));
  decoder_bias = predictions->add_parameter("bias", zeros({c.vocab_size}));
  auto transform = predictions->add("transform", std::make_shared<Group>("BertPredictionHeadTransform"));
  transform_dense = transform->add("dense", linear_layer(c.hidden_size, c.hidden_size, c));
  transform_LayerNorm = transform->add("LayerNorm", layer_norm_layer(c));
  // Note [Tied weights]: the decoder's tensors are the word embeddings and the bias above.
  auto decoder = predictions->add("decoder", std::make_shared<Group>("Linear"));
  decoder->add_buffer("weight", bert->embeddings->word_embeddings->weight);
  decoder->add_buffer("bias", decoder_bias);
}

TiedKeys BertForMaskedLM::tied_keys() const {
  return {{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
          {"cls.predictions.decoder.bias", "cls.predictions.bias"}};
}

BertMlmOutput BertForMaskedLM::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                       const Tensor& token_type_ids, const Tensor& labels,
                                       const MlmForwardOptions& options) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  const Tensor h = bert->forward(input_ids, attention_mask, token_type_ids).last_hidden_state;
  const Tensor t = (*transform_LayerNorm)(gelu((*transform_dense)(h)));
  const Tensor& decoder_weight = bert->embeddings->word_embeddings->weight;
  BertMlmOutput out;
  if (labels.defined())
    FRUGAL_CHECK(labels.sizes() == input_ids.sizes(), "BertForMaskedLM: labels must have input_ids' shape ",
                 shape_str(input_ids.sizes()), ", got ", labels.describe());
  if (labels.defined() && !options.logits) {
    out.loss = linear_cross_entropy(t, decoder_weight, decoder_bias, labels);
    return out;
  }
  out.logits = linear(t, decoder_weight, decoder_bias);  // (B, T, V)
  if (labels.defined()) out.loss = cross_entropy(out.logits.reshape({-1, out.logits.size(-1)}), labels.reshape({-1}));
  return out;
}

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& c) {
  FRUGAL_CHECK(c.num_labels > 0, "BertForSequenceClassification: num_labels must be positive, got ", c.num_labels);
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/true));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
  classifier = register_module("classifier", linear_layer(c.hidden_size, c.num_labels, c));
}

BertClassifierOutput BertForSequenceClassification::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                                            const Tensor& token_type_ids, const Tensor& labels) {
  core::ModuleScope scope(this);  // multi-input forwards name themselves for the profiler
  const Tensor pooled = bert->forward(input_ids, attention_mask, token_type_ids).pooler_output;
  BertClassifierOutput out;
  out.logits = (*classifier)((*dropout)(pooled));  // (B, num_labels)
  if (labels.defined()) {
    // Note [Classifier labels]
    // Hugging Face reads labels of shape (B) or (B, 1) alike: MSELoss()(logits.squeeze(),
    // labels.squeeze()) for one label, CrossEntropyLoss()(logits.view(-1, num_labels),
    // labels.view(-1)) for more. (B, 1) regression targets against the squeezed (B) logits
    // once broadcast to (B, B) in mse_loss, a loss over every pair of samples, silently.
    // Any other shape is refused, naming both.
    const int64_t B = out.logits.size(0);
    FRUGAL_CHECK(labels.sizes() == Shape{B} || labels.sizes() == Shape({B, 1}),
                 "BertForSequenceClassification: labels must be (B) or (B, 1) with B = ", B, " (logits ",
                 out.logits.describe(), "), got ", labels.describe());
    const Tensor y = labels.reshape({B});
    // As Hugging Face's problem_type inference: one label is regression, integer labels classes.
    if (out.logits.size(1) == 1) out.loss = mse_loss(out.logits.squeeze(1), y.to(out.logits.dtype()));
    else out.loss = cross_entropy(out.logits, y);
  }
  return out;
}

}  // namespace frugal::models
