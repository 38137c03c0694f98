#pragma once
// Differentiable cumulative sums and products, as torch.cumsum and torch.cumprod (the raw ops:
// tensor/ops/cumsum.h; cumprod's backward is in autograd/ops/products.cpp).
#include <cstdint>
#include <optional>

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

}  // namespace frugal
