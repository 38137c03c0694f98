#pragma once
// Differentiable dropout (torch.nn.functional.dropout). Same semantics as the raw op in
// tensor/ops/dropout.h.
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.dropout: zeroes each element with probability p and scales the rest
/// by 1 / (1 - p). Identity (x itself) when !training or p == 0. The backward re-creates
/// the mask from the saved Philox range, so no mask is stored (Note [Dropout mask from counters]).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

}  // namespace frugal
