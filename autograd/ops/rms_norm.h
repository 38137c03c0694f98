#pragma once
// Differentiable RMS norm (torch.nn.functional.rms_norm). Same semantics as the raw op in
// tensor/ops/rms_norm.h (Note [RMS norm is layer norm around zero]).
#include <optional>

#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.rms_norm over the trailing `normalized_shape` dims: x / sqrt(mean(x^2)
/// + eps) * weight; weight (of normalized_shape) may be undefined. eps defaults to the machine
/// epsilon of x's compute type (float32's for 16-bit inputs), as torch's kernels. Saves x,
/// weight and the per-row rstd (float32 for 16-bit inputs). Under autocast, float16/bfloat16
/// inputs run in float32, as torch.autocast lists rms_norm.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);

}  // namespace frugal
