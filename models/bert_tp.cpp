#include "models/bert_tp.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "models/group.h"
#include "models/tp_util.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/init.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"

namespace frugal::models {

using parallel::CommPtr;
using parallel::tp_rank;
using parallel::tp_size;

namespace {

constexpr const char* kModel = "TensorParallelBertForMaskedLM";

std::shared_ptr<nn::LayerNorm> layer_norm_layer(const BertConfig& c) {
  return std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, nn::LayerNormOptions{.eps = c.layer_norm_eps});
}

}  // namespace

// ---- encoder layer ---------------------------------------------------------------------

TensorParallelBertLayer::TensorParallelBertLayer(const BertConfig& c, CommPtr comm, Generator* gen,
                                                 parallel::RngPtr rng)
    : heads_per_rank(tp_heads_per_rank(c.num_attention_heads, comm, kModel, "num_attention_heads")),
      head_dim(c.hidden_size / c.num_attention_heads),
      dropout{c.hidden_dropout_prob, c.attention_probs_dropout_prob, std::move(rng)},
      comm_(std::move(comm)) {
  const parallel::ColumnParallelOptions column{.bias = true, .gather_output = false, .generator = gen};
  const parallel::RowParallelOptions row{.bias = true, .input_is_parallel = true, .generator = gen};
  const int64_t C = c.hidden_size;
  auto column_layer = [&](int64_t in, int64_t out) {
    return std::make_shared<parallel::ColumnParallelLinear>(in, out, comm_, column);
  };
  auto row_layer = [&](int64_t in, int64_t out) {
    return std::make_shared<parallel::RowParallelLinear>(in, out, comm_, row);
  };
  auto attention = register_module("attention", std::make_shared<Group>("BertAttention"));
  auto self = attention->add("self", std::make_shared<Group>("BertSelfAttention"));
  query = self->add("query", column_layer(C, C));
  key = self->add("key", column_layer(C, C));
  value = self->add("value", column_layer(C, C));
  auto attention_output = attention->add("output", std::make_shared<Group>("BertSelfOutput"));
  attention_output_dense = attention_output->add("dense", row_layer(C, C));
  attention_output_LayerNorm = attention_output->add("LayerNorm", layer_norm_layer(c));
  auto intermediate = register_module("intermediate", std::make_shared<Group>("BertIntermediate"));
  intermediate_dense = intermediate->add("dense", column_layer(C, c.intermediate_size));
  auto output = register_module("output", std::make_shared<Group>("BertOutput"));
  output_dense = output->add("dense", row_layer(c.intermediate_size, C));
  output_LayerNorm = output->add("LayerNorm", layer_norm_layer(c));
}

Tensor TensorParallelBertLayer::forward(const Tensor& h, const Tensor& mask) {
  // One copy_to_region for q, k and v: one backward all-reduce of dL/dh for the three.
  const Tensor hp = parallel::copy_to_region(h, comm_);
  const Tensor q = nn::split_heads(query->forward_local(hp), heads_per_rank);
  const Tensor k = nn::split_heads(key->forward_local(hp), heads_per_rank);
  const Tensor v = nn::split_heads(value->forward_local(hp), heads_per_rank);
  const Tensor m = bert_mask_in(mask, q.dtype());  // Note [BERT mask in low precision]
  // Dropout as BertLayer's: this rank's heads from its split stream, the replicated hidden
  // outputs (after the all-reduce) from the replicated one.
  const bool train = is_training();
  const Tensor ctx = dropout.attention_over_heads(q, k, v, m, 1.0 / std::sqrt(double(head_dim)), train);
  const Tensor merged = nn::merge_heads(ctx);
  const Tensor a =
      attention_output_LayerNorm->forward(dropout.replicated(attention_output_dense->forward(merged), train) + h);
  const Tensor u = intermediate_dense->forward_local(parallel::copy_to_region(a, comm_));
  return output_LayerNorm->forward(dropout.replicated(output_dense->forward(gelu(u)), train) + a);
}

// ---- model -----------------------------------------------------------------------------

