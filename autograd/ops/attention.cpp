// masked_softmax (forward and backward side by side) and scaled_dot_product_attention,
// composed of differentiable matmul, masked_softmax and dropout.
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "memory/op_context.h"
#include "tensor/ops/binary.h"
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
  const double s = scale ? *scale : 1.0 / std::sqrt(double(q.size(-1)));
  const Tensor scores = matmul(q, k.transpose(-2, -1));  // (..., L, S)
  Tensor weights = masked_softmax(scores, attn_mask, is_causal, s);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, /*training=*/true, gen);
  return matmul(weights, v);  // (..., L, Ev)
}

}  // namespace frugal
