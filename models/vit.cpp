#include "models/vit.h"

#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/ops/all.h"
#include "models/config_json.h"
#include "models/group.h"
#include "nn/activation.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::models {

namespace {
std::shared_ptr<nn::LayerNorm> layer_norm_layer(int64_t dim) {
  return std::make_shared<nn::LayerNorm>(Shape{dim}, nn::LayerNormOptions{.eps = 1e-6});
}

// torchvision's MLPBlock init: xavier_uniform weights, N(0, 1e-6) biases.
std::shared_ptr<nn::Linear> mlp_linear(int64_t in, int64_t out) {
  auto l = std::make_shared<nn::Linear>(in, out);
  nn::init::xavier_uniform_(l->weight);
  nn::init::normal_(l->bias, 0.0, 1e-6);
  return l;
}
}  // namespace

ViTConfig vit_b_16() { return ViTConfig{}; }
ViTConfig vit_b_32() {
  ViTConfig c;
  c.patch_size = 32;
  return c;
}
ViTConfig vit_l_16() {
  ViTConfig c;
  c.num_layers = 24, c.num_heads = 16, c.hidden_dim = 1024, c.mlp_dim = 4096;
  return c;
}

ViTConfig ViTConfig::from_json(const json::Value& j, const std::string& file) {
  const std::string what = config_name("ViT", file);
  json_check_keys(j,
                  {"image_size", "patch_size", "in_channels", "num_layers", "num_heads", "hidden_dim", "mlp_dim",
                   "num_classes", "dropout", "attention_dropout", "checkpoint_blocks", "checkpoint_policy"},
                  what);
  ViTConfig c;
  c.image_size = json_int(j, "image_size", c.image_size, what, 1, kMaxConfigDim);
  c.patch_size = json_int(j, "patch_size", c.patch_size, what, 1, kMaxConfigDim);
  c.in_channels = json_int(j, "in_channels", c.in_channels, what, 1, kMaxConfigDim);
  c.num_layers = json_int(j, "num_layers", c.num_layers, what, 1, kMaxConfigLayers);
  c.num_heads = json_int(j, "num_heads", c.num_heads, what, 1, kMaxConfigDim);
  c.hidden_dim = json_int(j, "hidden_dim", c.hidden_dim, what, 1, kMaxConfigDim);
  c.mlp_dim = json_int(j, "mlp_dim", c.mlp_dim, what, 1, kMaxConfigDim);
  c.num_classes = json_int(j, "num_classes", c.num_classes, what, 1, kMaxConfigDim);
  c.dropout = json_double(j, "dropout", c.dropout, what, 0.0, 1.0);
  c.attention_dropout = json_double(j, "attention_dropout", c.attention_dropout, what, 0.0, 1.0);
  c.checkpoint_blocks = json_bool(j, "checkpoint_blocks", c.checkpoint_blocks, what);
  c.checkpoint_policy = json_checkpoint_policy(j, c.checkpoint_policy, what);
  FRUGAL_CHECK(c.image_size % c.patch_size == 0, what, ": 'image_size' (", c.image_size,
               ") must be a multiple of 'patch_size' (", c.patch_size, ")");
  FRUGAL_CHECK(c.hidden_dim % c.num_heads == 0, what, ": 'hidden_dim' (", c.hidden_dim,
               ") must be divisible by 'num_heads' (", c.num_heads, ")");
  return c;
}

EncoderBlock::EncoderBlock(const ViTConfig& c) {
  ln_1 = register_module("ln_1", layer_norm_layer(c.hidden_dim));
  self_attention = register_module(
      "self_attention", std::make_shared<nn::MultiheadAttention>(
                            c.hidden_dim, c.num_heads,
                            nn::MultiheadAttentionOptions{.dropout = c.attention_dropout, .batch_first = true}));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  ln_2 = register_module("ln_2", layer_norm_layer(c.hidden_dim));
  mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                   mlp_linear(c.hidden_dim, c.mlp_dim), std::make_shared<nn::GELU>(),
                                   std::make_shared<nn::Dropout>(c.dropout), mlp_linear(c.mlp_dim, c.hidden_dim),
                                   std::make_shared<nn::Dropout>(c.dropout)}));
}

Tensor EncoderBlock::forward(const Tensor& input) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  // Each layer norm's output (fp32 under autocast: 74 MiB for ViT-B/16 at batch 128) is let go
  // once the projection after it has run, not when the block returns: the end of a
  // checkpoint's replay is the replayed block's memory peak (Note [Checkpoint recompute]).
  Tensor x;
  {
    const Tensor h = (*ln_1)(input);
    x = (*dropout)(self_attention->forward(h, h, h).output) + input;
  }
  return x + mlp->consume((*ln_2)(x));
}

