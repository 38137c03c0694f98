#pragma once
// Differentiable sort and topk (torch.sort, torch.topk) and argsort (indices: not
// differentiable). Order: Note [Sort order] in tensor/ops/sort.h. The values' gradient goes
// back to the positions they came from (the values are gather(x, dim, indices)), to any order.
#include "autograd/ops/reduce.h"  // ValuesIndices
#include "tensor/tensor.h"

namespace frugal {

/// torch.sort(x, dim, descending, stable=True).
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);

/// torch.argsort(x, dim, descending, stable=True).
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);

/// torch.topk(x, k, dim, largest, sorted=True).
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

}  // namespace frugal
