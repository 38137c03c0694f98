// Unary ops, forward and backward side by side: one node for all of them, each
// derivative one fused kernel (ops::unary_backward).
#include "autograd/ops/unary.h"

#include <cmath>
#include <numbers>

#include "autograd/autocast.h"
#include "autograd/compress.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/unary_op.h"
#include "autograd/recompute_cheap.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
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
//   tan: g (1 + y^2)       asin: g / sqrt(1 - x^2)  acos: -g / sqrt(1 - x^2) atan: g / (1 + x^2)
//   sinh: g cosh x         cosh: g sinh x          asinh: g / sqrt(x^2 + 1) acosh: g / sqrt(x^2 - 1)
//   atanh: g / (1 - x^2)   erf: g 2 e^(-x^2) / sqrt(pi)                     erfc: -erf's
//   expm1: g (y + 1)       exp2: g y ln 2          log2: g / (x ln 2)     log10: g / (x ln 10)
//   floor, ceil, trunc, round, sign: zeros (PyTorch's; nothing saved)
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

/// phi(x) (2 - x^2) = gelu''(x), phi the standard normal density, in raw or differentiable ops.
template <bool differentiable>
Tensor gelu_second_derivative(const Tensor& x) {
  constexpr double inv_sqrt_2pi = 0.3989422804014327;
  if constexpr (differentiable) {
    const Tensor x2 = frugal::square(x);
    return frugal::mul(frugal::mul(frugal::exp(frugal::mul(x2, -0.5)), inv_sqrt_2pi), frugal::rsub(x2, 2.0));
  } else {
    const Tensor x2 = ops::square(x);
    return ops::mul(ops::mul(ops::exp(ops::mul(x2, -0.5)), inv_sqrt_2pi), ops::affine(x2, -1.0, 2.0));
  }
}

// y = gelu'(x) = Phi(x) + x phi(x), what exact GELU's backward multiplies g by under create_graph
// (PyTorch has no differentiable erf either: its gelu_backward has its own derivative)
// grad_x = G gelu''(x)
struct GeluDerivativeBackward final : Node {
  SavedTensor x{this};
  std::string name() const override { return "GeluBackwardBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::mul(grads[0], gelu_second_derivative<false>(x.unpack(name())))};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    return {frugal::mul(grads[0], gelu_second_derivative<true>(autograd::graph::saved_input(*this, 0, x)))};
  }
};

/// gelu'(x), recorded (Note [Double backward]).
Tensor gelu_derivative(const Tensor& x) {
  Tensor y = autograd::raw([&] { return ops::unary_backward(UnaryOp::Gelu, ones_like(x), x); });
  if (auto node = make_node<GeluDerivativeBackward>({x})) {
    node->x = x;
    autograd::record(node, {y});
  }
  return y;
}

/// Whether f' is piecewise constant: g f'(x) then depends on x with a zero derivative.
bool is_piecewise_linear(UnaryOp op) {
  switch (op) {
    case UnaryOp::Relu:
    case UnaryOp::Abs:
    case UnaryOp::Clamp:
    case UnaryOp::Hardtanh:
    case UnaryOp::LeakyRelu:
    case UnaryOp::Hardsigmoid:
    case UnaryOp::Hardshrink:
    case UnaryOp::Softshrink:
    case UnaryOp::Threshold: return true;
    default: return false;
  }
}

}  // namespace

