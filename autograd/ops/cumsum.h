#pragma once
// Differentiable cumulative sum, as torch.cumsum (the raw op: tensor/ops/cumsum.h).
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

}  // namespace frugal
