// masked_softmax (forward and backward side by side), flash_attention (the fused kernels
// of tensor/ops/flash_attention.h with their backward) and scaled_dot_product_attention,
// which takes flash_attention where the fused kernels apply and otherwise composes
// differentiable matmul, masked_softmax and dropout (Note [Attention paths]).
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "memory/op_context.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/softmax.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// y = softmax(scale * scores + mask), dz = softmax_backward(g, y) = y * (g - sum(g * y))
// grad_scores = scale * dz, grad_mask = sum_to(dz, mask) (a float mask; a bool mask has none)
struct MaskedSoftmaxBackward final : Node {
  SavedTensor out;  // y only: the softmax gradient needs nothing else (Note [Masked softmax])
  double scale = 1.0;
  Shape mask_sizes;
  std::string name() const override { return "MaskedSoftmaxBackward"; }
  void release_saved() override { out.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor dz = ops::softmax_backward(grads[0], out.unpack(name()), -1);
    TensorList result(2);
    if (wants_grad(*this, 0)) result[0] = scale == 1.0 ? dz : ops::mul(dz, scale);
    if (wants_grad(*this, 1)) result[1] = autograd::sum_to(dz, mask_sizes);
    return result;
  }
};

}  // namespace

Tensor masked_softmax(const Tensor& scores, const Tensor& mask, bool is_causal, double scale) {
  memory::OpScope scope("masked_softmax");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&scores, &mask}))
    return masked_softmax((*c)[0], (*c)[1], is_causal, scale);
  Tensor out = autograd::raw([&] { return ops::masked_softmax(scores, mask, is_causal, scale); });
  if (auto node = make_node<MaskedSoftmaxBackward>({scores, mask})) {
    node->out = out;
    node->scale = scale;
    if (mask.defined()) node->mask_sizes = mask.sizes();
    autograd::record(node, {out});
  }
  return out;
}

namespace {

// out = dropout(softmax(scale q k^T + mask)) v; with P recomputed from q, k, lse (Note [Flash attention]):
// grad_v = P'^T g, dS = P (f (g v^T) - rowsum(g * out)), grad_q = scale dS k, grad_k = scale dS^T q
struct FlashAttentionBackward final : Node {
  SavedTensor q, k, v, out, lse, mask;  // no (B, H, L, S) tensor: the weights are recomputed
  ops::FlashAttentionOptions options;   // its mask stays undefined: `mask` holds it, version-checked
  Generator::Range range{0, 0};
  std::string name() const override { return "FlashAttentionBackward"; }
  void release_saved() override { q.reset(), k.reset(), v.reset(), out.reset(), lse.reset(), mask.reset(); }
  TensorList apply(TensorList&& grads) override {
    ops::FlashAttentionOptions o = options;
    if (mask.defined()) o.mask = mask.unpack(name());
    ops::FlashAttentionGrads g =
        ops::flash_attention_backward(grads[0], q.unpack(name()), k.unpack(name()), v.unpack(name()),
                                      out.unpack(name()), lse.unpack(name()), o, range);
    TensorList result(3);
    if (wants_grad(*this, 0)) result[0] = std::move(g.dq);
    if (wants_grad(*this, 1)) result[1] = std::move(g.dk);
    if (wants_grad(*this, 2)) result[2] = std::move(g.dv);
    return result;
  }
};

}  // namespace

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask, bool is_causal,
                       double dropout_p, std::optional<double> scale, Generator* gen) {
  constexpr const char* op = "flash_attention";
  memory::OpScope scope(op);
  if (auto c = autocast::cast_inputs(Policy::Lower, {&q, &k, &v, &attn_mask}))
    return flash_attention((*c)[0], (*c)[1], (*c)[2], (*c)[3], is_causal, dropout_p, scale, gen);
  FRUGAL_CHECK(!attn_mask.defined() || !attn_mask.requires_grad(), op, ": attn_mask ", attn_mask.describe(),
               " requires grad, but the fused kernels give it none (use scaled_dot_product_attention)");
  const ops::FlashAttentionOptions options{attn_mask, is_causal, scale, dropout_p};
  ops::FlashAttentionForward r = autograd::raw([&] { return ops::flash_attention_forward(q, k, v, options, gen); });
  if (auto node = make_node<FlashAttentionBackward>({q, k, v})) {
    node->q = q, node->k = k, node->v = v, node->out = r.out, node->lse = r.lse;
    if (attn_mask.defined()) node->mask = attn_mask;
    node->options = {Tensor(), is_causal, scale, dropout_p};
    node->range = r.range;
    autograd::record(node, {r.out});
  }
  return r.out;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool is_causal, double dropout_p, std::optional<double> scale, Generator* gen) {
  constexpr const char* op = "scaled_dot_product_attention";
  memory::OpScope scope(op);
  FRUGAL_CHECK(q.defined() && k.defined() && v.defined(), op, ": undefined query, key or value");
  if (autocast::is_enabled(q.device().type)) {  // one op to autocast: cast once, no policy inside (Note [Autocast])
    const auto c = autocast::cast_inputs(Policy::Lower, {&q, &k, &v, &attn_mask});
    AutocastGuard inside(q.device(), autocast::dtype(q.device().type), /*enabled=*/false);
    if (c) return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], (*c)[3], is_causal, dropout_p, scale, gen);
    return scaled_dot_product_attention(q, k, v, attn_mask, is_causal, dropout_p, scale, gen);
  }
  FRUGAL_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
               ": query, key and value must be at least 2-D (..., L, E), got ", q.describe(), ", ", k.describe(), ", ",
               v.describe());
  FRUGAL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, ": query, key and value must share a dtype, got ",
               q.describe(), ", ", k.describe(), ", ", v.describe());
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  FRUGAL_CHECK(q.size(-1) == k.size(-1), op, ": query ", q.describe(), " and key ", k.describe(),
               " must have the same embedding size E (last dim)");
  FRUGAL_CHECK(k.size(-2) == v.size(-2), op, ": key ", k.describe(), " and value ", v.describe(),
               " must have the same sequence length S (dim -2)");
  FRUGAL_CHECK(!(is_causal && attn_mask.defined()), op,
               ": an explicit attn_mask should not be set when is_causal=true (as in PyTorch), got attn_mask ",
               attn_mask.defined() ? attn_mask.describe() : "");
  FRUGAL_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  // The fused kernels where they apply (Note [Attention paths]): dropout_p == 1 (all zeros)
  // and a mask that wants a gradient stay on the composed path.
  if (ops::flash_attention_fused(q, k, v, attn_mask) && dropout_p < 1.0 &&
      !(attn_mask.defined() && attn_mask.requires_grad()))
    return flash_attention(q, k, v, attn_mask, is_causal, dropout_p, scale, gen);
  const double s = scale ? *scale : 1.0 / std::sqrt(double(q.size(-1)));
  const Tensor scores = matmul(q, k.transpose(-2, -1));  // (..., L, S)
  Tensor weights = masked_softmax(scores, attn_mask, is_causal, s);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, /*training=*/true, gen);
  return matmul(weights, v);  // (..., L, Ev)
}

}  // namespace frugal
