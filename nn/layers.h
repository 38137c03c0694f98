#pragma once
// Dropout, LayerNorm and Embedding: layers over one differentiable function each.
#include <optional>

#include "nn/module.h"

namespace frugal::nn {

/// Zeroes each element with probability p in training (scaling the rest by 1/(1-p));
/// identity in eval. The mask comes from the Philox stream, so it is reproducible.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;

 private:
  double p_;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
};

/// Normalises over the trailing `normalized_shape` dims; weight = 1, bias = 0 initially.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;

  Tensor weight, bias;

 private:
  Shape shape_;
  double eps_;
};

struct EmbeddingOptions {
  /// This row gets no gradient and starts at zero; none when unset. Negative counts from the
  /// end, as torch's (-1 is the last row).
  std::optional<int64_t> padding_idx;
};

/// A lookup table (num_embeddings, embedding_dim) initialised N(0, 1) as torch.nn.Embedding.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  std::string extra_repr() const override;

  Tensor weight;

 private:
  std::optional<int64_t> padding_idx_;  // in [0, num_embeddings)
};

}  // namespace frugal::nn
