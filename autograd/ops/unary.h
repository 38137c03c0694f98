#pragma once
// Differentiable unary ops: one node type for all of them (UnaryBackward), each derivative
// one fused kernel (ops::unary_backward). Same names, arguments and semantics (dtypes,
// errors) as the raw ops in tensor/ops/unary.h; gradients come back in the input's dtype.
#include "tensor/tensor.h"

// leaky_relu, elu, hardtanh, relu6, hardsigmoid, hardswish and mish: autograd/ops/activation.h.

namespace frugal {

/// -x
Tensor neg(const Tensor& x);
/// e^x
Tensor exp(const Tensor& x);
/// Natural logarithm.
Tensor log(const Tensor& x);
/// Square root.
Tensor sqrt(const Tensor& x);
/// 1 / sqrt(x)
Tensor rsqrt(const Tensor& x);
/// Hyperbolic tangent.
Tensor tanh(const Tensor& x);
/// 1 / (1 + e^-x)
Tensor sigmoid(const Tensor& x);
/// max(x, 0); the gradient is 0 at 0.
Tensor relu(const Tensor& x);
/// Exact GELU, x * Phi(x).
Tensor gelu(const Tensor& x);
/// GELU with the tanh approximation (PyTorch's approximate='tanh').
Tensor gelu_tanh(const Tensor& x);
/// x * sigmoid(x)
Tensor silu(const Tensor& x);
/// log(1 + x), accurate near 0.
Tensor log1p(const Tensor& x);
/// torch.nn.functional.softplus: log(1 + exp(beta x)) / beta, x where beta x > threshold
/// (threshold = inf: never); the gradient is sigmoid(beta x), 0.5 at 0.
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// |x|; the gradient is 0 at 0.
Tensor abs(const Tensor& x);
/// x * x
Tensor square(const Tensor& x);
/// 1 / x
Tensor reciprocal(const Tensor& x);
/// Sine.
Tensor sin(const Tensor& x);
/// Cosine.
Tensor cos(const Tensor& x);
/// tan, the inverse and hyperbolic functions (NaN outside their domains, as torch); the
/// gradients are derivatives.yaml's: tan' = 1 + y^2 (from y), asin' = 1 / sqrt(1 - x^2),
/// acos' = -asin', atan' = 1 / (1 + x^2), sinh' = cosh, cosh' = sinh, asinh' = 1 / sqrt(x^2 + 1),
/// acosh' = 1 / sqrt(x^2 - 1), atanh' = 1 / (1 - x^2).
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
/// The error function; the gradient is 2 / sqrt(pi) e^(-x^2).
Tensor erf(const Tensor& x);
/// 1 - erf(x), accurate where erf(x) is near 1.
Tensor erfc(const Tensor& x);
/// e^x - 1, accurate near 0; the gradient y + 1 (from y).
Tensor expm1(const Tensor& x);
/// 2^x; the gradient y ln 2 (from y).
Tensor exp2(const Tensor& x);
/// Base-2 and base-10 logarithms.
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
/// floor, ceil, trunc, round (to nearest, ties to even) and sign (-1, 0, 1; NaN for NaN), in x's
/// dtype, integer tensors too; the gradient is zeros, as PyTorch's (nothing is saved).
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor round(const Tensor& x);
Tensor sign(const Tensor& x);
/// x ^ exponent
Tensor pow(const Tensor& x, double exponent);
/// x * scale + shift in one pass.
Tensor affine(const Tensor& x, double scale, double shift);
/// min(max(x, lo), hi); the gradient passes where lo <= x <= hi.
Tensor clamp(const Tensor& x, double lo, double hi);

// ---- not differentiable: the raw ops, forwarded (bool results, nothing recorded) ---
/// x != x; bool result of x's shape (false everywhere for integer and bool x).
Tensor isnan(const Tensor& x);
/// x is +inf or -inf; bool result (false for integer and bool x).
Tensor isinf(const Tensor& x);
/// neither NaN nor infinite; bool result (true for integer and bool x).
Tensor isfinite(const Tensor& x);

}  // namespace frugal