VisionTransformer::VisionTransformer(const ViTConfig& c)
    : config(c), memory_plan(nn::BlockMemoryPlan::from_checkpoint(c.checkpoint_blocks, c.checkpoint_policy)) {
  FRUGAL_CHECK(c.image_size > 0 && c.patch_size > 0 && c.image_size % c.patch_size == 0,
               "VisionTransformer: image_size (", c.image_size, ") must be a positive multiple of patch_size (",
               c.patch_size, ")");
  FRUGAL_CHECK(c.hidden_dim > 0 && c.num_heads > 0 && c.hidden_dim % c.num_heads == 0,
               "VisionTransformer: hidden_dim (", c.hidden_dim, ") must be divisible by num_heads (", c.num_heads, ")");
  const int64_t side = c.image_size / c.patch_size;
  int64_t patches;
  FRUGAL_CHECK(!__builtin_mul_overflow(side, side, &patches) && patches < INT64_MAX, "VisionTransformer: ", side, " x ",
               side, " patches overflow int64");
  // Registration order is torchvision's: conv_proj, class_token, encoder, heads.
  conv_proj =
      register_module("conv_proj", std::make_shared<nn::Conv2d>(c.in_channels, c.hidden_dim, c.patch_size,
                                                                nn::Conv2dModuleOptions{.stride = c.patch_size}));
  const double fan_in = double(c.in_channels) * double(c.patch_size) * double(c.patch_size);
  nn::init::trunc_normal_(conv_proj->weight, 0.0, std::sqrt(1.0 / fan_in));
  nn::init::zeros_(conv_proj->bias);
  class_token = register_parameter("class_token", zeros({1, 1, c.hidden_dim}));

  auto encoder = register_module("encoder", std::make_shared<Group>("Encoder"));
  pos_embedding = encoder->add_parameter("pos_embedding", empty({1, patches + 1, c.hidden_dim}));
  nn::init::normal_(pos_embedding, 0.0, 0.02);
  encoder_dropout = encoder->add("dropout", std::make_shared<nn::Dropout>(c.dropout));
  auto layers = encoder->add("layers", std::make_shared<Group>("Sequential"));
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks.push_back(layers->add("encoder_layer_" + std::to_string(i), std::make_shared<EncoderBlock>(c)));
  encoder_ln = encoder->add("ln", layer_norm_layer(c.hidden_dim));

  auto heads = register_module("heads", std::make_shared<Group>("Sequential"));
  head = heads->add("head", std::make_shared<nn::Linear>(c.hidden_dim, c.num_classes));
  nn::init::zeros_(head->weight);
  nn::init::zeros_(head->bias);
}

Tensor VisionTransformer::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  const ViTConfig& c = config;
  FRUGAL_CHECK(x.dim() == 4 && x.size(1) == c.in_channels && x.size(2) == c.image_size && x.size(3) == c.image_size,
               "VisionTransformer: expected input (N, ", c.in_channels, ", ", c.image_size, ", ", c.image_size,
               "), got ", x.describe());
  const int64_t N = x.size(0);
  // (N, C, H, W) -> (N, hidden, H/p, W/p) -> (N, patches, hidden)
  Tensor h = (*conv_proj)(x).flatten(2).transpose(1, 2);
  h = cat({class_token.expand({N, -1, -1}), h}, 1);  // (N, patches + 1, hidden)
  h = (*encoder_dropout)(h + pos_embedding);
  memory_plan.check_fits(num_blocks(), "VisionTransformer");
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::shared_ptr<EncoderBlock> block = blocks[i];  // owned by the closure: backward may replay it
    h = nn::run_block(
        memory_plan, i, [block](const Tensor& in) { return (*block)(in); }, h);
  }
  h = (*encoder_ln)(h);
  return (*head)(h.select(1, 0));  // the class token
}

void interpolate_embeddings(std::map<std::string, Tensor>& state, int64_t image_size, int64_t patch_size,
                            InterpolateMode mode) {
  constexpr const char* op = "interpolate_embeddings";
  const char* key = "encoder.pos_embedding";
  const auto it = state.find(key);
  FRUGAL_CHECK(it != state.end(), op, ": the state dict has no '", key, "'");
  FRUGAL_CHECK(image_size > 0 && patch_size > 0 && image_size >= patch_size, op, ": image_size ", image_size,
               " and patch_size ", patch_size, " must be positive, with at least one patch");
  const Tensor pos = it->second;
  FRUGAL_CHECK(pos.dim() == 3 && pos.size(0) == 1 && pos.size(1) >= 1, op, ": '", key, "' is ", pos.describe(),
               "; expected (1, 1 + patches, hidden)");
  const int64_t hidden = pos.size(2), patches = pos.size(1) - 1;
  const auto n = static_cast<int64_t>(std::llround(std::sqrt(double(patches))));
  FRUGAL_CHECK(n * n == patches, op, ": '", key, "' ", pos.describe(), " has ", patches,
               " patch rows, not a square number");
  const int64_t m = image_size / patch_size;
  if (m == n) return;
  autograd::NoGradGuard no_grad;
  // (1, n n, hidden) -> (1, hidden, n, n), resized, -> (1, m m, hidden), after the class row.
  const Tensor grid = pos.slice(1, 1, 1 + patches).permute({0, 2, 1}).reshape({1, hidden, n, n});
  InterpolateOptions o{.size = Int2{m, m}, .mode = mode};
  if (interpolates(mode)) o.align_corners = true;
  const Tensor resized = interpolate(grid, o).reshape({1, hidden, m * m}).permute({0, 2, 1});
  it->second = cat({pos.slice(1, 0, 1), resized}, 1).contiguous();
}

}  // namespace frugal::models
