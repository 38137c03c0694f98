#pragma once
// Differentiable softmax and log_softmax. Same names, arguments and semantics as the raw
// ops in tensor/ops/softmax.h.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// softmax along `dim`; backward y (g - sum(g y)) from the saved output.
Tensor softmax(const Tensor& x, int64_t dim);
/// log_softmax along `dim`; backward g - exp(y) sum(g) from the saved output.
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace frugal
