#pragma once
// Differentiable unary ops: one node type for all of them (UnaryBackward), each derivative
// one fused kernel (ops::unary_backward). Same names, arguments and semantics (dtypes,
// errors) as the raw ops in tensor/ops/unary.h; gradients come back in the input's dtype.
#include "tensor/tensor.h"

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
/// torch.nn.functional.leaky_relu: the gradient at 0 is negative_slope, as PyTorch's.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
/// torch.nn.functional.elu: x > 0 ? x : alpha (e^x - 1).
Tensor elu(const Tensor& x, double alpha = 1.0);
/// torch.nn.functional.hardtanh: clamp(x, min_val, max_val), gradient 0 at and past both
/// bounds (clamp passes it at the bounds). relu6 = hardtanh(x, 0, 6), as PyTorch.
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor relu6(const Tensor& x);
/// relu6(x + 3) / 6
Tensor hardsigmoid(const Tensor& x);
/// x relu6(x + 3) / 6
Tensor hardswish(const Tensor& x);
/// x tanh(softplus(x))
Tensor mish(const Tensor& x);
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

}  // namespace frugal
