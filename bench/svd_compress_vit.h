#pragma once
// The ViT that bench/svd_compress trains and compresses: pre-norm encoder blocks over
// square patches, learned positions, mean-pooled tokens. Unlike models/vit (torchvision's
// packed in_proj_weight), attention keeps separate query/key/value/out Linears, so each
// is a layer compress() can factorize.
#include <memory>
#include <string>

#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"

namespace frugal::bench {

struct PatchViTConfig {
  int64_t image = 28, channels = 1, patch = 7;
  int64_t dim = 64, depth = 2, heads = 4, mlp = 256, classes = 10;
  int64_t tokens() const { return (image / patch) * (image / patch); }
};

/// Self-attention with separate projections, held as UnaryModule and re-pointed on
/// replacement (see Note [Replacing a layer in place] in nn/low_rank.cpp).
class SelfAttention : public nn::UnaryModule {
 public:
  SelfAttention(int64_t dim, int64_t heads);
  Tensor forward(const Tensor& x) override;  // x: (B, T, D)
  std::string type_name() const override { return "SelfAttention"; }
  std::shared_ptr<nn::UnaryModule> query, key, value, out;

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<nn::Module>& m) override;

 private:
  std::vector<std::pair<std::string, std::shared_ptr<nn::UnaryModule>*>> slots();
  int64_t heads_;
};

class EncoderBlock : public nn::UnaryModule {
 public:
  EncoderBlock(int64_t dim, int64_t heads, int64_t mlp);
  Tensor forward(const Tensor& x) override;  // x: (B, T, D)
  std::string type_name() const override { return "EncoderBlock"; }
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<nn::Sequential> mlp;
};

/// Parameters: patch_embed (a Linear over flattened patches), pos_embed, blocks.N.{ln1,
/// attn.{query,key,value,out}, ln2, mlp.{0,2}}, norm, head.
class PatchViT : public nn::UnaryModule {
 public:
  explicit PatchViT(const PatchViTConfig& c);
  Tensor forward(const Tensor& x) override;  // x: (B, C, H, W) -> (B, classes)
  /// x (B, C, H, W) -> (B, T, C * P * P): patches in row-major order, each channel-major.
  Tensor patches(const Tensor& x) const;
  std::string type_name() const override { return "PatchViT"; }
  std::shared_ptr<nn::Linear> patch_embed, head;
  std::shared_ptr<nn::ModuleList<EncoderBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  Tensor pos;
  const PatchViTConfig config;
};

}  // namespace frugal::bench
