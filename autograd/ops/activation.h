#pragma once
// Differentiable activations (torch.nn.functional's leaky_relu, elu, hardtanh, relu6, hardsigmoid,
// hardswish, mish, logsigmoid, selu, celu, softsign, tanhshrink, hardshrink, softshrink,
// threshold, glu and prelu): the raw ops of tensor/ops/unary.h with PyTorch's
// gradients at the kinks (derivatives.yaml and aten's activation kernels). A NaN input gives a
// NaN output, and the gradient PyTorch's comparisons give it. Gradients come back in the
// input's dtype.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// x > 0 ? x : negative_slope x; the gradient at 0 (and at NaN) is negative_slope, as
/// PyTorch's. negative_slope finite.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
/// x > 0 ? x : alpha (e^x - 1); the gradient is alpha e^x where x <= 0, else 1. alpha finite.
Tensor elu(const Tensor& x, double alpha = 1.0);
/// clamp(x, min_val, max_val) with the gradient 0 at and past both bounds (clamp passes it at
/// the bounds); min_val <= max_val, neither NaN.
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
/// hardtanh(x, 0, 6), as PyTorch.
Tensor relu6(const Tensor& x);
/// relu6(x + 3) / 6; the gradient is 1/6 strictly inside (-3, 3), else 0.
Tensor hardsigmoid(const Tensor& x);
/// x relu6(x + 3) / 6; the gradient is 0 below -3, x / 3 + 1/2 on [-3, 3], 1 above.
Tensor hardswish(const Tensor& x);
/// x tanh(softplus(x)).
Tensor mish(const Tensor& x);
/// log(sigmoid(x)) = -softplus(-x), finite for every finite x; the gradient is 1 - sigmoid(x)
/// (torch.nn.functional.logsigmoid).
Tensor logsigmoid(const Tensor& x);
/// scale (x > 0 ? x : alpha (e^x - 1)), SELU's constants (ops::kSeluAlpha, ops::kSeluScale); the
/// gradient is scale alpha e^x where x <= 0, else scale.
Tensor selu(const Tensor& x);
/// x > 0 ? x : alpha (e^(x / alpha) - 1); the gradient is e^(x / alpha) where x <= 0, else 1.
/// alpha finite and nonzero.
Tensor celu(const Tensor& x, double alpha = 1.0);
/// x / (1 + |x|) (+-1 at +-inf); the gradient is 1 / (1 + |x|)^2.
Tensor softsign(const Tensor& x);
/// x - tanh(x); the gradient is tanh(x)^2.
Tensor tanhshrink(const Tensor& x);
/// 0 on [-lambd, lambd], else x; the gradient is 0 on [-lambd, lambd], else 1.
Tensor hardshrink(const Tensor& x, double lambd = 0.5);
/// x -+ lambd outside [-lambd, lambd], else 0; the gradient is hardshrink's. lambd >= 0.
Tensor softshrink(const Tensor& x, double lambd = 0.5);
/// x <= threshold ? value : x; the gradient is 0 at and below the threshold, else 1.
Tensor threshold(const Tensor& x, double threshold, double value);
/// a * sigmoid(b) for the two halves a, b of x along `dim` (torch.nn.functional.glu); x's size
/// there must be even. Composed of differentiable ops (chunk, sigmoid, mul).
Tensor glu(const Tensor& x, int64_t dim = -1);
/// x > 0 ? x : weight x (torch.nn.functional.prelu), weight one value or one per channel
/// (x's dim 1; a 0-d or 1-D x takes one value); differentiable in x and weight.
Tensor prelu(const Tensor& x, const Tensor& weight);

}  // namespace frugal
