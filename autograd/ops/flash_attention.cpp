// flash_attention, the fused kernels of tensor/ops/flash_attention.h with their backward
// (Note [Flash attention]).
#include "autograd/ops/flash_attention.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/masked_softmax.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "autograd/selective_checkpoint.h"
#include "core/instrument.h"
#include "tensor/ops/flash_attention.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = dropout(softmax(scale q k^T + mask)) v; with P recomputed from q, k, lse (Note [Flash attention]):
// grad_v = P'^T g, dS = P (f (g v^T) - rowsum(g * out)), grad_q = scale dS k, grad_k = scale dS^T q
struct FlashAttentionBackward final : Node {
  // No (B, H, L, S) tensor: the weights are recomputed.
  SavedTensor q{this}, k{this}, v{this}, out{this}, lse{this}, mask{this};
  ops::FlashAttentionOptions options;  // its mask stays undefined: `mask` holds it, version-checked
  Generator::Range range{0, 0};
  std::string name() const override { return "FlashAttentionBackward"; }
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
  // Without dropout (whose mask only the fused kernels' Philox stream holds), the same formulas
  // in differentiable ops, P recomputed by the composed path's masked_softmax (Note [Double backward]).
  bool has_graph_backward() const override { return options.dropout_p == 0.0; }
  TensorList apply_graph(TensorList&& grads) override {
    namespace graph = autograd::graph;
    const Tensor& g = grads[0];
    const Tensor qv = graph::saved_input(*this, 0, q), kv = graph::saved_input(*this, 1, k),
                 vv = graph::saved_input(*this, 2, v);
    const Tensor m = mask.defined() ? mask.unpack(name()) : Tensor();
    const double s = options.scale ? *options.scale : 1.0 / std::sqrt(double(qv.size(-1)));
    const Tensor p = frugal::masked_softmax(frugal::matmul(qv, kv.transpose(-2, -1)), m, options.is_causal, s);
    const Tensor dp = frugal::matmul(g, vv.transpose(-2, -1));
    const Tensor ds = frugal::mul(p, frugal::sub(dp, frugal::sum(frugal::mul(dp, p), {-1}, /*keepdim=*/true)));
    TensorList result(3);
    if (wants_grad(*this, 0)) result[0] = frugal::mul(frugal::matmul(ds, kv), s);
    if (wants_grad(*this, 1)) result[1] = frugal::mul(frugal::matmul(ds.transpose(-2, -1), qv), s);
    if (wants_grad(*this, 2)) result[2] = frugal::matmul(p.transpose(-2, -1), g);
    return result;
  }
};

}  // namespace

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask, bool is_causal,
                       double dropout_p, std::optional<double> scale, Generator* gen) {
  constexpr const char* op = "flash_attention";
  core::OpScope scope(op);
  autograd::note_mode(op, dropout_p > 0.0);
  if (auto c = autocast::cast_inputs(Policy::Lower, {&q, &k, &v, &attn_mask}))
    return flash_attention((*c)[0], (*c)[1], (*c)[2], (*c)[3], is_causal, dropout_p, scale, gen);
  FRUGAL_CHECK(!attn_mask.defined() || !attn_mask.requires_grad(), op, ": attn_mask ", attn_mask.describe(),
               " requires grad, but the fused kernels give it none (use scaled_dot_product_attention)");
  const ops::FlashAttentionOptions options{attn_mask, is_causal, scale, dropout_p};
  auto forward = [&] { return autograd::raw([&] { return ops::flash_attention_forward(q, k, v, options, gen); }); };
  ops::FlashAttentionForward r;
  if (!autograd::selective::active()) {
    r = forward();
  } else {  // out, lse and the dropout range may be kept (Note [Selective checkpoint])
    autograd::selective::Kept kept = autograd::selective::run(op, {q, k, v, attn_mask}, [&] {
      ops::FlashAttentionForward f = forward();
      return autograd::selective::Kept{{f.out, f.lse}, f.range};
    });
    r = {kept.tensors[0], kept.tensors[1], kept.range};
  }
  if (auto node = make_node<FlashAttentionBackward>({q, k, v})) {
    node->q = q, node->k = k, node->v = v, node->out = r.out, node->lse = r.lse;
    if (attn_mask.defined()) node->mask = attn_mask;
    node->options = {Tensor(), is_causal, scale, dropout_p};
    node->range = r.range;
    autograd::record(node, {r.out});
  }
  return r.out;
}

}  // namespace frugal
