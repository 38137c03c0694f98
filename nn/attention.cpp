#include "nn/attention.h"

#include <array>
#include <cmath>
#include <limits>

#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/join.h"
#include "autograd/ops/masked_softmax.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::nn {

// Note [Attention paths]
// forward() runs in three steps, every one a differentiable op, so autograd needs no
// node of its own here:
//  1. Projections. Self-attention (query, key and value the same tensor, as torch's
//     `query is key is value`) makes one (B, L, 3E) product against in_proj_weight and
//     chunks it into q, k and v: views, no copies. When only key is value (an encoder-
//     decoder's memory) k and v share one (B, S, 2E) product; otherwise each input is
//     multiplied by its slice (a view) of in_proj_weight, or by q/k/v_proj_weight when
//     kdim or vdim differ from embed_dim. Gradients of the slices meet in the parameter.
//  2. Masks. torch's nn.MultiheadAttention marks with `true` what may NOT be attended;
//     scaled_dot_product_attention and masked_softmax mark what MAY. Bool masks are
//     therefore negated (and a key padding mask or-ed into the attention mask first):
//     still bool, still read through broadcast strides, never made additive. If either
//     mask is floating, both become additive (-inf where a bool mask says true) and are
//     summed, as torch does.
//  3. Attention. Without need_weights the heads go to scaled_dot_product_attention,
//     which never hands out its (B, H, L, S) weights. need_weights spells out the same
//     steps (masked_softmax of q k^T, dropout, times v) so the weights can be returned,
//     after dropout as in torch; so does is_causal together with a mask, which
//     scaled_dot_product_attention refuses (masked_softmax applies both at once).
//  4. Fused kernels. scaled_dot_product_attention itself (autograd/ops/attention.cpp) hands
//     the heads to flash_attention (Note [Flash attention] in tensor/ops/flash_attention.h)
//     when ops::flash_attention_fused says its CUDA kernels take them: 4-D float16/bfloat16
//     q, k, v on one GPU with a head dim E % 8 == 0, E <= 128 (E == Ev), a bool or q-dtype
//     mask broadcastable to (B, H, L, S) that needs no gradient, and dropout_p < 1. Under
//     autocast sdpa first casts to the low dtype, so AMP training takes this path. It saves
//     q, k, v, out and a (B, H, L) f32 logsumexp instead of the (B, H, L, S) weights; on
//     frugal's own kernels its dropout keeps the same weights the composed path's dropout()
//     would from the same generator state. Everything else (float32, CPU, E > 128, a mask
//     with a gradient) runs the composed matmul / masked_softmax / dropout / matmul steps.
//     On the GPU the fused op itself runs cuDNN's fused attention engines when cuDNN can plan
//     the call (masks as an added bias; dropout included, drawn by cuDNN's own RNG: a mask of
//     the same rate, not the same weights), frugal's own kernels otherwise (Note [cuDNN
//     attention] in tensor/cuda/attention_cudnn.cu; ops::set_attention_backend, FRUGAL_ATTENTION).
//     The fused op keeps the projections' (B, T, H, D) memory order (Note [Flash attention
//     layouts]): merging the heads before out_proj is a view, and the packed self-attention
//     q, k, v get their gradients as views of one buffer, which chunk's backward takes
//     whole instead of concatenating (Note [Split backward without a copy]).

namespace {

constexpr const char* kOp = "MultiheadAttention";
constexpr double kInf = std::numeric_limits<double>::infinity();

/// Rows [i * n, (i + 1) * n) of a stacked projection parameter (a view), or undefined.
Tensor rows(const Tensor& t, int64_t i, int64_t n) { return t.defined() ? t.narrow(0, i * n, n) : Tensor(); }

/// A mask as scores to add: floating masks converted to `dtype`, bool ones (true = masked)
/// to -inf where true and 0 elsewhere.
Tensor additive(const Tensor& mask, DType dtype) {
  if (mask.dtype() != kBool) return mask.to(dtype);
  return masked_fill(zeros(mask.sizes(), {dtype, mask.device()}), mask, -kInf);
}

void check_mask_kind(const char* name, const Tensor& mask, const Tensor& query) {
  FRUGAL_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()), kOp, ": ", name, " must be bool or floating, got ",
               mask.describe());
  check_same_device(kOp, query, mask);
}