// The same conventions at the kinks as ops::unary_backward, whose masks are constants (their
// derivative is 0 almost everywhere).
Tensor autograd::detail::unary_grad_graph(UnaryOp op, const Tensor& g, const Tensor& v, double a, double b) {
  // Masks and factors of the kinks are constants, computed below autograd from v's values.
  const Tensor vd = v.defined() ? v.detach() : v;
  auto constant = [](auto&& f) { return autograd::raw(f); };
  auto mask = [&](auto&& keep) {
    return frugal::masked_fill(g, constant([&] { return ops::logical_not(keep()); }), 0.0);
  };
  switch (op) {
    case UnaryOp::Neg: return frugal::neg(g);
    case UnaryOp::Affine: return frugal::mul(g, a);
    case UnaryOp::Exp: return frugal::mul(g, v);
    case UnaryOp::Log: return frugal::div(g, v);
    case UnaryOp::Sqrt: return frugal::div(g, frugal::mul(v, 2.0));
    case UnaryOp::Rsqrt: return frugal::mul(g, frugal::mul(frugal::pow(v, 3.0), -0.5));
    case UnaryOp::Tanh: return frugal::mul(g, frugal::rsub(frugal::square(v), 1.0));
    case UnaryOp::Sigmoid: return frugal::mul(g, frugal::mul(v, frugal::rsub(v, 1.0)));
    case UnaryOp::Relu: return mask([&] { return ops::gt(vd, 0.0); });
    case UnaryOp::Reciprocal: return frugal::mul(g, frugal::neg(frugal::square(v)));
    case UnaryOp::Square: return frugal::mul(g, frugal::mul(v, 2.0));
    case UnaryOp::Sin: return frugal::mul(g, frugal::cos(v));
    case UnaryOp::Cos: return frugal::mul(g, frugal::neg(frugal::sin(v)));
    case UnaryOp::Pow: return a == 0.0 ? frugal::mul(g, 0.0) : frugal::mul(g, frugal::mul(frugal::pow(v, a - 1.0), a));
    case UnaryOp::Log1p: return frugal::div(g, frugal::add(v, 1.0));
    case UnaryOp::Abs:
      return frugal::mul(
          g, constant([&] { return ops::sub(ops::gt(vd, 0.0).to(vd.dtype()), ops::lt(vd, 0.0).to(vd.dtype())); }));
    case UnaryOp::Clamp: return mask([&] { return ops::logical_and(ops::ge(vd, a), ops::le(vd, b)); });
    case UnaryOp::Hardtanh: return mask([&] { return ops::logical_and(ops::gt(vd, a), ops::lt(vd, b)); });
    case UnaryOp::LeakyRelu:
      return frugal::mul(g, constant([&] { return ops::where(ops::gt(vd, 0.0), ones_like(vd), full_like(vd, a)); }));
    case UnaryOp::Elu:
      return frugal::where(constant([&] { return ops::gt(vd, 0.0); }), g,
                           frugal::mul(g, frugal::mul(frugal::exp(v), a)));
    case UnaryOp::Hardsigmoid:
      return frugal::mul(mask([&] { return ops::logical_and(ops::gt(vd, -3.0), ops::lt(vd, 3.0)); }), 1.0 / 6.0);
    case UnaryOp::Hardswish: {  // 0 below -3, x / 3 + 1 / 2 on [-3, 3], 1 above
      const Tensor mid = frugal::mul(g, frugal::affine(v, 1.0 / 3.0, 0.5));
      const Tensor below = constant([&] { return ops::lt(vd, -3.0); }),
                   above = constant([&] { return ops::gt(vd, 3.0); });
      return frugal::where(below, frugal::mul(g, 0.0), frugal::where(above, g, mid));
    }
    case UnaryOp::Silu: {  // s (1 + x (1 - s)), s = sigmoid(x)
      const Tensor sig = frugal::sigmoid(v);
      return frugal::mul(g, frugal::mul(sig, frugal::add(frugal::mul(v, frugal::rsub(sig, 1.0)), 1.0)));
    }
    case UnaryOp::Softplus: {  // sigmoid(beta x), 1 where beta x > threshold (the op is x there)
      const Tensor bx = frugal::mul(v, a);
      return frugal::mul(
          g, frugal::masked_fill(frugal::sigmoid(bx), constant([&] { return ops::gt(bx.detach(), b); }), 1.0));
    }
    case UnaryOp::GeluTanh: {  // 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3))
      constexpr double k = 0.7978845608028654, c = 0.044715;
      const Tensor x2 = frugal::square(v);
      const Tensor t = frugal::tanh(frugal::mul(frugal::mul(v, frugal::affine(x2, c, 1.0)), k));
      const Tensor slope =
          frugal::mul(frugal::mul(v, frugal::rsub(frugal::square(t), 1.0)), frugal::affine(x2, 3.0 * c, 1.0));
      return frugal::mul(g, frugal::add(frugal::affine(t, 0.5, 0.5), frugal::mul(slope, 0.5 * k)));
    }
    case UnaryOp::Gelu: return frugal::mul(g, gelu_derivative(v));
    case UnaryOp::Mish: {  // t + x (1 - t^2) sigmoid(x), t = tanh(softplus(x))
      const Tensor t = frugal::tanh(frugal::softplus(v));
      return frugal::mul(g, frugal::add(t, frugal::mul(frugal::mul(v, frugal::rsub(frugal::square(t), 1.0)), frugal::sigmoid(v))));
    }
    case UnaryOp::Selu:
      return frugal::mul(frugal::where(constant([&] { return ops::gt(vd, 0.0); }), g,
                                       frugal::mul(g, frugal::mul(frugal::exp(v), ops::kSeluAlpha))),
                         ops::kSeluScale);
    case UnaryOp::Celu:
      return frugal::where(constant([&] { return ops::gt(vd, 0.0); }), g,
                           frugal::mul(g, frugal::exp(frugal::div(v, a))));
    case UnaryOp::Softsign: return frugal::div(g, frugal::square(frugal::add(frugal::abs(v), 1.0)));
    case UnaryOp::Tanhshrink: return frugal::mul(g, frugal::square(frugal::tanh(v)));
    case UnaryOp::Hardshrink:
    case UnaryOp::Softshrink:
      return mask([&] { return ops::logical_not(ops::logical_and(ops::ge(vd, -a), ops::le(vd, a))); });
    case UnaryOp::Threshold: return mask([&] { return ops::logical_not(ops::le(vd, a)); });
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Trunc:
    case UnaryOp::Round:
    case UnaryOp::Sign: return constant([&] { return zeros_like(g); });
    case UnaryOp::Tan: return frugal::mul(g, frugal::add(frugal::square(v), 1.0));
    case UnaryOp::Asin: return frugal::mul(g, frugal::rsqrt(frugal::rsub(frugal::square(v), 1.0)));
    case UnaryOp::Acos: return frugal::mul(g, frugal::neg(frugal::rsqrt(frugal::rsub(frugal::square(v), 1.0))));
    case UnaryOp::Atan: return frugal::div(g, frugal::add(frugal::square(v), 1.0));
    case UnaryOp::Sinh: return frugal::mul(g, frugal::cosh(v));
    case UnaryOp::Cosh: return frugal::mul(g, frugal::sinh(v));
    case UnaryOp::Asinh: return frugal::mul(g, frugal::rsqrt(frugal::add(frugal::square(v), 1.0)));
    case UnaryOp::Acosh: return frugal::mul(g, frugal::rsqrt(frugal::add(frugal::square(v), -1.0)));
    case UnaryOp::Atanh: return frugal::div(g, frugal::rsub(frugal::square(v), 1.0));
    case UnaryOp::Erf:
    case UnaryOp::Erfc: {
      const double k = (op == UnaryOp::Erf ? 2.0 : -2.0) / std::sqrt(std::numbers::pi);
      return frugal::mul(g, frugal::mul(frugal::exp(frugal::neg(frugal::square(v))), k));
    }
    case UnaryOp::Expm1: return frugal::mul(g, frugal::add(v, 1.0));
    case UnaryOp::Exp2: return frugal::mul(g, frugal::mul(v, std::numbers::ln2));
    case UnaryOp::Log2: return frugal::div(g, frugal::mul(v, std::numbers::ln2));
    case UnaryOp::Log10: return frugal::div(g, frugal::mul(v, std::numbers::ln10));
    case UnaryOp::LogSigmoid: return frugal::mul(g, frugal::sigmoid(frugal::neg(v)));  // 1 - sigmoid(x)
  }
  FRUGAL_FAIL(ops::unary_op_name(op), ": no double backward");
}

