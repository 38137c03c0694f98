#pragma once
// Differentiable piecewise activations (torch.nn.functional's leaky_relu, elu, hardtanh, relu6,
// hardsigmoid, hardswish, mish and logsigmoid): the raw ops of tensor/ops/unary.h with PyTorch's
// gradients at the kinks (derivatives.yaml and aten's activation kernels). A NaN input gives a
// NaN output, and the gradient PyTorch's comparisons give it. Gradients come back in the
// input's dtype.
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

}  // namespace frugal
