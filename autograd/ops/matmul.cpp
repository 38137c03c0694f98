// matmul and linear, forward and backward side by side.
#include "autograd/ops/matmul.h"

#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/unary.h"
#include "autograd/ops/unary_op.h"
#include "autograd/ops/reduce.h"
#include "autograd/selective_checkpoint.h"
#include "core/instrument.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

bool widens(const Node& node, size_t i, const Tensor& value);
Tensor as_rows(const Tensor& t);

/// x @ y, in float32 when input i of `node` is a 16-bit value whose gradient goes straight
/// into a cast from float32 (Note [Weight gradients in the master dtype]).
Tensor mm_for(const Node& node, size_t i, const Tensor& value, const Tensor& x, const Tensor& y) {
  return widens(node, i, value) ? ops::mm(x, y, kFloat32) : ops::mm(x, y);
}

// out = a @ b  (both >= 2-D, batch dims broadcast)
// grad_a = g @ b^T, grad_b = a^T @ g, each summed back over broadcast batch dims. Where one
// operand is a matrix shared by every batch entry of the other (a projection applied to a
// batch), its gradient is one GEMM over the folded batch, as PyTorch's: B products each
// rounded to a 16-bit dtype and then summed lost bits with every entry of the batch (a
// bfloat16 weight gradient 1.7x PyTorch's error at a batch of 3), and it gets the float32
// result under autocast as linear's does.
struct MatmulBackward final : Node {
  SavedTensor a{this}, b{this};
  std::string name() const override { return "MatmulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor av = a.unpack(name()), bv = b.unpack(name());
    TensorList out(2);
    const int64_t M = g.size(-2), N = g.size(-1), K = av.size(-1), batch = g.numel() / std::max<int64_t>(1, M * N);
    if (wants_grad(*this, 0)) {
      if (av.dim() == 2 && bv.dim() > 2 && M * N > 0) {  // sum over the batch of g_i b_i^T: (M, B N) @ (B N, K)
        const Tensor g2 = g.reshape({batch, M, N}).permute({1, 0, 2}).reshape({M, batch * N});
        const Tensor b2 = bv.reshape({batch, K, N}).transpose(-1, -2).reshape({batch * N, K});
        out[0] = mm_for(*this, 0, av, g2, b2);
      } else {
        out[0] = autograd::sum_to(ops::matmul(g, bv.transpose(-1, -2)), av.sizes());
      }
    }
    if (wants_grad(*this, 1)) {
      if (bv.dim() == 2 && av.dim() > 2) {  // sum over the batch of a_i^T g_i: (K, B M) @ (B M, N)
        out[1] = mm_for(*this, 1, bv, as_rows(av).t(), as_rows(g));
      } else {
        out[1] = autograd::sum_to(ops::matmul(av.transpose(-1, -2), g), bv.sizes());
      }
    }
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = autograd::graph::saved_input(*this, 0, a), bv = autograd::graph::saved_input(*this, 1, b);
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::graph::sum_to(frugal::matmul(g, bv.transpose(-1, -2)), av.sizes());
    if (wants_grad(*this, 1)) out[1] = autograd::graph::sum_to(frugal::matmul(av.transpose(-1, -2), g), bv.sizes());
    return out;
  }
};

// out = x @ w^T + bias, x: (..., in), w: (out, in)
// grad_x = g @ w; grad_w = g2^T @ x2 over the flattened rows; grad_bias = sum of g2's rows,
// on CUDA summed by grad_w's GEMM itself when both are wanted (Note [Bias gradient epilogue]
// in tensor/cuda/matmul.cu).
//
// Note [Weight gradients in the master dtype]
// Under autocast the weight is a float16 cast of a float32 parameter, and its gradient
// would go float16 GEMM output -> ToCopyBackward (a float32 copy) -> .grad: one more
// kernel and a float16 round trip per weight per step (200 launches, 1.9 ms of device time
// in a BERT-base AMP step). When the weight's gradient goes straight into such a cast
// (Node::converts_gradient_to() says float32), the GEMM writes its float32 accumulator
// instead (ops::mm with a float32 result: cuBLAS's float16-in, float32-out GEMM), the cast
// passes the float32 gradient through untouched, and the weight gradient keeps the bits
// the float16 rounding would have dropped. A weight used by several ops still meets at its
// one cached cast (Note [Autocast]); gradients of mixed dtypes add up in float32. The input
// gradient gets the same treatment when the input is a cast of a float32 activation (a
// layer norm's output, run in float32 under autocast, feeding a projection). The engine
// hands a float16 tensor's retained or requested gradient back in float16 all the same.
// Two differences from PyTorch follow: a scaled weight gradient above float16's range is a
// finite float32 value, not an inf that makes GradScaler skip the step (unscaled, it is the
// right update; overflowing activation gradients stay float16 and are caught);
// and the bias gradient, a float16 sum, still takes the cast's round trip.
/// Whether the node's input `i` (a 16-bit `value`) sends its gradient straight into a cast
/// from float32, which then gets it in float32 from the GEMM.
bool widens(const Node& node, size_t i, const Tensor& value) {
  const Node* consumer = node.next_edges[i].fn.get();
  return consumer && consumer->converts_gradient_to() == kFloat32 &&
         (value.dtype() == kFloat16 || value.dtype() == kBFloat16);
}

