#include "models/vit_tp.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "models/group.h"
#include "nn/attention.h"
#include "nn/init.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"

namespace frugal::models {

using parallel::CommPtr;
using parallel::tp_rank;
using parallel::tp_size;

namespace {

constexpr const char* kModel = "TensorParallelVisionTransformer";

std::shared_ptr<nn::LayerNorm> layer_norm_layer(int64_t dim) {
  return std::make_shared<nn::LayerNorm>(Shape{dim}, nn::LayerNormOptions{.eps = 1e-6});
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_layer_norm(const std::string& key) {
  return key.find(".ln_1.") != std::string::npos || key.find(".ln_2.") != std::string::npos ||
         key.rfind("encoder.ln.", 0) == 0;
}

/// torchvision's init of the full tensor `key` (as models::VisionTransformer's), drawn from
/// `gen`; not for LayerNorms.
void init_full(const std::string& key, const Tensor& full, const ViTConfig& c, Generator* gen) {
  namespace init = nn::init;
  if (key == "conv_proj.weight") {
    init::trunc_normal_(full, 0.0, std::sqrt(1.0 / double(c.in_channels * c.patch_size * c.patch_size)), -2.0, 2.0,
                        gen);
  } else if (key == "encoder.pos_embedding") {
    init::normal_(full, 0.0, 0.02, gen);
  } else if (ends_with(key, "in_proj_weight") || ends_with(key, "mlp.0.weight") || ends_with(key, "mlp.3.weight")) {
    init::xavier_uniform_(full, 1.0, gen);
  } else if (ends_with(key, "mlp.0.bias") || ends_with(key, "mlp.3.bias")) {
    init::normal_(full, 0.0, 1e-6, gen);
  } else if (ends_with(key, "out_proj.weight")) {
    init::kaiming_uniform_(full, std::sqrt(5.0), init::FanMode::FanIn, gen);  // nn.Linear's
  } else {
    // conv_proj.bias, class_token, in_proj_bias, out_proj.bias, heads.head.*
    FRUGAL_CHECK(key == "conv_proj.bias" || key == "class_token" || ends_with(key, "in_proj_bias") ||
                     ends_with(key, "out_proj.bias") || key.rfind("heads.head.", 0) == 0,
                 kModel, ": no init for parameter '", key, "'");
    init::zeros_(full);
  }
}

}  // namespace

// ---- encoder block ---------------------------------------------------------------------

TensorParallelEncoderBlock::TensorParallelEncoderBlock(const ViTConfig& c, CommPtr comm, Generator* gen,
                                                       parallel::RngPtr rng)
    : heads_per_rank(tp_heads_per_rank(c.num_heads, comm, kModel, "num_heads")),
      head_dim(c.hidden_dim / c.num_heads),
      dropout{c.dropout, c.attention_dropout, std::move(rng)},
      comm_(std::move(comm)) {
  const int64_t E = c.hidden_dim, local_qkv = 3 * heads_per_rank * head_dim;
  // Registration order is torchvision's: ln_1, self_attention, (dropout), ln_2, mlp.
  ln_1 = register_module("ln_1", layer_norm_layer(E));
  auto attention = register_module("self_attention", std::make_shared<Group>("MultiheadAttention"));
  in_proj_weight = attention->add_parameter("in_proj_weight", zeros({local_qkv, E}));
  in_proj_bias = attention->add_parameter("in_proj_bias", zeros({local_qkv}));
  out_proj = attention->add(
      "out_proj", std::make_shared<parallel::RowParallelLinear>(
                      E, E, comm_, parallel::RowParallelOptions{.input_is_parallel = true, .generator = gen}));
  ln_2 = register_module("ln_2", layer_norm_layer(E));
  auto mlp = register_module("mlp", std::make_shared<Group>("MLPBlock"));
  mlp_0 = mlp->add("0",
                   std::make_shared<parallel::ColumnParallelLinear>(
                       E, c.mlp_dim, comm_, parallel::ColumnParallelOptions{.gather_output = false, .generator = gen}));
  mlp_3 = mlp->add("3",
                   std::make_shared<parallel::RowParallelLinear>(
                       c.mlp_dim, E, comm_, parallel::RowParallelOptions{.input_is_parallel = true, .generator = gen}));
}

Tensor TensorParallelEncoderBlock::forward(const Tensor& input) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  const Tensor h = (*ln_1)(input);
  // This rank's heads of q, k and v from one local product (the shard is [q; k; v]).
  const std::vector<Tensor> qkv =
      chunk(linear(parallel::copy_to_region(h, comm_), in_proj_weight, in_proj_bias), 3, -1);
  // Dropout as EncoderBlock's: this rank's heads and MLP columns from its split stream, the
  // replicated outputs (after the all-reduce) from the replicated one.
  const bool train = is_training();
  const Tensor ctx = dropout.attention_over_heads(
      nn::split_heads(qkv[0], heads_per_rank), nn::split_heads(qkv[1], heads_per_rank),
      nn::split_heads(qkv[2], heads_per_rank), Tensor(), 1.0 / std::sqrt(double(head_dim)), train);
  const Tensor merged = nn::merge_heads(ctx);
  const Tensor x = dropout.replicated(out_proj->forward(merged), train) + input;
  const Tensor a = dropout.split(gelu(mlp_0->forward((*ln_2)(x))), train);  // mlp.2
  return x + dropout.replicated(mlp_3->forward(a), train);                  // mlp.4
}

// ---- model -----------------------------------------------------------------------------

TensorParallelVisionTransformer::TensorParallelVisionTransformer(const ViTConfig& c, CommPtr comm, uint64_t seed,
                                                                 uint64_t dropout_seed)
    : config(c),
      memory_plan(nn::BlockMemoryPlan::from_checkpoint(c.checkpoint_blocks, c.checkpoint_policy)),
      rng(std::make_shared<parallel::TensorParallelRng>(dropout_seed, comm)),
      comm_(std::move(comm)) {
  const int p = tp_size(comm_);
  FRUGAL_CHECK(c.image_size > 0 && c.patch_size > 0 && c.image_size % c.patch_size == 0, kModel, ": image_size (",
               c.image_size, ") must be a positive multiple of patch_size (", c.patch_size, ")");
  FRUGAL_CHECK(c.hidden_dim > 0 && c.num_heads > 0 && c.hidden_dim % c.num_heads == 0, kModel, ": hidden_dim (",
               c.hidden_dim, ") must be divisible by num_heads (", c.num_heads, ")");
  FRUGAL_CHECK(c.num_heads % p == 0 && c.mlp_dim % p == 0, kModel, ": num_heads (", c.num_heads, ") and mlp_dim (",
               c.mlp_dim, ") must be divisible by the tensor-parallel size ", p);
  FRUGAL_CHECK(c.dropout >= 0.0 && c.dropout < 1.0 && c.attention_dropout >= 0.0 && c.attention_dropout < 1.0, kModel,
               ": dropout and attention_dropout must be in [0, 1), got dropout = ", c.dropout,
               " and attention_dropout = ", c.attention_dropout);
  Generator gen(seed);  // the same on every rank: replicated tensors get the same values
  const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);