/// The masks of one call, checked: key padding as (B, 1, 1, S), attn as (L, S) or
/// (B, H, L, S); undefined where not given.
struct CallMasks {
  Tensor padding, attn;
};
CallMasks checked_masks(const AttentionForwardOptions& o, const Tensor& query, bool batched, int64_t B, int64_t H,
                        int64_t L, int64_t S) {
  CallMasks r;
  if (o.key_padding_mask.defined()) {
    const Tensor& m = o.key_padding_mask;
    check_mask_kind("key_padding_mask", m, query);
    const Shape want = batched ? Shape{B, S} : Shape{S};
    FRUGAL_CHECK(m.sizes() == want, kOp, ": key_padding_mask must be ",
                 batched ? "(B, S) = " : "(S) = ", shape_str(want), ", got ", m.describe());
    r.padding = m.reshape({B, 1, 1, S});
  }
  if (o.attn_mask.defined()) {
    const Tensor& m = o.attn_mask;
    check_mask_kind("attn_mask", m, query);
    const Shape want2{L, S}, want3{B * H, L, S};
    FRUGAL_CHECK(m.sizes() == want2 || m.sizes() == want3, kOp, ": attn_mask must be (L, S) = ", shape_str(want2),
                 batched ? " or (B*H, L, S) = " : " or (H, L, S) = ", shape_str(want3), ", got ", m.describe());
    r.attn = m.dim() == 2 ? m : m.reshape({B, H, L, S});
  }
  return r;
}

/// One mask for masked_softmax, (.., L, S): bool (true = attend) when every given mask is
/// bool, else additive in `dtype`; undefined without masks.
Tensor merged_mask(const CallMasks& m, DType dtype) {
  const Tensor &padding = m.padding, &attn = m.attn;
  if (!padding.defined() && !attn.defined()) return Tensor();
  if ((!padding.defined() || padding.dtype() == kBool) && (!attn.defined() || attn.dtype() == kBool))
    return logical_not(padding.defined() && attn.defined() ? logical_or(attn, padding)
                                                           : (attn.defined() ? attn : padding));
  Tensor mask;
  if (attn.defined()) mask = additive(attn, dtype);
  if (padding.defined()) mask = mask.defined() ? add(mask, additive(padding, dtype)) : additive(padding, dtype);
  return mask;
}

/// The input projections q (B, L, E), k and v (B, S, E): one GEMM for self-attention, two
/// when key is value (Note [Attention paths]), else three.
std::array<Tensor, 3> in_projections(const MultiheadAttention& a, const Tensor& qx, const Tensor& kx, const Tensor& vx,
                                     bool self_attn, bool kv_same) {
  const int64_t E = a.embed_dim;
  if (!a.in_proj_weight.defined())
    return {linear(qx, a.q_proj_weight, rows(a.in_proj_bias, 0, E)),
            linear(kx, a.k_proj_weight, rows(a.in_proj_bias, 1, E)),
            linear(vx, a.v_proj_weight, rows(a.in_proj_bias, 2, E))};
  if (self_attn) {
    const std::vector<Tensor> qkv = chunk(linear(qx, a.in_proj_weight, a.in_proj_bias), 3, -1);
    return {qkv[0], qkv[1], qkv[2]};
  }
  const Tensor q = linear(qx, rows(a.in_proj_weight, 0, E), rows(a.in_proj_bias, 0, E));
  if (kv_same) {
    const Tensor w_kv = a.in_proj_weight.narrow(0, E, 2 * E);
    const Tensor b_kv = a.in_proj_bias.defined() ? a.in_proj_bias.narrow(0, E, 2 * E) : Tensor();
    const std::vector<Tensor> kv = chunk(linear(kx, w_kv, b_kv), 2, -1);
    return {q, kv[0], kv[1]};
  }
  return {q, linear(kx, rows(a.in_proj_weight, 1, E), rows(a.in_proj_bias, 1, E)),
          linear(vx, rows(a.in_proj_weight, 2, E), rows(a.in_proj_bias, 2, E))};
}

}  // namespace

Tensor split_heads(const Tensor& x, int64_t heads) {
  FRUGAL_CHECK(x.dim() == 3 && heads > 0 && x.size(2) % heads == 0,
               "split_heads: expected (B, T, H * D) with H = ", heads, " dividing the last dim, got ", x.describe());
  return x.unflatten(-1, {heads, x.size(-1) / heads}).transpose(1, 2);
}

Tensor merge_heads(const Tensor& ctx) {
  FRUGAL_CHECK(ctx.dim() == 4, "merge_heads: expected (B, H, T, D), got ", ctx.describe());
  return ctx.transpose(1, 2).reshape({ctx.size(0), ctx.size(2), ctx.size(1) * ctx.size(3)});
}

MultiheadAttention::MultiheadAttention(int64_t embed_dim_, int64_t num_heads_, MultiheadAttentionOptions options)
    : embed_dim(embed_dim_),
      num_heads(num_heads_),
      head_dim(num_heads_ > 0 ? embed_dim_ / num_heads_ : 0),
      kdim(options.kdim.value_or(embed_dim_)),
      vdim(options.vdim.value_or(embed_dim_)),
      dropout_p(options.dropout),
      batch_first(options.batch_first) {
  FRUGAL_CHECK(embed_dim > 0 && num_heads > 0, kOp,
               ": embed_dim and num_heads must be positive, got embed_dim=", embed_dim, " num_heads=", num_heads);
  FRUGAL_CHECK(embed_dim % num_heads == 0, kOp, ": embed_dim (", embed_dim, ") must be divisible by num_heads (",
               num_heads, ")");
  FRUGAL_CHECK(kdim > 0 && vdim > 0, kOp, ": kdim and vdim must be positive, got kdim=", kdim, " vdim=", vdim);
  FRUGAL_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, kOp, ": dropout must be in [0, 1], got ", dropout_p);
  // Registration order is torch's, so state_dict() lists the keys in its order.
  if (kdim == embed_dim && vdim == embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
    init::xavier_uniform_(in_proj_weight);
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({embed_dim, embed_dim}));
    k_proj_weight = register_parameter("k_proj_weight", empty({embed_dim, kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({embed_dim, vdim}));
    init::xavier_uniform_(q_proj_weight);
    init::xavier_uniform_(k_proj_weight);
    init::xavier_uniform_(v_proj_weight);
  }
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * embed_dim}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, LinearOptions{options.bias}));
  if (options.bias) init::zeros_(out_proj->bias);
}

AttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                            const AttentionForwardOptions& o) {
  core::ModuleScope scope(this);  // a multi-input forward names itself for the profiler
  FRUGAL_CHECK(query.defined() && key.defined() && value.defined(), kOp, ": undefined query, key or value");
  const bool batched = query.dim() == 3;
  FRUGAL_CHECK((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(), kOp,
               ": query, key and value must all be 3-D (batched) or all 2-D (unbatched), got query ", query.describe(),
               ", key ", key.describe(), ", value ", value.describe());
  FRUGAL_CHECK(query.dtype() == key.dtype() && query.dtype() == value.dtype(), kOp,
               ": query, key and value must share a dtype, got ", query.describe(), ", ", key.describe(), ", ",
               value.describe());
  check_same_device(kOp, query, key);
  check_same_device(kOp, query, value);
  // torch's `query is key`: the same handle, so one gradient reaches it (Note [Attention paths]).
  const bool kv_same = key.impl_ptr() == value.impl_ptr();
  const bool self_attn = kv_same && query.impl_ptr() == key.impl_ptr();

  // Everything below works batch-first: x (B, T, features).
  auto batch_major = [&](const Tensor& x) { return !batched ? x.unsqueeze(0) : batch_first ? x : x.transpose(0, 1); };
  const Tensor qx = batch_major(query), kx = batch_major(key), vx = batch_major(value);
  const int64_t B = qx.size(0), L = qx.size(1), S = kx.size(1), E = embed_dim, H = num_heads;
  FRUGAL_CHECK(qx.size(2) == E && kx.size(2) == kdim && vx.size(2) == vdim, kOp, ": expected query (..., ", E,
               "), key (..., ", kdim, ") and value (..., ", vdim, "), got query ", query.describe(), ", key ",
               key.describe(), ", value ", value.describe());
  FRUGAL_CHECK(kx.size(0) == B && vx.size(0) == B && vx.size(1) == S, kOp,
               ": query, key and value must have the same batch size and key and value the same length (batch_first=",
               batch_first ? "true" : "false", "), got query ", query.describe(), ", key ", key.describe(), ", value ",
               value.describe());

  const CallMasks masks = checked_masks(o, query, batched, B, H, L, S);    // merged after the projections
  auto [q, k, v] = in_projections(*this, qx, kx, vx, self_attn, kv_same);  // q (B, L, E), k, v (B, S, E)
  q = split_heads(q, H), k = split_heads(k, H), v = split_heads(v, H);     // (B, H, T, D)

  const Tensor mask = merged_mask(masks, q.dtype());  // in the scores' dtype (the projections' output)

  // ---- attention: heads (B, H, L, D), weights (B, H, L, S) ----
  const double p = is_training() ? dropout_p : 0.0;
  const double scale = 1.0 / std::sqrt(double(head_dim));
  Tensor heads, weights;
  if (!o.need_weights && !(o.is_causal && mask.defined())) {
    heads = scaled_dot_product_attention(q, k, v, mask, o.is_causal, p, scale);
  } else {
    weights = masked_softmax(matmul(q, k.transpose(-2, -1)), mask, o.is_causal, scale);
    if (p > 0.0) weights = frugal::dropout(weights, p, /*training=*/true);
    heads = matmul(weights, v);
  }

  AttentionOutput result;
  Tensor out = (*out_proj)(merge_heads(heads));  // (B, L, E)
  result.output = !batched ? out.squeeze(0) : batch_first ? out : out.transpose(0, 1);
  if (o.need_weights) {
    if (o.average_attn_weights) weights = mean(weights, {1});  // (B, L, S)
    result.weights = batched ? weights : weights.squeeze(0);
  }
  return result;
}

std::string MultiheadAttention::extra_repr() const {
  std::string s = "embed_dim=" + std::to_string(embed_dim) + ", num_heads=" + std::to_string(num_heads);
  if (kdim != embed_dim || vdim != embed_dim) s += ", kdim=" + std::to_string(kdim) + ", vdim=" + std::to_string(vdim);
  return s + ", dropout=" + std::to_string(dropout_p) + ", batch_first=" + (batch_first ? "true" : "false");
}

}  // namespace frugal::nn
