#pragma once
// Differentiable cumulative sum, as torch.cumsum (the raw op: tensor/ops/cumsum.h).
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// Running sums of x along `dim` (negative counts from the end; a 0-d x takes 0 or -1).
/// Floating inputs keep their dtype; integer and bool inputs give int64 (Note [Cumulative
/// sum dtypes]). The gradient is the reversed cumulative sum of g along dim. Under autocast
/// float16/bfloat16 inputs run in float32, as torch.autocast's float32 list.
Tensor cumsum(const Tensor& x, int64_t dim);

}  // namespace frugal
