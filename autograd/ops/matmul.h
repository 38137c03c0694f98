#pragma once
// Differentiable matrix products. Same semantics as the raw ops in tensor/ops/matmul.h.
#include "tensor/tensor.h"

namespace frugal {

/// torch.matmul: dot, matrix-vector, matrix and broadcast batched products.
Tensor matmul(const Tensor& a, const Tensor& b);
/// torch.nn.functional.linear: x (..., in) @ weight (out, in)^T + bias (out); bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace frugal
