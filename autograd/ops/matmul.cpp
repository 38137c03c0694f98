// matmul and linear, forward and backward side by side.
#include "autograd/ops/matmul.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/selective_checkpoint.h"
#include "core/instrument.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = a @ b  (both >= 2-D, batch dims broadcast)
// grad_a = g @ b^T, grad_b = a^T @ g, each summed back over broadcast batch dims.
struct MatmulBackward final : Node {
  SavedTensor a{this}, b{this};
  std::string name() const override { return "MatmulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor av = a.unpack(name()), bv = b.unpack(name());
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::sum_to(ops::matmul(g, bv.transpose(-1, -2)), av.sizes());
    if (wants_grad(*this, 1)) out[1] = autograd::sum_to(ops::matmul(av.transpose(-1, -2), g), bv.sizes());
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
struct LinearBackward final : Node {
  SavedTensor x{this}, w{this};
  bool has_bias = false;
  std::string name() const override { return "LinearBackward"; }
  /// Whether input `i` (a 16-bit `value`) sends its gradient straight into a cast from
  /// float32, which then gets it in float32 from the GEMM.
  bool widens(size_t i, const Tensor& value) const {
    const Node* consumer = next_edges[i].fn.get();
    return consumer && consumer->converts_gradient_to() == kFloat32 &&
           (value.dtype() == kFloat16 || value.dtype() == kBFloat16);
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor xv = x.unpack(name()), wv = w.unpack(name());
    const int64_t out_features = wv.size(0), in_features = wv.size(1);
    Tensor g2 = g.reshape({-1, out_features});  // (M, out)
    TensorList result(3);
    if (wants_grad(*this, 0)) {
      if (widens(0, xv)) result[0] = ops::mm(g2, wv, kFloat32).view(xv.sizes());
      else result[0] = ops::matmul(g, wv);
    }
    const bool want_bias = has_bias && wants_grad(*this, 2);
    if (wants_grad(*this, 1)) {
      const Tensor x2 = xv.reshape({-1, in_features});  // (M, in)
      const DType w_dtype = widens(1, wv) ? kFloat32 : wv.dtype();
      if (want_bias) {  // both from one GEMM where it applies, else undefined (Note [Bias gradient epilogue])
        ops::LinearWeightBiasGrads fused = ops::linear_backward_weight_bias(g2, x2, w_dtype);
        result[1] = std::move(fused.weight), result[2] = std::move(fused.bias);
      }
      if (!result[1].defined()) result[1] = ops::mm(g2.t(), x2, w_dtype);
    }
    if (want_bias && !result[2].defined()) result[2] = ops::sum(g2, {0});
    return result;
  }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  core::OpScope scope("matmul");
  if (auto c = autocast::cast_inputs(Policy::Lower, {&a, &b})) return matmul((*c)[0], (*c)[1]);
  // Vectors become matrices through (differentiable) views, so one backward covers all cases.
  if (a.dim() == 1 || b.dim() == 1) {
    FRUGAL_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: 0-d operand (", a.describe(), " @ ", b.describe(), ")");
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

}  // namespace frugal
