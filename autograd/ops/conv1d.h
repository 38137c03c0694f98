#pragma once
// Differentiable 1-D convolutions (torch.nn.functional.conv1d / conv_transpose1d): the 2-D ops
// on the signal as a 1 x L image (Note [1-D convolution as 2-D] in tensor/ops/conv1d.h), so
// their gradients, double backward and autocast are the 2-D ops'.
#include "tensor/ops/conv1d.h"  // Conv1dOptions, ConvTranspose1dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.conv1d: x (N, C, L) or (C, L), weight (K, C / groups, k), bias (K) or undefined.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv1dOptions& options = {});

/// torch.nn.functional.conv_transpose1d: x (N, C_in, L) or (C_in, L), weight (C_in, C_out / groups,
/// k), bias (C_out) or undefined.
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose1dOptions& options = {});

}  // namespace frugal
