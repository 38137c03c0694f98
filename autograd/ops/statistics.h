#pragma once
// Order statistics (kthvalue, median, nanmedian, quantile, nanquantile), the NaN-skipping
// reductions (nansum, nanmean) and the logical ones (any, all, count_nonzero), as PyTorch's.
// Compositions of sort, gather, lerp and the reductions: their gradients are those ops'
// (the selected elements get the gradient, a quantile's two neighbours share it by their
// interpolation weights), on every backend the ops run on.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "autograd/ops/reduce.h"  // ValuesIndices
#include "tensor/tensor.h"

namespace frugal {

/// torch.kthvalue(x, k, dim, keepdim): the k-th smallest value along `dim` (k from 1) and its
/// index. NaN counts as larger than every number (Note [Sort order]); among equal values the
/// first is taken (PyTorch leaves that index unspecified).
ValuesIndices kthvalue(const Tensor& x, int64_t k, int64_t dim = -1, bool keepdim = false);

/// torch.median(x, dim, keepdim): the lower median along `dim` (the ((n - 1) / 2)-th smallest
/// of n) and its index; a slice holding a NaN gives NaN and the index of its first NaN.
ValuesIndices median(const Tensor& x, int64_t dim, bool keepdim = false);
/// torch.median(x): the lower median of every element, 0-d (NaN for an empty x). As in PyTorch
/// the gradient is shared evenly by the elements equal to it.
Tensor median(const Tensor& x);
/// torch.nanmedian(x, dim, keepdim): median of the values that are not NaN (NaN, at the first
/// NaN's index, when all are).
ValuesIndices nanmedian(const Tensor& x, int64_t dim, bool keepdim = false);
/// torch.nanmedian(x): 0-d, the gradient shared as median(x)'s.
Tensor nanmedian(const Tensor& x);

/// torch.quantile(x, q, dim, keepdim, interpolation): the q-quantiles of x along `dim` (every
/// element when no dim), for q a 0-d or 1-d tensor of x's dtype with values in [0, 1] (a 1-d q
/// puts its quantiles first in the result). interpolation between the two nearest sorted
/// values: "linear", "lower", "higher", "midpoint" or "nearest" (ties to even, as torch.round).
/// A slice holding a NaN gives NaN. Floating x, non-empty.
Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                std::string_view interpolation = "linear");
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                std::string_view interpolation = "linear");
/// torch.nanquantile: quantile of the values that are not NaN (NaN where all are).
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                   std::string_view interpolation = "linear");
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                   std::string_view interpolation = "linear");

/// torch.nansum: sum over `dims` (empty: every dim) with NaN counted as 0; dtypes as sum's.
Tensor nansum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// torch.nanmean: the mean of the values that are not NaN (NaN where none is); floating x.
Tensor nanmean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// Not differentiable (bool and int64 results).

/// torch.any over `dims` (empty: every dim): whether some element is nonzero (NaN is); false
/// over an empty slice. bool result.
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// torch.all: whether every element is nonzero; true over an empty slice.
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// torch.count_nonzero over `dims` (empty: every dim): int64.
Tensor count_nonzero(const Tensor& x, const std::vector<int64_t>& dims = {});

}  // namespace frugal
