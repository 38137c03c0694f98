#pragma once
// Differentiable scans: cumulative sums and products, running extremes and log-sum-exps, as
// torch.cumsum, cumprod, cummax, cummin and logcumsumexp (the raw ops: tensor/ops/cumsum.h;
// cumprod's backward is in autograd/ops/products.cpp).
#include <cstdint>
#include <optional>

#include "autograd/ops/reduce.h"  // ValuesIndices
#include "tensor/tensor.h"

namespace frugal {

/// Running sums of x along `dim` (negative counts from the end; a 0-d x takes 0 or -1).
/// Floating inputs keep their dtype; integer and bool inputs give int64 (Note [Cumulative
/// sum dtypes]); `dtype` converts x first, as torch.cumsum(dtype=) (float16 summed into
/// float32, say). The gradient is the reversed cumulative sum of g along dim, in x's dtype.
/// Under autocast float16/bfloat16 inputs run in float32, as torch.autocast's float32 list.
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

/// Running products of x along `dim`, as torch.cumprod; dtypes, `dtype` and autocast as
/// cumsum. The gradient is exact where x has zeros, at every order (Note [Product
/// gradients] in autograd/ops/products.cpp).
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

/// torch.cummax(x, dim): the running maximum along `dim` and the index of the last element equal
/// to it so far (NaN propagates). The values' gradient goes to those indices (the values are
/// gather(x, dim, indices)), to any order.
ValuesIndices cummax(const Tensor& x, int64_t dim);
/// torch.cummin, as cummax.
ValuesIndices cummin(const Tensor& x, int64_t dim);

/// torch.logcumsumexp(x, dim): log(exp(x_0) + ... + exp(x_j)) along `dim`, floating x. The
/// gradient is PyTorch's, exp(x_k - out_j) summed over j >= k weighed by g_j and taken in log
/// space by the sign of g, itself differentiable. Under autocast 16-bit inputs run in float32.
Tensor logcumsumexp(const Tensor& x, int64_t dim);

}  // namespace frugal
