#pragma once
// Differentiable resizing (torch.nn.functional.interpolate's 'nearest', 'bilinear',
// 'bicubic', 'nearest-exact' and 'area' on (N, C, H, W) input; 'nearest', 'linear',
// 'nearest-exact' and 'area' on (N, C, L) input). Channels-last (NHWC) inputs give channels-last outputs (Note
// [Channels-last layout] in tensor/memory_format.h). Same semantics as the raw op in
// tensor/ops/interpolate.h (Note [Interpolation source indices]).
#include "tensor/ops/interpolate.h"  // InterpolateOptions, InterpolateMode
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.interpolate(x, size=..., scale_factor=..., mode=..., align_corners=...):
/// exactly one of options.size and options.scale_factor. Saves nothing but the input's shape.
Tensor interpolate(const Tensor& x, const InterpolateOptions& options);

}  // namespace frugal
