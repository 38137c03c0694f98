#pragma once
// Differentiable 1-D pooling (torch.nn.functional.max_pool1d, avg_pool1d, adaptive_avg_pool1d):
// the 2-D ops on a 1 x L image (tensor/ops/pool1d.h), so the gradients are theirs.
#include "tensor/ops/pool1d.h"  // MaxPool1dOptions, AvgPool1dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.max_pool1d: x (N, C, L) or (C, L).
Tensor max_pool1d(const Tensor& x, int64_t kernel, const MaxPool1dOptions& options = {});

/// torch.nn.functional.avg_pool1d: x (N, C, L) or (C, L).
Tensor avg_pool1d(const Tensor& x, int64_t kernel, const AvgPool1dOptions& options = {});

/// torch.nn.functional.adaptive_avg_pool1d: x (N, C, L) or (C, L).
Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size);

}  // namespace frugal