/// t (..., n) as (M, n) rows: reshape({-1, n}) cannot infer M when n is 0.
Tensor as_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return t.reshape({rows, t.size(-1)});
}

/// The gradient of input x (..., in) of a linear with weight (out, in), from g2 (M, out).
Tensor linear_input_grad(const Node& node, size_t i, const Tensor& g2, const Tensor& xv, const Tensor& wv) {
  return mm_for(node, i, xv, g2, wv).view(xv.sizes());
}

/// Sets result[w] and result[b] (where wanted; b only with `has_bias`): the weight and bias
/// gradients of a linear with weight wv whose input was x (..., in), from g2 (M, out).
void linear_weight_bias_grads(const Node& node, size_t w, size_t b, bool has_bias, const Tensor& g2, const Tensor& x,
                              const Tensor& wv, TensorList& result) {
  const bool want_bias = has_bias && wants_grad(node, b);
  if (wants_grad(node, w)) {
    const Tensor x2 = as_rows(x);  // (M, in)
    const DType w_dtype = widens(node, w, wv) ? kFloat32 : wv.dtype();
    if (want_bias) {  // both from one GEMM where it applies, else undefined (Note [Bias gradient epilogue])
      ops::LinearWeightBiasGrads fused = ops::linear_backward_weight_bias(g2, x2, w_dtype);
      result[w] = std::move(fused.weight), result[b] = std::move(fused.bias);
    }
    if (!result[w].defined()) result[w] = ops::mm(g2.t(), x2, w_dtype);
  }
  if (want_bias && !result[b].defined()) result[b] = ops::sum(g2, {0});
}

struct LinearBackward final : Node {
  SavedTensor x{this}, w{this};
  bool has_bias = false;
  std::string name() const override { return "LinearBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor xv = x.unpack(name()), wv = w.unpack(name());
    const Tensor g2 = as_rows(g);  // (M, out)
    TensorList result(3);
    if (wants_grad(*this, 0)) result[0] = linear_input_grad(*this, 0, g2, xv, wv);
    linear_weight_bias_grads(*this, 1, 2, has_bias, g2, xv, wv, result);
    return result;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor xv = autograd::graph::saved_input(*this, 0, x), wv = autograd::graph::saved_input(*this, 1, w);
    const Tensor g2 = as_rows(g);  // (M, out)
    TensorList result(3);
    if (wants_grad(*this, 0)) result[0] = frugal::matmul(g2, wv).reshape(xv.sizes());
    if (wants_grad(*this, 1)) result[1] = frugal::matmul(g2.t(), as_rows(xv));
    if (has_bias && wants_grad(*this, 2)) result[2] = frugal::sum(g2, {0});
    return result;
  }
};