namespace {

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
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    if (mask.defined()) {  // relu's packed mask: 0 where the gradient is dropped
      const Tensor dropped =
          autograd::raw([&] { return ops::eq(ops::apply_relu_mask(ones_like(g), mask.unpack(name())), 0.0); });
      return {autograd::graph::with_zero_derivative(frugal::masked_fill(g, dropped, 0.0), *this, 0)};
    }
    const ops::UnaryGradFrom from = ops::unary_grad_from(op);
    const Tensor v = from == ops::UnaryGradFrom::Input    ? autograd::graph::saved_input(*this, 0, saved)
                     : from == ops::UnaryGradFrom::Output ? autograd::graph::saved_output(*this, 0, saved)
                                                          : Tensor();
    const Tensor gx = autograd::detail::unary_grad_graph(op, g, v, a, b);
    return {is_piecewise_linear(op) ? autograd::graph::with_zero_derivative(gx, *this, 0) : gx};
  }
};

/// The unary ops autocast runs in float32 (PyTorch's list; Note [Autocast]).
bool float32_under_autocast(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Expm1:
    case UnaryOp::Log:
    case UnaryOp::Log2:
    case UnaryOp::Log10:
    case UnaryOp::Log1p:
    case UnaryOp::Pow:
    case UnaryOp::Rsqrt:
    case UnaryOp::Reciprocal:
    case UnaryOp::Softplus:
    case UnaryOp::Tan:
    case UnaryOp::Asin:
    case UnaryOp::Acos:
    case UnaryOp::Sinh:
    case UnaryOp::Cosh: return true;
    default: return false;
  }
}

