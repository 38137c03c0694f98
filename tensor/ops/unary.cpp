#include "tensor/ops/unary.h"

#include <cmath>
#include <string>

#include "tensor/device_dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"

namespace frugal::ops {

Tensor unary(UnaryOp op, const Tensor& x, double a, double b) {
  const char* name = unary_op_name(op);
  FRUGAL_CHECK(x.defined(), name, ": undefined input tensor");
  const bool ok = is_floating(x.dtype()) || (unary_op_allows_integers(op) && is_integral(x.dtype()));
  FRUGAL_CHECK(ok, name, ": expects a ", unary_op_allows_integers(op) ? "floating or integer" : "floating",
               " tensor, got ", x.describe());
  Tensor out = empty_elementwise_output(x.sizes(), x.options(), {&x});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(name, x.device(), unary_kernel, op, out, x, a, b);
  return out;
}

Tensor neg(const Tensor& x) { return unary(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::Rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::Gelu, x); }
Tensor gelu_tanh(const Tensor& x) { return unary(UnaryOp::GeluTanh, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::Silu, x); }
Tensor log1p(const Tensor& x) { return unary(UnaryOp::Log1p, x); }
Tensor softplus(const Tensor& x, double beta, double threshold) {
  FRUGAL_CHECK(std::isfinite(beta) && beta != 0.0 && !std::isnan(threshold),
               "softplus: beta must be finite and nonzero and threshold not NaN, got beta ", beta, ", threshold ",
               threshold);
  return unary(UnaryOp::Softplus, x, beta, threshold);
}
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  FRUGAL_CHECK(std::isfinite(negative_slope), "leaky_relu: negative_slope must be finite, got ", negative_slope);
  return unary(UnaryOp::LeakyRelu, x, negative_slope);
}
Tensor elu(const Tensor& x, double alpha) {
  FRUGAL_CHECK(std::isfinite(alpha), "elu: alpha must be finite, got ", alpha);
  return unary(UnaryOp::Elu, x, alpha);
}
Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  FRUGAL_CHECK(!std::isnan(min_val) && !std::isnan(max_val) && min_val <= max_val,
               "hardtanh: min_val must not be greater than max_val (nor NaN), got min_val ", min_val, ", max_val ",
               max_val);
  return unary(UnaryOp::Hardtanh, x, min_val, max_val);
}
Tensor relu6(const Tensor& x) {
  // Checked here so that its errors name relu6, not the hardtanh it runs as.
  FRUGAL_CHECK(x.defined(), "relu6: undefined input tensor");
  FRUGAL_CHECK(is_floating(x.dtype()), "relu6: expects a floating tensor, got ", x.describe());
  return hardtanh(x, 0.0, 6.0);
}
Tensor hardsigmoid(const Tensor& x) { return unary(UnaryOp::Hardsigmoid, x); }
Tensor hardswish(const Tensor& x) { return unary(UnaryOp::Hardswish, x); }
Tensor mish(const Tensor& x) { return unary(UnaryOp::Mish, x); }
Tensor selu(const Tensor& x) { return unary(UnaryOp::Selu, x); }
Tensor celu(const Tensor& x, double alpha) {
  FRUGAL_CHECK(std::isfinite(alpha) && alpha != 0.0, "celu: alpha must be finite and nonzero, got ", alpha);
  return unary(UnaryOp::Celu, x, alpha);
}
Tensor softsign(const Tensor& x) { return unary(UnaryOp::Softsign, x); }
Tensor tanhshrink(const Tensor& x) { return unary(UnaryOp::Tanhshrink, x); }
Tensor hardshrink(const Tensor& x, double lambd) {
  FRUGAL_CHECK(!std::isnan(lambd), "hardshrink: lambd must not be NaN");
  return unary(UnaryOp::Hardshrink, x, lambd);
}
Tensor softshrink(const Tensor& x, double lambd) {
  FRUGAL_CHECK(lambd >= 0.0, "softshrink: lambd must be >= 0, got ", lambd);
  return unary(UnaryOp::Softshrink, x, lambd);
}
Tensor threshold(const Tensor& x, double threshold, double value) {
  FRUGAL_CHECK(!std::isnan(threshold), "threshold: threshold must not be NaN");
  return unary(UnaryOp::Threshold, x, threshold, value);
}
Tensor abs(const Tensor& x) { return unary(UnaryOp::Abs, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::Square, x); }
Tensor reciprocal(const Tensor& x) { return unary(UnaryOp::Reciprocal, x); }
Tensor sin(const Tensor& x) { return unary(UnaryOp::Sin, x); }
Tensor cos(const Tensor& x) { return unary(UnaryOp::Cos, x); }
Tensor tan(const Tensor& x) { return unary(UnaryOp::Tan, x); }
Tensor asin(const Tensor& x) { return unary(UnaryOp::Asin, x); }
Tensor acos(const Tensor& x) { return unary(UnaryOp::Acos, x); }
Tensor atan(const Tensor& x) { return unary(UnaryOp::Atan, x); }
Tensor sinh(const Tensor& x) { return unary(UnaryOp::Sinh, x); }
Tensor cosh(const Tensor& x) { return unary(UnaryOp::Cosh, x); }
Tensor asinh(const Tensor& x) { return unary(UnaryOp::Asinh, x); }
Tensor acosh(const Tensor& x) { return unary(UnaryOp::Acosh, x); }
Tensor atanh(const Tensor& x) { return unary(UnaryOp::Atanh, x); }
Tensor erf(const Tensor& x) { return unary(UnaryOp::Erf, x); }
Tensor erfc(const Tensor& x) { return unary(UnaryOp::Erfc, x); }
Tensor expm1(const Tensor& x) { return unary(UnaryOp::Expm1, x); }
Tensor exp2(const Tensor& x) { return unary(UnaryOp::Exp2, x); }
Tensor log2(const Tensor& x) { return unary(UnaryOp::Log2, x); }
Tensor log10(const Tensor& x) { return unary(UnaryOp::Log10, x); }
Tensor logsigmoid(const Tensor& x) { return unary(UnaryOp::LogSigmoid, x); }
Tensor floor(const Tensor& x) { return unary(UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return unary(UnaryOp::Ceil, x); }
Tensor trunc(const Tensor& x) { return unary(UnaryOp::Trunc, x); }
Tensor round(const Tensor& x) { return unary(UnaryOp::Round, x); }
Tensor sign(const Tensor& x) { return unary(UnaryOp::Sign, x); }

Tensor pow(const Tensor& x, double exponent) {
  // x^2 is common (variances, norms): one correctly rounded multiply beats powf.
  if (exponent == 2.0 && x.defined() && is_floating(x.dtype())) return unary(UnaryOp::Square, x);
  return unary(UnaryOp::Pow, x, exponent);
}

Tensor affine(const Tensor& x, double scale, double shift) { return unary(UnaryOp::Affine, x, scale, shift); }

Tensor clamp(const Tensor& x, double lo, double hi) { return unary(UnaryOp::Clamp, x, lo, hi); }

namespace {

Tensor float_class(FloatClass c, const Tensor& x) {
  const char* name = float_class_name(c);
  FRUGAL_CHECK(x.defined(), name, ": undefined input tensor");
  // Integers and bools hold no NaN or infinity: a constant answer, no kernel.
  if (!is_floating(x.dtype())) return full(x.sizes(), c == FloatClass::Finite ? 1.0 : 0.0, {kBool, x.device()});
  Tensor out = empty_elementwise_output(x.sizes(), {kBool, x.device()}, {&x});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(name, x.device(), float_class_kernel, c, out, x);
  return out;
}

}  // namespace

Tensor isnan(const Tensor& x) { return float_class(FloatClass::Nan, x); }
Tensor isinf(const Tensor& x) { return float_class(FloatClass::Inf, x); }
Tensor isfinite(const Tensor& x) { return float_class(FloatClass::Finite, x); }

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x_or_out, double a, double b) {
  const std::string name = std::string(unary_op_name(op)) + "_backward";
  FRUGAL_CHECK(grad.defined(), name, ": undefined gradient tensor");
  FRUGAL_CHECK(is_floating(grad.dtype()), name, ": expects a floating gradient, got ", grad.describe());
  const UnaryGradFrom from = unary_grad_from(op);
  if (from == UnaryGradFrom::Zero) return zeros(grad.sizes(), grad.options());
  // A constant factor: -g or scale * g, one pass of the affine kernel.
  if (from == UnaryGradFrom::Nothing) return unary(UnaryOp::Affine, grad, op == UnaryOp::Neg ? -1.0 : a, 0.0);
  const char* what = from == UnaryGradFrom::Output ? "output" : "input";
  FRUGAL_CHECK(x_or_out.defined(), name, ": needs the forward ", what, ", got an undefined tensor");
  FRUGAL_CHECK(x_or_out.sizes() == grad.sizes() && x_or_out.dtype() == grad.dtype(), name, ": the gradient ",
               grad.describe(), " and the forward ", what, " ", x_or_out.describe(),
               " must have the same shape and dtype");
  check_same_device(name.c_str(), grad, x_or_out);
  Tensor out = empty_elementwise_output(grad.sizes(), grad.options(), {&grad, &x_or_out});
  if (out.numel() > 0)
    FRUGAL_DEVICE_DISPATCH(name.c_str(), grad.device(), unary_backward_kernel, op, out, grad, x_or_out, a, b);
  return out;
}

}  // namespace frugal::ops
