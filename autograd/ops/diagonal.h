#pragma once
// Differentiable diagonals: torch.diagonal (a view), diag_embed, diag and trace (the raw ops:
// tensor/ops/diagonal.h). diagonal and diag_embed are each other's adjoint, so each one's
// gradient is the other applied to g, to any order.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// torch.diagonal(x, offset, dim1, dim2): a view of x's diagonal entries in the (dim1, dim2)
/// planes, appended as the last dim (Note [Views of a tensor written in place] applies to it
/// as to any view). The gradient is g written along the diagonal of zeros of x's shape.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);

/// torch.diag_embed(x, offset, dim1, dim2): x's last dim along the diagonal of new (dim1, dim2)
/// planes of zeros. The gradient is g's diagonal there.
Tensor diag_embed(const Tensor& x, int64_t offset = 0, int64_t dim1 = -2, int64_t dim2 = -1);

/// torch.diag(x, offset): a 1-d x as the offset diagonal of a square matrix, or a 2-d x's offset
/// diagonal as a new 1-d tensor.
Tensor diag(const Tensor& x, int64_t offset = 0);

/// torch.trace: the sum of a matrix's main diagonal, 0-d (dtypes as sum's: integers give int64).
Tensor trace(const Tensor& x);

}  // namespace frugal
