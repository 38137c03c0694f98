#include "nn/layers.h"

#include "autograd/ops/dropout.h"
#include "autograd/ops/index.h"
#include "autograd/ops/norm.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::nn {

Dropout::Dropout(double p) : p_(p) { FRUGAL_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got ", p); }
Tensor Dropout::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return dropout(x, p_, is_training());
}
std::string Dropout::extra_repr() const { return "p=" + std::to_string(p_); }

LayerNorm::LayerNorm(Shape normalized_shape, LayerNormOptions options)
    : shape_(std::move(normalized_shape)), eps_(options.eps) {
  FRUGAL_CHECK(!shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(shape_));
    bias = register_parameter("bias", zeros(shape_));
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return layer_norm(x, shape_, weight, bias, eps_);
}
std::string LayerNorm::extra_repr() const {
  return "normalized_shape=" + shape_str(shape_) + ", eps=" + std::to_string(eps_);
}

Embedding::Embedding(int64_t num, int64_t dim, EmbeddingOptions options) {
  FRUGAL_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got ", num, " x ", dim);
  if (options.padding_idx) {
    const int64_t i = *options.padding_idx;
    FRUGAL_CHECK(i >= -num && i < num, "Embedding: padding_idx ", i, " out of range for ", num, " embeddings");
    padding_idx_ = i < 0 ? i + num : i;  // python-style negative index: -1 is the last row
  }
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight);
  if (padding_idx_) init::zeros_(weight.select(0, *padding_idx_));
}
Tensor Embedding::forward(const Tensor& indices) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return embedding(weight, indices, padding_idx_);
}
std::string Embedding::extra_repr() const {
  return std::to_string(weight.size(0)) + ", " + std::to_string(weight.size(1)) +
         (padding_idx_ ? ", padding_idx=" + std::to_string(*padding_idx_) : "");
}

}  // namespace frugal::nn