/// The raw op through its public function, which checks its parameters (and runs pow(x, 2) as square).
Tensor raw_unary(UnaryOp op, const Tensor& x, double a, double b) {
  if (op == UnaryOp::Pow) return ops::pow(x, a);
  if (op == UnaryOp::Softplus) return ops::softplus(x, a, b);
  if (op == UnaryOp::LeakyRelu) return ops::leaky_relu(x, a);
  if (op == UnaryOp::Elu) return ops::elu(x, a);
  if (op == UnaryOp::Hardtanh) return ops::hardtanh(x, a, b);
  if (op == UnaryOp::Celu) return ops::celu(x, a);
  if (op == UnaryOp::Hardshrink) return ops::hardshrink(x, a);
  if (op == UnaryOp::Softshrink) return ops::softshrink(x, a);
  if (op == UnaryOp::Threshold) return ops::threshold(x, a, b);
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
Tensor tan(const Tensor& x) { return unary_op(UnaryOp::Tan, x); }
Tensor asin(const Tensor& x) { return unary_op(UnaryOp::Asin, x); }
Tensor acos(const Tensor& x) { return unary_op(UnaryOp::Acos, x); }
Tensor atan(const Tensor& x) { return unary_op(UnaryOp::Atan, x); }
Tensor sinh(const Tensor& x) { return unary_op(UnaryOp::Sinh, x); }
Tensor cosh(const Tensor& x) { return unary_op(UnaryOp::Cosh, x); }
Tensor asinh(const Tensor& x) { return unary_op(UnaryOp::Asinh, x); }
Tensor acosh(const Tensor& x) { return unary_op(UnaryOp::Acosh, x); }
Tensor atanh(const Tensor& x) { return unary_op(UnaryOp::Atanh, x); }
Tensor erf(const Tensor& x) { return unary_op(UnaryOp::Erf, x); }
Tensor erfc(const Tensor& x) { return unary_op(UnaryOp::Erfc, x); }
Tensor expm1(const Tensor& x) { return unary_op(UnaryOp::Expm1, x); }
Tensor exp2(const Tensor& x) { return unary_op(UnaryOp::Exp2, x); }
Tensor log2(const Tensor& x) { return unary_op(UnaryOp::Log2, x); }
Tensor log10(const Tensor& x) { return unary_op(UnaryOp::Log10, x); }
Tensor floor(const Tensor& x) { return unary_op(UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return unary_op(UnaryOp::Ceil, x); }
Tensor trunc(const Tensor& x) { return unary_op(UnaryOp::Trunc, x); }
Tensor round(const Tensor& x) { return unary_op(UnaryOp::Round, x); }
Tensor sign(const Tensor& x) { return unary_op(UnaryOp::Sign, x); }
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
