#pragma once
// Differentiable layer norm (torch.nn.functional.layer_norm). Same semantics as the raw op
// in tensor/ops/norm.h (Note [Layer norm statistics]).
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.layer_norm over the trailing `normalized_shape` dims; weight and bias
/// (of normalized_shape) may be undefined. Saves x, weight and the per-row mean and rstd.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace frugal
