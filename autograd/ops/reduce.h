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
/// Mean over `dims` (empty: every dim).
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Variance over `dims` with Bessel's `correction`.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
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
