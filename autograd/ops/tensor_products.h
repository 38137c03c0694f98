#pragma once
// Products of whole tensors: torch.outer, torch.kron, torch.tensordot and torch.linalg.cross,
// composed of broadcasting multiplies, reshapes and matmul, so their gradients (to any order),
// dtypes, autocast and CUDA paths are those ops'.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// torch.outer(a, b): a[i] * b[j] for 1-d a and b.
Tensor outer(const Tensor& a, const Tensor& b);

/// torch.kron(a, b): the Kronecker product; the operand with fewer dims gets leading 1s, and
/// each dim of the result is a's times b's: out[i * b.size(d) + j] = a[i] * b[j] per dim d.
Tensor kron(const Tensor& a, const Tensor& b);

/// torch.tensordot(a, b, dims_a, dims_b): sums a's dims_a against b's dims_b (pairwise equal
/// sizes) as one matmul; the result has a's other dims, then b's, in order.
Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int64_t>& dims_a,
                 const std::vector<int64_t>& dims_b);
/// torch.tensordot(a, b, dims): a's last `dims` dims against b's first `dims`.
Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims = 2);

/// torch.linalg.cross(a, b, dim): the cross product of 3-vectors along `dim` of a and b
/// broadcast together (that dim has size 3).
Tensor cross(const Tensor& a, const Tensor& b, int64_t dim = -1);

}  // namespace frugal
