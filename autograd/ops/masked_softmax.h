#pragma once
// Differentiable masked softmax, attention's softmax with the mask and the scale fused in.
// Same semantics as the raw op in tensor/ops/masked_softmax.h.
#include "tensor/tensor.h"

namespace frugal {

/// softmax(scale * scores + mask) along the last dim (Note [Masked softmax]); mask: undefined,
/// bool (true = attend) or of scores' dtype (added, differentiable); is_causal keeps keys s <= l.
Tensor masked_softmax(const Tensor& scores, const Tensor& mask = Tensor(), bool is_causal = false, double scale = 1.0);

}  // namespace frugal
