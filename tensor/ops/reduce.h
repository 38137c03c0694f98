#pragma once
// Reductions: sum, prod, mean, amax, amin, var over any set of dims; max/min/argmax/argmin
// over one dim. See Note [Reduction geometry] in tensor/reduction.h for how any
// input is brought to the (outer, R, inner) form the kernels walk.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::ops {

/// Sum over `dims` (empty: every dim). Floating inputs give their own dtype (f16/bf16
/// accumulate in float or wider); int32, int64 and bool give int64, as in PyTorch.
/// An empty reduction gives 0. Negative dims count from the end; repeated or
/// out-of-range dims throw.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

/// Product over `dims` (empty: every dim), as torch.prod (which takes one dim or all).
/// Dtypes as sum: floating inputs keep theirs, integers and bool give int64 (wrapping
/// around past its range, as PyTorch's). An empty product is 1.
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

/// Mean over `dims` (empty: every dim). Floating dtypes only (integer inputs throw, as
/// in PyTorch); an empty reduction gives NaN.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

/// Largest value over `dims` (empty: every dim); NaN wins. Throws when a reduced dim
/// has size 0.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

/// Smallest value over `dims` (empty: every dim); NaN wins. Throws when a reduced dim
/// has size 0.
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

/// Variance over `dims` (empty: every dim) with Bessel's `correction`:
/// sum((x - mean)^2) / max(0, N - correction). Floating dtypes only; N - correction <= 0
/// gives NaN or inf, as in PyTorch.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

/// The result of max/min over one dim: values (input dtype) and their int64 indices.
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};

/// Largest value along `dim` and the index of its first occurrence (a NaN counts as the
/// largest value). Throws when `dim` has size 0.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Smallest value along `dim` and the index of its first occurrence (NaN wins).
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
/// max(x, dim, keepdim).indices
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// min(x, dim, keepdim).indices
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

/// What a reduction kernel computes; amax/amin are Max/Min.
enum class ReduceOp : uint8_t { Sum, Prod, Mean, Max, Min, Var };

}  // namespace frugal::ops

// Backend kernels, given the 3-d strided view of Note [Reduction geometry] (R > 0) and
// fresh contiguous outputs of outer * inner elements.
namespace frugal::ops::cpu {
/// in: (outer, R, inner) any strides; out: (outer, inner). correction is used by Var only.
void reduce_kernel(ReduceOp op, const Tensor& out, const Tensor& in, int64_t correction);
/// in: (outer, R, inner); values: (outer, inner) in in's dtype, or undefined; indices: (outer, inner) int64.
void arg_reduce_kernel(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
/// in: (outer, R, inner) any strides; out: (outer, inner). correction is used by Var only.
void reduce_kernel(ReduceOp op, const Tensor& out, const Tensor& in, int64_t correction);
/// in: (outer, R, inner); values: (outer, inner) or undefined; indices: (outer, inner) int64.
void arg_reduce_kernel(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in);
}  // namespace frugal::ops::cuda
