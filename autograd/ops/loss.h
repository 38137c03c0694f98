#pragma once
// Differentiable losses (torch.nn.functional's cross_entropy and mse_loss). Same semantics
// as the raw ops in tensor/ops/loss.h.
#include "tensor/ops/loss.h"  // Reduction, CrossEntropyOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.cross_entropy with class-index targets (int64/int32): logits (N, C),
/// (C) or (N, C, d1, ...); see Note [Fused cross entropy]. Differentiable in the logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

/// torch.nn.functional.mse_loss: mean (or sum, or none) of (input - target)^2; input and
/// target broadcast; differentiable in both.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace frugal
