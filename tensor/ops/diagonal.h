#pragma once
// Diagonals: torch.diagonal (a view) and torch.diag_embed, raw ops; the differentiable forms,
// with diag and trace, are in autograd/ops/diagonal.h.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// torch.diagonal(x, offset, dim1, dim2): a view of the entries x[..., i, ..., i + offset, ...]
/// (dim1 at i, dim2 at i + offset; offset < 0 starts below the main diagonal), with dim1 and
/// dim2 removed and the diagonal appended as the last dim (size 0 when the offset passes the
/// matrix). Writing to it writes x. x has at least 2 dims; dim1 != dim2.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);

/// torch.diag_embed(x, offset, dim1, dim2): zeros of x's shape with its last dim n replaced by
/// two dims of n + |offset| at dim1 and dim2 (dims of the result), x's last dim written along
/// their diagonal at `offset`. A new tensor.
Tensor diag_embed(const Tensor& x, int64_t offset = 0, int64_t dim1 = -2, int64_t dim2 = -1);

}  // namespace frugal::ops
