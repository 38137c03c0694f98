#pragma once
// The small BERT and ViT that the tensor-parallel model checks share: the threads-backend
// tests (tests/cpu/test_bert_tp.cpp, test_vit_tp.cpp) and the 2-GPU NCCL program
// (tests/gpu/parallel_check.cpp) build the same reference models and batch.
#include <memory>
#include <string>

#include "autograd/grad_mode.h"
#include "models/bert.h"
#include "models/vit.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::testing {

/// hidden 64, 4 heads, 2 layers, vocab 96, no dropout (the equivalence tests are deterministic).
inline models::BertConfig small_bert() {
  models::BertConfig c;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 128;
  c.max_position_embeddings = 16;
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  return c;
}

/// The reference on the CPU with non-trivial LayerNorms and biases (HF's init leaves them 1
/// and 0).
inline std::shared_ptr<models::BertForMaskedLM> bert_reference_model() {
  manual_seed(7);
  auto ref = std::make_shared<models::BertForMaskedLM>(small_bert());
  autograd::NoGradGuard no_grad;
  for (const auto& [key, t] : ref->named_parameters()) {
    if (key.find("LayerNorm.weight") != std::string::npos) nn::init::uniform_(t, 0.5, 1.5);
    else if (key.find("bias") != std::string::npos) nn::init::uniform_(t, -0.1, 0.1);
  }
  return ref;
}

struct BertBatch {
  Tensor ids, mask, types, labels;
};

/// B = 2, T = 8 on the CPU; the second sequence padded (pad id 0, mask 0) over its last 3
/// tokens.
inline BertBatch bert_batch() {
  BertBatch b;
  b.ids = from_vector<int64_t>({5, 17, 33, 50, 95, 64, 2, 81, 9, 48, 72, 30, 1, 0, 0, 0}, {2, 8});
  b.mask = from_vector<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 8});
  b.types = from_vector<int64_t>({0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1}, {2, 8});
  b.labels =
      from_vector<int64_t>({-100, 40, -100, 90, -100, -100, 3, 77, 12, -100, 60, -100, 95, -100, -100, -100}, {2, 8});
  return b;
}

/// Softmax ignores a shift shared by a query's scores, so the gradient of BERT's
/// attention.self.key.bias is zero up to rounding in every implementation: it is compared
/// against the scale of that layer's query.bias gradient, whose key this returns ("" for
/// every other key).
inline std::string bert_zero_grad_scale_key(const std::string& key) {
  const size_t at = key.find("attention.self.key.bias");
  return at == std::string::npos ? std::string() : key.substr(0, at) + "attention.self.query.bias";
}

/// 16 x 16 images, patch 4, hidden 32, 4 heads, 2 layers, 10 classes, no dropout.
inline models::ViTConfig small_vit() {
  models::ViTConfig c;
  c.image_size = 16;
  c.patch_size = 4;
  c.num_layers = 2;
  c.hidden_dim = 32;
  c.num_heads = 4;
  c.mlp_dim = 64;
  c.num_classes = 10;
  return c;
}

/// The reference on the CPU with non-trivial LayerNorms, biases, class token and head
/// (torchvision's init leaves them 1, 0 or ~0, and a zero head would zero every other
/// gradient).
inline std::shared_ptr<models::VisionTransformer> vit_reference_model() {
  manual_seed(5);
  auto ref = std::make_shared<models::VisionTransformer>(small_vit());
  autograd::NoGradGuard no_grad;
  for (const auto& [key, t] : ref->named_parameters()) {
    const bool norm_weight = key.find("ln") != std::string::npos && key.find("weight") != std::string::npos;
    if (norm_weight) nn::init::uniform_(t, 0.5, 1.5);
    else if (key.find("bias") != std::string::npos || key == "class_token") nn::init::uniform_(t, -0.1, 0.1);
    else if (key == "heads.head.weight") nn::init::normal_(t, 0.0, 0.3);
  }
  return ref;
}

}  // namespace frugal::testing
