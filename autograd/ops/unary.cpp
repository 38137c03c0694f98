// Unary ops, forward and backward side by side: one node for all of them, each
// derivative one fused kernel (ops::unary_backward).
#include "autograd/ops/unary.h"

#include "autograd/autocast.h"
#include "autograd/compress.h"
#include "autograd/function.h"
#include "autograd/ops/unary_op.h"
#include "autograd/recompute_cheap.h"
#include "core/instrument.h"
#include "tensor/ops/quantize.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using ops::UnaryOp;

namespace {

/// g in `dtype` (a gradient handed to backward by the user may come in another dtype).
// ---- unary: y = f(x) ------------------------------------------------------------
// grad_x = g * f'(x) in one fused kernel, ops::unary_backward; the formulas are
// unary_grad in tensor/ops/unary_math.h (x or y as ops::unary_grad_from says):
//   neg: -g                exp: g y               log: g / x             sqrt: g / 2y
//   rsqrt: -g y^3 / 2      tanh: g (1 - y^2)      sigmoid: g y (1 - y)   relu: y > 0 ? g : 0
//   gelu: g (Phi(x) + x phi(x))                   gelu_tanh: llm.c's gelu_backward
//   silu: g s (1 + x (1 - s)), s = sigmoid(x)     abs: g sign(x)         square: 2 g x
//   reciprocal: -g y^2     sin: g cos x           cos: -g sin x          pow: g p x^(p - 1)
//   affine: g scale        clamp: lo <= x <= hi ? g : 0
//   log1p: g / (1 + x)     softplus: beta x > threshold ? g : g sigmoid(beta x)
//   leaky_relu, elu, hardtanh, hardsigmoid, hardswish, mish: autograd/ops/activation.cpp

const char* unary_node_name(UnaryOp op) {
  switch (op) {
#define FRUGAL_UNARY_NODE_NAME(E, name, ints) \
  case UnaryOp::E: return #E "Backward";
    FRUGAL_UNARY_OPS(FRUGAL_UNARY_NODE_NAME)
#undef FRUGAL_UNARY_NODE_NAME
  }
  return "UnaryBackward";
}

struct UnaryBackward final : Node {
  UnaryOp op = UnaryOp::Neg;
  double a = 0, b = 0;      // the op's parameters (see ops::UnaryOp)
  DType dtype = kFloat32;   // of x and y
  SavedTensor saved{this};  // x or y; nothing for neg and affine, nor for relu when it saves a mask
  SavedTensor mask{this};   // relu under compression: ops::relu_mask(y) (Note [Compressed saved tensors])
  std::string name() const override { return unary_node_name(op); }
  TensorList apply(TensorList&& grads) override {
    if (mask.defined()) return {ops::apply_relu_mask(in_dtype(grads[0], dtype), mask.unpack(name()))};
    return {ops::unary_backward(op, in_dtype(grads[0], dtype), saved.unpack(name()), a, b)};
  }
};

/// The unary ops autocast runs in float32 (PyTorch's list; Note [Autocast]).
bool float32_under_autocast(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Log || op == UnaryOp::Pow || op == UnaryOp::Rsqrt ||
         op == UnaryOp::Reciprocal || op == UnaryOp::Log1p || op == UnaryOp::Softplus;
}

/// The raw op through its public function, which checks its parameters (and runs pow(x, 2) as square).
Tensor raw_unary(UnaryOp op, const Tensor& x, double a, double b) {
  if (op == UnaryOp::Pow) return ops::pow(x, a);
  if (op == UnaryOp::Softplus) return ops::softplus(x, a, b);
  if (op == UnaryOp::LeakyRelu) return ops::leaky_relu(x, a);
  if (op == UnaryOp::Elu) return ops::elu(x, a);
  if (op == UnaryOp::Hardtanh) return ops::hardtanh(x, a, b);
  return ops::unary(op, x, a, b);
}

}  // namespace

namespace autograd::detail {

Tensor unary_op(UnaryOp op, const Tensor& x, double a, double b) {
  core::OpScope scope(ops::unary_op_name(op));
  if (float32_under_autocast(op))
    if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return unary_op(op, (*c)[0], a, b);
  Tensor y = autograd::raw([&] { return raw_unary(op, x, a, b); });
  if (auto node = make_node<UnaryBackward>({x})) {
    node->op = op;
    node->a = a;
    node->b = b;
    node->dtype = x.dtype();
    const ops::UnaryGradFrom from = ops::unary_grad_from(op);
    if (from == ops::UnaryGradFrom::Input) node->saved = x;
    if (from == ops::UnaryGradFrom::Output) {
      if (op == UnaryOp::Relu && autograd::detail::relu_saves_mask(y)) {
        const Tensor m = autograd::raw([&] { return ops::relu_mask(y); });
        autograd::detail::count_relu_mask(y, m);
        node->mask = m;
      } else {
        node->saved = y;
      }
    }
    autograd::record(node, {y});
    // y = f(x) again from the saved x (Note [Recomputable outputs]); an op that saves y keeps it anyway.
    if (from == ops::UnaryGradFrom::Input && autograd::RecomputeCheapOutputs::active())
      autograd::recompute::register_output(y, node, ops::unary_op_name(op), 1, [](const UnaryBackward& n) {
        const Tensor xv = n.saved.unpack(n.name());
        return raw_unary(n.op, xv, n.a, n.b);
      });
  }
  return y;
}

}  // namespace autograd::detail

using autograd::detail::unary_op;

// ---- unary -------------------------------------------------------------------------

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::Gelu, x); }
Tensor gelu_tanh(const Tensor& x) { return unary_op(UnaryOp::GeluTanh, x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::Silu, x); }
Tensor log1p(const Tensor& x) { return unary_op(UnaryOp::Log1p, x); }
Tensor softplus(const Tensor& x, double beta, double threshold) {
  return unary_op(UnaryOp::Softplus, x, beta, threshold);
}
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, x); }
Tensor reciprocal(const Tensor& x) { return unary_op(UnaryOp::Reciprocal, x); }
Tensor sin(const Tensor& x) { return unary_op(UnaryOp::Sin, x); }
Tensor cos(const Tensor& x) { return unary_op(UnaryOp::Cos, x); }
Tensor pow(const Tensor& x, double exponent) { return unary_op(UnaryOp::Pow, x, exponent); }
Tensor affine(const Tensor& x, double scale, double shift) { return unary_op(UnaryOp::Affine, x, scale, shift); }
Tensor clamp(const Tensor& x, double lo, double hi) { return unary_op(UnaryOp::Clamp, x, lo, hi); }

// ---- not differentiable: forwarded below autograd ------------------------------------

Tensor isnan(const Tensor& x) {
  core::OpScope scope("isnan");
  return autograd::raw([&] { return ops::isnan(x); });
}
Tensor isinf(const Tensor& x) {
  core::OpScope scope("isinf");
  return autograd::raw([&] { return ops::isinf(x); });
}
Tensor isfinite(const Tensor& x) {
  core::OpScope scope("isfinite");
  return autograd::raw([&] { return ops::isfinite(x); });
}

}  // namespace frugal