// y = fc2(h), h = gelu_tanh(pre), pre = fc1(x) (Note [GELU epilogues] in tensor/cuda/matmul.cu):
// fc2's gradients as LinearBackward's; grad_pre = (g w2) * gelu_tanh'(pre) with b1's gradient
// (its row sums) from one GEMM where the epilogue applies; then fc1's input and weight gradients.
// Saves x and pre, not h: fc2's weight gradient recomputes it from pre (one elementwise pass),
// so the block keeps one (M, hidden) activation less than the composed ops, which save h for
// fc2 and pre for the GELU (and with h kept, the node's peak was one such tensor above theirs:
// 187 against 139 MiB at GPT-2 small's block on the H200).
struct GeluMlpBackward final : Node {
  SavedTensor x{this}, w1{this}, pre{this}, w2{this};
  SavedTensor b1{this};  // for the double backward's recomputed pre (a parameter: no memory of its own)
  bool has_b1 = false, has_b2 = false;
  std::string name() const override { return "GeluMlpBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor xv = x.unpack(name()), w1v = w1.unpack(name()), w2v = w2.unpack(name());
    const Tensor g2 = as_rows(grads[0]), pre2 = as_rows(pre.unpack(name()));  // (M, out), (M, hidden)
    TensorList result(5);
    linear_weight_bias_grads(*this, 3, 4, has_b2, g2, wants_grad(*this, 3) ? ops::gelu_tanh(pre2) : Tensor(), w2v,
                             result);
    const bool want_b1 = has_b1 && wants_grad(*this, 2);
    if (!wants_grad(*this, 0) && !wants_grad(*this, 1) && !want_b1) return result;
    ops::GeluGrads d = ops::matmul_gelu_tanh_backward(g2, w2v, pre2, want_b1);
    if (!d.pre.defined()) d.pre = ops::unary_backward(ops::UnaryOp::GeluTanh, ops::mm(g2, w2v), pre2);
    if (wants_grad(*this, 0)) result[0] = linear_input_grad(*this, 0, d.pre, xv, w1v);
    // fc1's weight gradient, with b1's from the same GEMM (BGRADB) unless the epilogue gave it.
    if (d.bias.defined()) result[2] = std::move(d.bias);
    linear_weight_bias_grads(*this, 1, 2, has_b1 && !result[2].defined(), d.pre, xv, w1v, result);
    return result;
  }
  // The two linears' and GELU's formulas in differentiable ops, pre recomputed from x, w1 and
  // b1 so that it carries their history (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    namespace graph = autograd::graph;
    const Tensor xv = graph::saved_input(*this, 0, x), w1v = graph::saved_input(*this, 1, w1),
                 w2v = graph::saved_input(*this, 3, w2);
    const Tensor b1v = has_b1 ? graph::saved_input(*this, 2, b1) : Tensor();
    const Tensor pre2 = frugal::linear(as_rows(xv), w1v, b1v), g2 = as_rows(grads[0]);  // (M, hidden), (M, out)
    TensorList result(5);
    if (wants_grad(*this, 3)) result[3] = frugal::matmul(g2.t(), frugal::gelu_tanh(pre2));
    if (has_b2 && wants_grad(*this, 4)) result[4] = frugal::sum(g2, {0});
    const Tensor gpre = autograd::detail::unary_grad_graph(ops::UnaryOp::GeluTanh, frugal::matmul(g2, w2v), pre2);
    if (wants_grad(*this, 0)) result[0] = frugal::matmul(gpre, w1v).reshape(xv.sizes());
    if (wants_grad(*this, 1)) result[1] = frugal::matmul(gpre.t(), as_rows(xv));
    if (has_b1 && wants_grad(*this, 2)) result[2] = frugal::sum(gpre, {0});
    return result;
  }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  core::OpScope scope("matmul");
  FRUGAL_CHECK(a.defined() && b.defined(), "matmul: undefined operand (", a.describe(), " @ ", b.describe(), ")");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&a, &b})) return matmul((*c)[0], (*c)[1]);
  // Vectors become matrices through (differentiable) views, so one backward covers all cases.
  // The operands are checked first, so that an error names them as the caller gave them.
  if (a.dim() == 1 || b.dim() == 1) {
    ops::check_matmul(a, b);
    const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
    const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
    Tensor out = matmul(a2, b2);
    if (a.dim() == 1) out = out.squeeze(-2);
    if (b.dim() == 1) out = out.squeeze(-1);
    return out;
  }
  // A selective checkpoint may keep this output (Note [Selective checkpoint]), as linear's.
  Tensor out = autograd::kept_or_run("matmul", {a, b}, [&] { return ops::matmul(a, b); });
  if (auto node = make_node<MatmulBackward>({a, b})) {
    node->a = a;
    node->b = b;
    autograd::record(node, {out});
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  core::OpScope scope("linear");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &weight, &bias})) return linear((*c)[0], (*c)[1], (*c)[2]);
  Tensor out = autograd::kept_or_run("linear", {x, weight, bias}, [&] { return ops::linear(x, weight, bias); });
  if (auto node = make_node<LinearBackward>({x, weight, bias})) {
    node->x = x;
    node->w = weight;
    node->has_bias = bias.defined();
    autograd::record(node, {out});
  }
  return out;
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  core::OpScope scope("gelu_mlp");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &w1, &b1, &w2, &b2}))
    return gelu_mlp((*c)[0], (*c)[1], (*c)[2], (*c)[3], (*c)[4]);
  ops::check_linear("gelu_mlp", x, w1, b1);
  FRUGAL_CHECK(w2.defined() && w2.dim() == 2 && w2.size(1) == w1.size(0) && w2.dtype() == x.dtype(),
               "gelu_mlp: expects fc1's weight (hidden, in) and fc2's (out, hidden) of the input's dtype, got ",
               w1.describe(), " and ", w2.describe(), " (input ", x.describe(), ")");
  FRUGAL_CHECK(!b2.defined() || (b2.dim() == 1 && b2.size(0) == w2.size(0) && b2.dtype() == x.dtype()),
               "gelu_mlp: fc2's bias ", b2.describe(), " must be 1-D with out_features = ", w2.size(0),
               " elements of the input's dtype (input ", x.describe(), ")");
  // A selective checkpoint keeps pre and the output (Note [Selective checkpoint]), so its
  // recompute runs neither GEMM.
  auto compute = [&] {
    ops::LinearGelu fc1 = autograd::raw([&] { return ops::linear_gelu_tanh(x, w1, b1); });
    Tensor y = autograd::raw([&] { return ops::linear(fc1.out, w2, b2); });
    return autograd::selective::Kept{{std::move(fc1.pre), std::move(y)}};
  };
  const autograd::selective::Kept r =
      autograd::selective::active() ? autograd::selective::run("gelu_mlp", {x, w1, b1, w2, b2}, compute) : compute();
  const Tensor& out = r.tensors[1];
  if (auto node = make_node<GeluMlpBackward>({x, w1, b1, w2, b2})) {
    node->x = x, node->w1 = w1, node->w2 = w2, node->pre = r.tensors[0];
    node->has_b1 = b1.defined(), node->has_b2 = b2.defined();
    if (b1.defined()) node->b1 = b1;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
