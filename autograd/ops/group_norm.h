#pragma once
// Differentiable group norm (torch.nn.functional.group_norm), composed from layer norm's
// raw ops (Note [Group norm as layer norm over groups] in autograd/ops/group_norm.cpp).
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.group_norm: x (N, C, *) with C divisible by num_groups; each sample's
/// C / num_groups channels of a group, with all their positions, are normalized by their
/// mean and biased variance, then scaled and shifted per channel by weight and bias (C), either
/// of which may be undefined. Saves x, weight and two floats per (sample, group) for
/// backward, as layer_norm. Under autocast, float16/bfloat16 inputs run in float32.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

}  // namespace frugal
