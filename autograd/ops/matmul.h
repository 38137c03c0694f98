#pragma once
// Differentiable matrix products. Same semantics as the raw ops in tensor/ops/matmul.h.
#include "tensor/tensor.h"

namespace frugal {

/// torch.matmul: dot, matrix-vector, matrix and broadcast batched products.
Tensor matmul(const Tensor& a, const Tensor& b);
/// torch.nn.functional.linear: x (..., in) @ weight (out, in)^T + bias (out); bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// A transformer's MLP block with PyTorch's gelu(approximate='tanh'):
/// linear(gelu_tanh(linear(x, w1, b1)), w2, b2), as one op. On CUDA the GELU runs inside the
/// first GEMM and its derivative inside the backward's (Note [GELU epilogues] in
/// tensor/cuda/matmul.cu); either bias may be undefined. Autocast runs it in the low dtype.
Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

}  // namespace frugal
