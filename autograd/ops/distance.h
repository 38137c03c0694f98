#pragma once
// Normalizing and comparing vectors along a dim: torch.nn.functional's normalize,
// cosine_similarity and pairwise_distance (contrastive and metric-learning losses, CLIP's
// logits), and the metric-learning losses built on them (triplet_margin_loss,
// cosine_embedding_loss), composed of differentiable ops, so every gradient is theirs (Note
// [Distances as compositions] in autograd/ops/distance.cpp).
#include <cstdint>

#include "tensor/ops/loss.h"  // Reduction
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

/// torch.cdist(x1, x2, p): the p-norm distance between each row of x1 (..., P, M) and each row of
/// x2 (..., R, M), batch dims broadcast, giving (..., P, R); p >= 0 (inf: the largest |difference|).
/// For p = 2 with P or R above 25 (PyTorch's default compute_mode) it is the matmul form
/// sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0)), whose gradient at distance 0 is 0 here (PyTorch's is
/// NaN); otherwise vector_norm of the differences, which holds P R M values. Float32 under
/// autocast, as PyTorch's.
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2.0);

/// F.triplet_margin_loss: max(d(anchor, positive) - d(anchor, negative) + margin, 0), d =
/// pairwise_distance(., ., p, eps) over the last dim; swap (Balntas et al. 2016) takes d(anchor,
/// negative) as min(d(anchor, negative), d(positive, negative)). Reduced as `reduction` says.
/// Both losses are float32 under autocast, as PyTorch's.
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative, double margin = 1.0,
                           double p = 2.0, double eps = 1e-6, bool swap = false, Reduction reduction = Reduction::Mean);

/// F.cosine_embedding_loss: 1 - cos(x1, x2) where y = 1, max(cos(x1, x2) - margin, 0) where
/// y = -1, and 0 for any other y (as aten's), cos over the last dim of (N, D) or (D) inputs
/// with 1e-12 added to each squared norm (aten's form, not cosine_similarity's); y (N) or 0-d,
/// any numeric dtype.
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin = 0.0,
                             Reduction reduction = Reduction::Mean);

}  // namespace frugal