TensorParallelBertForMaskedLM::TensorParallelBertForMaskedLM(const BertConfig& c, CommPtr comm, uint64_t seed,
                                                             uint64_t dropout_seed)
    : config(c),
      memory_plan(nn::BlockMemoryPlan::from_checkpoint(c.checkpoint_blocks, c.checkpoint_policy)),
      rng(std::make_shared<parallel::TensorParallelRng>(dropout_seed, comm)),
      comm_(std::move(comm)) {
  const int p = tp_size(comm_);
  FRUGAL_CHECK(c.hidden_size > 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, kModel,
               ": need hidden_size > 0 divisible by num_attention_heads > 0, got ", c.hidden_size, " and ",
               c.num_attention_heads);
  FRUGAL_CHECK(c.vocab_size % p == 0 && c.intermediate_size % p == 0, kModel, ": vocab_size (", c.vocab_size,
               ") and intermediate_size (", c.intermediate_size, ") must be divisible by the tensor-parallel size ", p);
  FRUGAL_CHECK(c.hidden_dropout_prob >= 0.0 && c.hidden_dropout_prob < 1.0 && c.attention_probs_dropout_prob >= 0.0 &&
                   c.attention_probs_dropout_prob < 1.0,
               kModel, ": hidden_dropout_prob and attention_probs_dropout_prob must be in [0, 1), got ",
               c.hidden_dropout_prob, " and ", c.attention_probs_dropout_prob);
  Generator gen(seed);  // the same on every rank: replicated tensors get the same values
  const Device device = comm_ ? comm_->device() : kCPU;

  auto bert = register_module("bert", std::make_shared<Group>("BertModel"));
  auto embeddings = bert->add("embeddings", std::make_shared<Group>("BertEmbeddings"));
  word_embeddings = embeddings->add(
      "word_embeddings", std::make_shared<parallel::VocabParallelEmbedding>(c.vocab_size, c.hidden_size, comm_, &gen));
  word_embeddings->padding_idx = c.pad_token_id;
  position_embeddings =
      embeddings->add("position_embeddings", std::make_shared<nn::Embedding>(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings =
      embeddings->add("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, c.hidden_size));
  embeddings_LayerNorm = embeddings->add("LayerNorm", layer_norm_layer(c));
  auto encoder = bert->add("encoder", std::make_shared<Group>("BertEncoder"));
  layers = encoder->add("layer", std::make_shared<nn::ModuleList<TensorParallelBertLayer>>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<TensorParallelBertLayer>(c, comm_, &gen, rng));

  auto cls = register_module("cls", std::make_shared<Group>("BertOnlyMLMHead"));
  auto predictions = cls->add("predictions", std::make_shared<Group>("BertLMPredictionHead"));
  decoder_bias = predictions->add_parameter("bias", zeros({c.vocab_size / p}));
  auto transform = predictions->add("transform", std::make_shared<Group>("BertPredictionHeadTransform"));
  transform_dense = transform->add("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  transform_LayerNorm = transform->add("LayerNorm", layer_norm_layer(c));
  // Note [Tied weights] in models/bert.h: the decoder's tensors are the word-embedding
  // shard and the bias shard above, registered as buffers.
  auto decoder = predictions->add("decoder", std::make_shared<Group>("VocabParallelLinear"));
  decoder->add_buffer("weight", word_embeddings->weight);
  decoder->add_buffer("bias", decoder_bias);

  // Which keys are split, and along which dim.
  for (const auto& [key, split] : tp_linear_splits(*this)) split_dims_[key] = split.dim;
  split_dims_["bert.embeddings.word_embeddings.weight"] = 0;
  for (const char* key : {"cls.predictions.bias", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})
    split_dims_[key] = 0;

  // Hugging Face's _init_weights on the full tensors (Linear / Embedding weights
  // N(0, initializer_range), biases zero, the padding row zero; LayerNorm 1 and 0), drawn
  // in registration order from `gen` on every rank; each rank keeps its shard.
  to(device);  // in place: the decoder's buffers stay the same tensors
  autograd::NoGradGuard no_grad;
  for (const auto& [key, local] : named_parameters()) {
    if (key.find("LayerNorm") != std::string::npos) continue;
    const bool is_bias = key.size() >= 4 && key.compare(key.size() - 4, 4, "bias") == 0;
    if (is_bias) {
      nn::init::zeros_(local);
      continue;
    }
    const int64_t dim = split_dim(key);
    Tensor full = empty(tp_full_shape(local, {dim}, p));
    nn::init::normal_(full, 0.0, c.initializer_range, &gen);
    if (key == "bert.embeddings.word_embeddings.weight" && c.pad_token_id >= 0)
      nn::init::zeros_(full.select(0, c.pad_token_id));
    local.detach().copy_(tp_shard_of(full, {dim}, tp_rank(comm_), p).to(local.device()));
  }
}

int64_t TensorParallelBertForMaskedLM::split_dim(const std::string& key) const {
  auto it = split_dims_.find(key);
  return it == split_dims_.end() ? -1 : it->second;
}

TiedKeys TensorParallelBertForMaskedLM::tied_keys() const {
  return {{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
          {"cls.predictions.decoder.bias", "cls.predictions.bias"}};
}

TensorParallelMlmOutput TensorParallelBertForMaskedLM::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                                               const Tensor& token_type_ids, const Tensor& labels) {
  FRUGAL_CHECK(input_ids.defined() && input_ids.dim() == 2 && !is_floating(input_ids.dtype()), kModel,
               ": input_ids must be (B, T) integers, got ", input_ids.defined() ? input_ids.describe() : "undefined");
  for (const auto& [name, t] : {std::pair{"attention_mask", attention_mask},
                                std::pair{"token_type_ids", token_type_ids}, std::pair{"labels", labels}}) {
    FRUGAL_CHECK(!t.defined() || t.sizes() == input_ids.sizes(), kModel, ": ", name, " must have input_ids' shape ",
                 shape_str(input_ids.sizes()), ", got ", t.describe());
  }
  const int64_t T = input_ids.size(1);
  FRUGAL_CHECK(T <= config.max_position_embeddings, kModel, ": sequence length ", T,
               " exceeds max_position_embeddings ", config.max_position_embeddings);
  const Tensor types =
      token_type_ids.defined() ? token_type_ids : zeros(input_ids.sizes(), {kInt64, input_ids.device()});
  // As BertEmbeddings::forward, in the same order of additions.
  Tensor h = word_embeddings->forward(input_ids) + token_type_embeddings->forward(types);
  h = h + position_embeddings->forward(arange(T, {kInt64, input_ids.device()}));
  h = dropout(embeddings_LayerNorm->forward(h), config.hidden_dropout_prob, is_training(), &rng->replicated);
  const Tensor mask = attention_mask.defined() ? bert_additive_mask(attention_mask, kFloat32) : Tensor();
  // As BertModel's encoder: each layer as memory_plan says (Note [Tensor-parallel block memory]).
  memory_plan.check_fits(num_blocks(), "TensorParallelBertForMaskedLM");
  size_t index = 0;
  for (const auto& layer : *layers)
    h = nn::run_block(
        memory_plan, index++, [layer, mask](const Tensor& x) { return layer->forward(x, mask); }, h);
  const Tensor t = transform_LayerNorm->forward(gelu(transform_dense->forward(h)));
  // The decoder is column-parallel over the vocabulary, its weight the word-embedding shard.
  TensorParallelMlmOutput out;
  out.local_logits = linear(parallel::copy_to_region(t, comm_), word_embeddings->weight, decoder_bias);
  if (labels.defined()) out.loss = parallel::vocab_parallel_cross_entropy(out.local_logits, labels, comm_, -100);
  return out;
}

Tensor TensorParallelBertForMaskedLM::gather_logits(const Tensor& local_logits) const {
  return parallel::gather_from_region(local_logits, comm_);
}

Tensor TensorParallelBertForMaskedLM::gather_full(const std::string& key, const Tensor& local) const {
  return tp_gather_full(local, {split_dim(key)}, comm_);
}

// ---- checkpoints ------------------------------------------------------------------------

void load_full_state_dict(TensorParallelBertForMaskedLM& model, const std::map<std::string, Tensor>& full_in) {
  std::map<std::string, Tensor> full = full_in;
  for (const auto& [alias, source] : model.tied_keys()) {
    if (!full.count(alias) && full.count(source)) full[alias] = full[source];
    if (!full.count(source) && full.count(alias)) full[source] = full[alias];
  }
  tp_load_full(
      model.state_dict(), full, [&](const std::string& key) { return TensorSplit{model.split_dim(key)}; }, model.comm(),
      kModel);
}

void load_full_safetensors(TensorParallelBertForMaskedLM& model, const std::string& path) {
  load_full_state_dict(model, nn::load_safetensors(path).tensors);
}

nn::NamedTensors gather_full_state_dict(const TensorParallelBertForMaskedLM& model) {
  nn::NamedTensors out;
  for (const auto& [key, local] : model.state_dict()) out.emplace_back(key, model.gather_full(key, local));
  return out;
}

}  // namespace frugal::models
