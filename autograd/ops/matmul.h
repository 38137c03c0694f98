#pragma once
// Differentiable matrix products. Same semantics as the raw ops in tensor/ops/matmul.h.
#include "tensor/tensor.h"

namespace frugal {

/// torch.matmul: dot, matrix-vector, matrix and broadcast batched products.
Tensor matmul(const Tensor& a, const Tensor& b);
/// torch.nn.functional.linear: x (..., in) @ weight (out, in)^T + bias (out); bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// gelu(linear(x, weight, bias)), the transformer MLP's first half; with approximate=true the
/// tanh GELU (PyTorch's approximate='tanh'), which on CUDA runs inside the GEMM (one node,
/// Note [Fused linear and GELU] in autograd/ops/matmul.cpp). The exact GELU is always the
/// two ops. Same results as the ops written out, within a rounding of the stored type.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), bool approximate = false);

}  // namespace frugal
