#pragma once
// Sorting along one dim: sort, argsort and topk (torch.sort, torch.argsort, torch.topk), raw
// ops; the differentiable forms are in autograd/ops/sort.h.
//
// Note [Sort order]
// Values are ordered as PyTorch orders them: NaN above every number (+inf included), -0 equal
// to +0; 16-bit types by their float value. Equal values keep their input order, ascending and
// descending alike (torch.sort(stable=True)'s order; torch.topk leaves ties in whatever order
// its partial sort does, frugal's topk in this one), so the indices are a deterministic function
// of the values, whatever the thread count. topk returns its k values sorted (largest first when
// `largest`), as torch.topk(sorted=True).
// The CPU sorts (key, index) pairs whose integer order is this one (Note [Sort keys] in
// tensor/ops/sort_key.h), so any sorting algorithm gives it: a full sort for sort, a partial sort
// of the first k for topk. CUDA sorts the same pairs (Note [CUDA sort paths] in
// tensor/cuda/sort.cu): a block per row up to 4096 elements, device-wide radix sorts beyond (a
// small topk of a long row: two block passes, Note [CUDA topk of long rows]).
#include <cstdint>

#include "tensor/ops/reduce.h"  // ValuesIndices
#include "tensor/tensor.h"

namespace frugal::ops {

/// torch.sort(x, dim, descending, stable=True): the values along `dim` in order and their int64
/// indices into `dim`. Any numeric dtype; a 0-d tensor is one element.
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);

/// torch.argsort(x, dim, descending, stable=True): sort's indices alone.
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);

/// torch.topk(x, k, dim, largest, sorted=True): the k largest (smallest unless `largest`) values
/// along `dim`, in order, and their indices; 0 <= k <= x.size(dim).
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
/// values, indices: (rows, k); x: (rows, L) contiguous, k <= L: each row's first k in Note
/// [Sort order]'s order (descending or ascending). An undefined `values` (argsort): indices only.
void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending);
}  // namespace frugal::ops::cuda
