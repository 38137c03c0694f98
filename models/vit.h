#pragma once
// Vision Transformer (Dosovitskiy et al., 2020) as torchvision's VisionTransformer builds
// it, with its parameter names ("conv_proj.weight", "class_token", "encoder.pos_embedding",
// "encoder.layers.encoder_layer_0.self_attention.in_proj_weight", "heads.head.weight"), so
// torchvision checkpoints load unchanged.
//
//   auto vit = std::make_shared<models::VisionTransformer>(models::vit_b_16());
//   Tensor logits = vit->forward(images);  // (N, 3, 224, 224) -> (N, 1000)
#include <map>
#include <memory>
#include <string>

#include "autograd/checkpoint.h"
#include "nn/attention.h"
#include "nn/block_memory.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/ops/interpolate.h"  // InterpolateMode

namespace frugal::json {
struct Value;
}

namespace frugal::models {

struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t in_channels = 3;  // torchvision fixes 3; other values change conv_proj.weight's shape only
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t hidden_dim = 768;
  int64_t mlp_dim = 3072;
  int64_t num_classes = 1000;
  double dropout = 0.0;
  double attention_dropout = 0.0;
  /// Run each encoder block under autograd::checkpoint (recomputed in backward).
  bool checkpoint_blocks = false;
  /// What a checkpointed block keeps: Full (its input only) or Selective (also the outputs
  /// of its projections and attention: Note [Selective checkpoint]).
  autograd::CheckpointPolicy checkpoint_policy = autograd::CheckpointPolicy::Full;

  /// Reads frugal's ViT config JSON: the field names above as keys, all optional (defaults:
  /// vit_b_16). Unknown keys, values out of range (Note [Config ranges]) and sizes that do
  /// not divide (image_size % patch_size, hidden_dim % num_heads) throw, naming the key and
  /// `file`, the config's path (if it came from one).
  static ViTConfig from_json(const json::Value& config, const std::string& file = "");
};

ViTConfig vit_b_16();  // 12 layers, 12 heads, hidden 768, mlp 3072, 16x16 patches of 224x224
ViTConfig vit_b_32();  // the same with 32x32 patches
ViTConfig vit_l_16();  // 24 layers, 16 heads, hidden 1024, mlp 4096, 16x16 patches

/// Pre-norm transformer block: x + attn(ln_1(x)), then y + mlp(ln_2(y)). Children ln_1,
/// self_attention (nn::MultiheadAttention, batch first), dropout, ln_2, mlp (a Sequential
/// Linear, GELU, Dropout, Linear, Dropout: keys mlp.0 and mlp.3).
class EncoderBlock : public nn::UnaryModule {
 public:
  explicit EncoderBlock(const ViTConfig& c);
  /// x (N, S, hidden) -> (N, S, hidden).
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "EncoderBlock"; }

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::MultiheadAttention> self_attention;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Sequential> mlp;
};

/// conv_proj (patches), class_token, encoder (pos_embedding, dropout, layers.encoder_layer_N,
/// ln) and heads.head. Initialised as torchvision: conv_proj trunc_normal(std sqrt(1 /
/// fan_in)) and zero bias, class_token zero, pos_embedding N(0, 0.02), MLP Linear
/// xavier_uniform with N(0, 1e-6) biases, heads.head zero.
class VisionTransformer : public nn::UnaryModule {
 public:
  explicit VisionTransformer(const ViTConfig& c);
  /// x (N, in_channels, image_size, image_size) -> logits (N, num_classes).
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "VisionTransformer"; }

  Tensor class_token;    // (1, 1, hidden)
  Tensor pos_embedding;  // "encoder.pos_embedding", (1, patches + 1, hidden)
  std::shared_ptr<nn::Conv2d> conv_proj;
  std::shared_ptr<nn::Dropout> encoder_dropout;  // "encoder.dropout"
  std::vector<std::shared_ptr<EncoderBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> encoder_ln;  // "encoder.ln"
  std::shared_ptr<nn::Linear> head;           // "heads.head"
  const ViTConfig config;
  /// What each encoder block keeps for backward (Note [Block memory plan]); starts as
  /// config.checkpoint_blocks and checkpoint_policy say. nn::BlockPlanner sets it.
  nn::BlockMemoryPlan memory_plan;
  int64_t num_blocks() const { return static_cast<int64_t>(blocks.size()); }
};

/// torchvision.models.vision_transformer.interpolate_embeddings: fits a checkpoint's
/// "encoder.pos_embedding" (1, 1 + n * n, hidden), made for n x n patches, to a model for
/// `image_size` images of `patch_size` patches (m = image_size / patch_size, rounded down, as
/// torchvision): the class token's row is kept and the n x n grid resized to m x m by
/// interpolate (bicubic with align_corners=True unless `mode` says otherwise, as torchvision),
/// so a model trained at 224 fine-tunes at 384. Changes nothing when n == m. Throws, naming the
/// key and shapes, when the key is missing, its batch dim is not 1, or its rows less one are
/// not a square.
///
///   auto state = nn::load_safetensors("vit_b_16.safetensors").tensors;
///   models::interpolate_embeddings(state, 384, 16);
///   ViTConfig c = models::vit_b_16();
///   c.image_size = 384;
///   models::VisionTransformer(c).load_state_dict(state);
void interpolate_embeddings(std::map<std::string, Tensor>& state, int64_t image_size, int64_t patch_size,
                            InterpolateMode mode = InterpolateMode::Bicubic);

}  // namespace frugal::models
