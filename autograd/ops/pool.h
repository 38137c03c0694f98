#pragma once
// Differentiable 2-D pooling (torch.nn.functional's max_pool2d, avg_pool2d and
// adaptive_avg_pool2d). Channels-last (NHWC) inputs give channels-last outputs
// (Note [Channels-last layout] in tensor/memory_format.h). Same semantics as the raw ops
// in tensor/ops/pool.h.
#include "tensor/ops/pool.h"  // Int2, MaxPool2dOptions, AvgPool2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.max_pool2d: saves x, not the int64 argmax indices, and recomputes
/// them in backward (Note [Max-pool backward from the input]).
Tensor max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options = {});

/// torch.nn.functional.avg_pool2d: saves nothing but the shape.
Tensor avg_pool2d(const Tensor& x, Int2 kernel, const AvgPool2dOptions& options = {});

/// torch.nn.functional.adaptive_avg_pool2d: saves nothing but the shape.
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);

}  // namespace frugal