  // Registration order is torchvision's: conv_proj, class_token, encoder, heads.
  conv_proj =
      register_module("conv_proj", std::make_shared<nn::Conv2d>(c.in_channels, c.hidden_dim, c.patch_size,
                                                                nn::Conv2dModuleOptions{.stride = c.patch_size}));
  class_token = register_parameter("class_token", zeros({1, 1, c.hidden_dim}));
  auto encoder = register_module("encoder", std::make_shared<Group>("Encoder"));
  pos_embedding = encoder->add_parameter("pos_embedding", zeros({1, patches + 1, c.hidden_dim}));
  auto layers = encoder->add("layers", std::make_shared<Group>("Sequential"));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks.push_back(layers->add("encoder_layer_" + std::to_string(i),
                                 std::make_shared<TensorParallelEncoderBlock>(c, comm_, &gen, rng)));
    const std::string attention = "encoder.layers.encoder_layer_" + std::to_string(i) + ".self_attention.";
    splits_[attention + "in_proj_weight"] = {0, 3};
    splits_[attention + "in_proj_bias"] = {0, 3};
  }
  encoder_ln = encoder->add("ln", layer_norm_layer(c.hidden_dim));
  auto heads = register_module("heads", std::make_shared<Group>("Sequential"));
  head = heads->add("head", std::make_shared<nn::Linear>(c.hidden_dim, c.num_classes));
  splits_.merge(tp_linear_splits(*this));

  // torchvision's init on the full tensors, drawn in registration order from `gen` on
  // every rank; each rank keeps its shard.
  to(comm_ ? comm_->device() : kCPU);
  autograd::NoGradGuard no_grad;
  for (const auto& [key, local] : named_parameters()) {
    if (is_layer_norm(key)) continue;  // ones and zeros, as constructed
    const TensorSplit s = split(key);
    Tensor full = empty(tp_full_shape(local, s, p));
    init_full(key, full, c, &gen);
    local.detach().copy_(tp_shard_of(full, s, tp_rank(comm_), p).to(local.device()));
  }
}

TensorSplit TensorParallelVisionTransformer::split(const std::string& key) const {
  auto it = splits_.find(key);
  return it == splits_.end() ? TensorSplit{} : it->second;
}

Tensor TensorParallelVisionTransformer::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  const ViTConfig& c = config;
  FRUGAL_CHECK(x.dim() == 4 && x.size(1) == c.in_channels && x.size(2) == c.image_size && x.size(3) == c.image_size,
               kModel, ": expected input (N, ", c.in_channels, ", ", c.image_size, ", ", c.image_size, "), got ",
               x.describe());
  const int64_t N = x.size(0);
  // As VisionTransformer::forward: patches, class token, position embedding, blocks, head.
  Tensor h = (*conv_proj)(x).flatten(2).transpose(1, 2);
  h = dropout(cat({class_token.expand({N, -1, -1}), h}, 1) + pos_embedding, c.dropout, is_training(), &rng->replicated);
  // As VisionTransformer's: each block as memory_plan says (Note [Tensor-parallel block memory]).
  memory_plan.check_fits(num_blocks(), "TensorParallelVisionTransformer");
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::shared_ptr<TensorParallelEncoderBlock> block = blocks[i];  // owned by the closure: backward may replay it
    h = nn::run_block(
        memory_plan, i, [block](const Tensor& in) { return (*block)(in); }, h);
  }
  h = (*encoder_ln)(h);
  return (*head)(h.select(1, 0));
}

Tensor TensorParallelVisionTransformer::gather_full(const std::string& key, const Tensor& local) const {
  return tp_gather_full(local, split(key), comm_);
}

// ---- checkpoints ------------------------------------------------------------------------

void load_full_state_dict(TensorParallelVisionTransformer& model, const std::map<std::string, Tensor>& full) {
  tp_load_full(
      model.state_dict(), full, [&](const std::string& key) { return model.split(key); }, model.comm(), kModel);
}

void load_full_safetensors(TensorParallelVisionTransformer& model, const std::string& path) {
  load_full_state_dict(model, nn::load_safetensors(path).tensors);
}

nn::NamedTensors gather_full_state_dict(const TensorParallelVisionTransformer& model) {
  nn::NamedTensors out;
  for (const auto& [key, local] : model.state_dict()) out.emplace_back(key, model.gather_full(key, local));
  return out;
}

}  // namespace frugal::models
