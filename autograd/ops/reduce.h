#pragma once
// Differentiable reductions. Same names, arguments and semantics as the raw ops in
// tensor/ops/reduce.h; argmax/argmin are not differentiable and are forwarded to the raw
// ops.
#include <cstdint>
#include <vector>

#include "tensor/ops/reduce.h"
#include "tensor/tensor.h"

namespace frugal {

using ops::ValuesIndices;

/// Sum over `dims` (empty: every dim); the gradient is g broadcast back (a view, no copy).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Product over `dims` (empty: every dim); dtypes as the raw op's. The gradient is each
/// entry's product of the others in its reduced slice, exact at zeros (Note [Product
/// gradients] in autograd/ops/products.cpp). Under autocast float16/bfloat16 run in float32.
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Mean over `dims` (empty: every dim).
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Variance over `dims` with Bessel's `correction`.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
/// Standard deviation over `dims` with Bessel's `correction`: sqrt(var), as torch.std; its
/// gradient is 0 over a slice whose deviation is 0, as PyTorch's. Call it as frugal::std:
/// `std` alone names the C++ namespace.
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
/// torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over `dims` (empty: every dim); ord = inf
/// is max |x|, -inf min |x|, 0 the count of nonzeros. Floating x; float16/bfloat16 sum in
/// float32 and round once. The gradient is PyTorch's, 0 where the norm is 0 (Note [Vector
/// norm gradients] in autograd/ops/vector_norm.cpp). A negative or infinite ord over an
/// empty slice is an error, as in PyTorch.
Tensor vector_norm(const Tensor& x, double ord = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Largest value over `dims`; the gradient is shared evenly by the elements equal to it (as PyTorch).
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Smallest value over `dims`; the gradient is shared evenly by the elements equal to it.
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Largest value along `dim` and its index; values are differentiable and the gradient
/// goes to the returned index only (the first occurrence on ties).
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Smallest value along `dim` and its index (gradient to that index only).
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);

// Not differentiable: forwarded to the raw ops (run below autograd, nothing recorded).

/// Index of the first largest value along `dim` (int64).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Index of the first smallest value along `dim` (int64).
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace frugal
