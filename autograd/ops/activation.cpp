// The activations: entries of the unary op list (tensor/ops/unary.h), recorded by
// the one UnaryBackward node of autograd/ops/unary.cpp; each saves its input x. The
// derivatives (unary_grad in tensor/ops/unary_math.h), with PyTorch's branches at the kinks:
//   leaky_relu: x > 0 ? g : g slope               elu: x <= 0 ? g alpha e^x : g
//   hardtanh: x <= lo || x >= hi ? 0 : g          hardsigmoid: -3 < x < 3 ? g / 6 : 0
//   hardswish: x < -3 ? 0 : x <= 3 ? g (x / 3 + 1 / 2) : g
//   mish: g (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x))
//   logsigmoid: g (1 - sigmoid(x))
//   selu: x <= 0 ? g scale alpha e^x : g scale       celu: x <= 0 ? g e^(x / alpha) : g
//   softsign: g / (1 + |x|)^2                        tanhshrink: g tanh(x)^2
//   hardshrink, softshrink: -lambd <= x <= lambd ? 0 : g      threshold: x <= threshold ? 0 : g
// glu and prelu are compositions of differentiable ops.
// hardtanh could keep y instead (y <= lo exactly where x <= lo) only for bounds the dtype
// represents: float16 y = -0.1 rounds above lo = -0.1 and would pass the gradient.
#include "autograd/ops/activation.h"

#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/unary.h"
#include "autograd/ops/unary_op.h"
#include "core/instrument.h"
#include "tensor/shape.h"

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
Tensor selu(const Tensor& x) { return unary_op(UnaryOp::Selu, x); }
Tensor celu(const Tensor& x, double alpha) { return unary_op(UnaryOp::Celu, x, alpha); }
Tensor softsign(const Tensor& x) { return unary_op(UnaryOp::Softsign, x); }
Tensor tanhshrink(const Tensor& x) { return unary_op(UnaryOp::Tanhshrink, x); }
Tensor hardshrink(const Tensor& x, double lambd) { return unary_op(UnaryOp::Hardshrink, x, lambd); }
Tensor softshrink(const Tensor& x, double lambd) { return unary_op(UnaryOp::Softshrink, x, lambd); }
Tensor threshold(const Tensor& x, double threshold, double value) {
  return unary_op(UnaryOp::Threshold, x, threshold, value);
}

Tensor glu(const Tensor& x, int64_t dim) {
  core::OpScope scope("glu");
  FRUGAL_CHECK(x.defined(), "glu: undefined input tensor");
  FRUGAL_CHECK(is_floating(x.dtype()) && x.dim() > 0, "glu: expects a floating tensor of at least one dim, got ",
               x.describe());
  const int64_t d = wrap_dim(dim, x.dim(), "glu");
  FRUGAL_CHECK(x.size(d) % 2 == 0, "glu: the halved dim ", d, " must have an even size, got ", x.describe());
  const std::vector<Tensor> halves = chunk(x, 2, d);
  return mul(halves[0], sigmoid(halves[1]));
}

Tensor prelu(const Tensor& x, const Tensor& weight) {
  core::OpScope scope("prelu");
  FRUGAL_CHECK(x.defined() && weight.defined(), "prelu: undefined input tensor");
  FRUGAL_CHECK(is_floating(x.dtype()) && is_floating(weight.dtype()), "prelu: expects floating tensors, got x ",
               x.describe(), " and weight ", weight.describe());
  FRUGAL_CHECK(x.device() == weight.device(), "prelu: x ", x.describe(), " and weight ", weight.describe(),
               " must be on one device");
  const int64_t channels = x.dim() >= 2 ? x.size(1) : 1;
  FRUGAL_CHECK(weight.dim() <= 1 && (weight.numel() == 1 || weight.numel() == channels), "prelu: weight ",
               weight.describe(), " must hold 1 value or one per channel (", channels, ", x's dim 1) of x ",
               x.describe());
  // One value a channel, along x's dim 1: (C, 1, ..., 1) broadcasts against (N, C, ...). The weight
  // is used in x's dtype (a float32 weight meets float16 activations under autocast).
  Shape shape(size_t(x.dim() >= 2 ? x.dim() - 1 : 0), 1);
  if (!shape.empty()) shape[0] = weight.numel();
  const Tensor w = weight.reshape(weight.numel() == 1 ? Shape{} : shape).to(x.dtype());
  return where(gt(x, 0.0), x, mul(w, x));
}

}  // namespace frugal
