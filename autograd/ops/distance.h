#pragma once
// Normalizing and comparing vectors along a dim: torch.nn.functional's normalize,
// cosine_similarity and pairwise_distance (contrastive and metric-learning losses, CLIP's
// logits), composed of differentiable ops, so every gradient is theirs (Note [Distances as
// compositions] in autograd/ops/distance.cpp).
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal {

/// F.normalize: x / max(||x||_p, eps) along `dim` (a vector of norm below eps is divided by
/// eps, so zeros stay zeros). Floating x of at least one dim.
Tensor normalize(const Tensor& x, double p = 2.0, int64_t dim = 1, double eps = 1e-12);

/// F.cosine_similarity: sum over `dim` of (x1 / max(||x1||, eps)) (x2 / max(||x2||, eps)), after
/// broadcasting x1 and x2 to one shape (`dim` is a dim of that shape); the result drops `dim`.
/// Float32 under autocast, as PyTorch's.
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim = 1, double eps = 1e-8);

/// F.pairwise_distance: ||x1 - x2 + eps||_p over the last dim of the broadcast shape (keepdim
/// keeps it as size 1). eps >= 0 keeps the gradient of identical rows finite. Float32 under
/// autocast (the difference of 16-bit inputs would cancel).
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2.0, double eps = 1e-6, bool keepdim = false);

}  // namespace frugal
