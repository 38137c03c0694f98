// scaled_dot_product_attention, which takes flash_attention where the fused kernels
// apply and otherwise composes differentiable matmul, masked_softmax and dropout
// (Note [Attention paths]). It records no node of its own.
#include "autograd/ops/attention.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/flash_attention.h"
#include "autograd/ops/masked_softmax.h"
#include "autograd/ops/matmul.h"
#include "core/instrument.h"
#include "tensor/ops/flash_attention.h"

namespace frugal {

using autocast::Policy;

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool is_causal, double dropout_p, std::optional<double> scale, Generator* gen) {
  constexpr const char* op = "scaled_dot_product_attention";
  core::OpScope scope(op);
  FRUGAL_CHECK(q.defined() && k.defined() && v.defined(), op, ": undefined query, key or value");
  autograd::note_mode(op, dropout_p > 0.0);
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
  FRUGAL_CHECK(!attn_mask.defined() || attn_mask.dtype() == kBool || attn_mask.dtype() == q.dtype(), op, ": attn_mask ",
               attn_mask.defined() ? attn_mask.describe() : "", " must be bool or of the query's dtype", " (query ",
               q.describe(), ")");
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
