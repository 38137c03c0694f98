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
