#include "bench/svd_compress_vit.h"

#include "autograd/grad_mode.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "nn/activation.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tensor/random.h"

namespace frugal::bench {

SelfAttention::SelfAttention(int64_t dim, int64_t heads) : heads_(heads) {
  FRUGAL_CHECK(dim % heads == 0, "SelfAttention: dim ", dim, " is not a multiple of heads ", heads);
  for (auto [name, slot] : slots()) *slot = register_module(name, std::make_shared<nn::Linear>(dim, dim));
}

Tensor SelfAttention::forward(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), H = heads_;
  auto split = [&](const Tensor& t) { return t.view({B, T, H, D / H}).transpose(1, 2); };  // (B, H, T, D/H)
  const Tensor a =
      scaled_dot_product_attention(split(query->forward(x)), split(key->forward(x)), split(value->forward(x)));
  return out->forward(a.transpose(1, 2).reshape({B, T, D}));
}

void SelfAttention::on_replace_module(const std::string& name, const std::shared_ptr<nn::Module>& m) {
  for (auto [n, slot] : slots())
    if (n == name) *slot = std::dynamic_pointer_cast<nn::UnaryModule>(m);
}

std::vector<std::pair<std::string, std::shared_ptr<nn::UnaryModule>*>> SelfAttention::slots() {
  return {{"query", &query}, {"key", &key}, {"value", &value}, {"out", &out}};
}

EncoderBlock::EncoderBlock(int64_t dim, int64_t heads, int64_t mlp_dim) {
  ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(Shape{dim}));
  attn = register_module("attn", std::make_shared<SelfAttention>(dim, heads));
  ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(Shape{dim}));
  mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<UnaryModule>>{
                                   std::make_shared<nn::Linear>(dim, mlp_dim), std::make_shared<nn::GELU>(),
                                   std::make_shared<nn::Linear>(mlp_dim, dim)}));
}

Tensor EncoderBlock::forward(const Tensor& x) {
  const Tensor h = add(x, attn->forward(ln1->forward(x)));
  return add(h, mlp->forward(ln2->forward(h)));
}

PatchViT::PatchViT(const PatchViTConfig& c) : config(c) {
  FRUGAL_CHECK(c.image % c.patch == 0, "PatchViT: image ", c.image, " is not a multiple of patch ", c.patch);
  // Construction order fixes the random initialization: keep it (the README's small-model numbers).
  patch_embed = register_module("patch_embed", std::make_shared<nn::Linear>(c.channels * c.patch * c.patch, c.dim));
  pos = register_parameter("pos_embed", randn({c.tokens(), c.dim}));
  {
    autograd::NoGradGuard no_grad;
    pos.copy_(ops::affine(pos, 0.02, 0.0));
  }
  blocks = register_module("blocks", std::make_shared<nn::ModuleList<EncoderBlock>>());
  for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(std::make_shared<EncoderBlock>(c.dim, c.heads, c.mlp));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{c.dim}));
  head = register_module("head", std::make_shared<nn::Linear>(c.dim, c.classes));
}

Tensor PatchViT::patches(const Tensor& x) const {
  const int64_t B = x.size(0), C = config.channels, P = config.patch, n = config.image / P;
  FRUGAL_CHECK(x.dim() == 4 && x.size(1) == C && x.size(2) == config.image && x.size(3) == config.image,
               "PatchViT: expected input (B, ", C, ", ", config.image, ", ", config.image, "), got ", x.describe());
  // (B, C, n, P, n, P) -> (B, n, n, C, P, P): each patch's pixels, channel-major, as one token.
  return x.reshape({B, C, n, P, n, P}).permute({0, 2, 4, 1, 3, 5}).reshape({B, n * n, C * P * P});
}

Tensor PatchViT::forward(const Tensor& x) {
  Tensor h = add(patch_embed->forward(patches(x)), pos);  // (B, T, D)
  for (const auto& block : *blocks) h = block->forward(h);
  return head->forward(mean(norm->forward(h), {1}));
}

}  // namespace frugal::bench
