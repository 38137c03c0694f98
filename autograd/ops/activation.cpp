// The piecewise activations: entries of the unary op list (tensor/ops/unary.h), recorded by
// the one UnaryBackward node of autograd/ops/unary.cpp; each saves its input x. The
// derivatives (unary_grad in tensor/ops/unary_math.h), with PyTorch's branches at the kinks:
//   leaky_relu: x > 0 ? g : g slope               elu: x <= 0 ? g alpha e^x : g
//   hardtanh: x <= lo || x >= hi ? 0 : g          hardsigmoid: -3 < x < 3 ? g / 6 : 0
//   hardswish: x < -3 ? 0 : x <= 3 ? g (x / 3 + 1 / 2) : g
//   mish: g (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x))
//   logsigmoid: g (1 - sigmoid(x))
// hardtanh could keep y instead (y <= lo exactly where x <= lo) only for bounds the dtype
// represents: float16 y = -0.1 rounds above lo = -0.1 and would pass the gradient.
#include "autograd/ops/activation.h"

#include "autograd/ops/unary_op.h"

namespace frugal {

using autograd::detail::unary_op;
using ops::UnaryOp;

Tensor leaky_relu(const Tensor& x, double negative_slope) { return unary_op(UnaryOp::LeakyRelu, x, negative_slope); }
Tensor elu(const Tensor& x, double alpha) { return unary_op(UnaryOp::Elu, x, alpha); }
Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  return unary_op(UnaryOp::Hardtanh, x, min_val, max_val);
}
Tensor relu6(const Tensor& x) {
  // Checked here so that its errors name relu6, not the hardtanh it runs as.
  FRUGAL_CHECK(x.defined(), "relu6: undefined input tensor");
  FRUGAL_CHECK(is_floating(x.dtype()), "relu6: expects a floating tensor, got ", x.describe());
  return hardtanh(x, 0.0, 6.0);
}
Tensor hardsigmoid(const Tensor& x) { return unary_op(UnaryOp::Hardsigmoid, x); }
Tensor hardswish(const Tensor& x) { return unary_op(UnaryOp::Hardswish, x); }
Tensor mish(const Tensor& x) { return unary_op(UnaryOp::Mish, x); }
Tensor logsigmoid(const Tensor& x) { return unary_op(UnaryOp::LogSigmoid, x); }

}  // namespace frugal
