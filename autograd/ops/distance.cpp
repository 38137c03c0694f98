// normalize, cosine_similarity, pairwise_distance and the losses built on them.
//
// Note [Distances as compositions]
// Each is PyTorch's formula written with the differentiable ops (vector_norm, clamp, div, mul,
// sum), so the gradients, double backward and autocast come from them, and the forward values
// are PyTorch 1.13's: normalize is F.normalize's x / norm(x).clamp_min(eps); cosine_similarity
// normalizes each operand the same way before the dot product (aten's cosine_similarity since
// 1.12); pairwise_distance is norm(x1 - x2 + eps). One difference: aten clamps
// cosine_similarity's norms in place under no_grad, so its gradient still flows through a norm
// below eps; here the clamp passes no gradient there (d/dx of max(n, eps) = 0 for n < eps), as
// normalize's does in both. Only vectors shorter than eps (1e-8) see it. triplet_margin_loss
// and cosine_embedding_loss are aten's formulas too (the latter's cosine adds 1e-12 to the
// squared norms instead of clamping the norms).
#include "autograd/ops/distance.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/shape.h"

namespace frugal {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// x defined and floating, else an error naming `op` and `what`.
void check_operand(const char* op, const char* what, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point ", what, ", got ", x.describe());
}

/// x1 and x2 broadcast to one shape (same device checked), as the distances take them.
std::pair<Tensor, Tensor> broadcast_pair(const char* op, const Tensor& x1, const Tensor& x2) {
  check_operand(op, "x1", x1);
  check_operand(op, "x2", x2);
  FRUGAL_CHECK(x1.device() == x2.device(), op, ": x1 ", x1.describe(), " and x2 ", x2.describe(),
               " must be on one device");
  const Shape shape = broadcast_shapes(x1.sizes(), x2.sizes(), op);
  return {x1.sizes() == shape ? x1 : x1.expand(shape), x2.sizes() == shape ? x2 : x2.expand(shape)};
}

void check_eps(const char* op, double eps) {
  FRUGAL_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps must be finite and non-negative, got ", eps);
}

/// x / max(||x||_p along dim, eps), the norm kept as size 1 to broadcast.
Tensor divided_by_norm(const Tensor& x, double p, int64_t dim, double eps) {
  return div(x, clamp(vector_norm(x, p, {dim}, /*keepdim=*/true), eps, kInf));
}

/// The loss reduced as `reduction` says (Mean of nothing: NaN, as PyTorch's).
Tensor reduced(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: break;
  }
  return mean(loss);
}

}  // namespace

Tensor normalize(const Tensor& x, double p, int64_t dim, double eps) {
  core::OpScope scope("normalize");
  check_operand("normalize", "input", x);
  FRUGAL_CHECK(x.dim() >= 1, "normalize: expects a tensor of at least one dim, got ", x.describe());
  check_eps("normalize", eps);
  return divided_by_norm(x, p, wrap_dim(dim, x.dim(), "normalize"), eps);
}

Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim, double eps) {
  core::OpScope scope("cosine_similarity");
  if (auto c = autocast::cast_inputs(autocast::Policy::Float32, {&x1, &x2}))
    return cosine_similarity((*c)[0], (*c)[1], dim, eps);
  const auto [a, b] = broadcast_pair("cosine_similarity", x1, x2);
  FRUGAL_CHECK(a.dim() >= 1, "cosine_similarity: expects tensors of at least one dim, got ", x1.describe(), " and ",
               x2.describe());
  check_eps("cosine_similarity", eps);
  const int64_t d = wrap_dim(dim, a.dim(), "cosine_similarity");
  return sum(mul(divided_by_norm(a, 2.0, d, eps), divided_by_norm(b, 2.0, d, eps)), {d});
}

Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim) {
  core::OpScope scope("pairwise_distance");
  // Float32 before the difference, which cancels (a float16 x1 - x2 would lose the digits).
  if (auto c = autocast::cast_inputs(autocast::Policy::Float32, {&x1, &x2}))
    return pairwise_distance((*c)[0], (*c)[1], p, eps, keepdim);
  const auto [a, b] = broadcast_pair("pairwise_distance", x1, x2);
  check_eps("pairwise_distance", eps);
  // A 0-d pair is one value: its norm is |x1 - x2 + eps| (torch: the same).
  const Tensor diff = add(sub(a, b), eps);
  if (diff.dim() == 0) return vector_norm(diff, p, {}, false);
  return vector_norm(diff, p, {-1}, keepdim);
}

Tensor cdist(const Tensor& x1, const Tensor& x2, double p) {
  core::OpScope scope("cdist");
  if (auto c = autocast::cast_inputs(autocast::Policy::Float32, {&x1, &x2})) return cdist((*c)[0], (*c)[1], p);
  check_operand("cdist", "x1", x1);
  check_operand("cdist", "x2", x2);
  FRUGAL_CHECK(x1.dim() >= 2 && x2.dim() >= 2 && x1.size(-1) == x2.size(-1),
               "cdist: expects x1 (..., P, M) and x2 "
               "(..., R, M) with the same M, got ",
               x1.describe(), " and ", x2.describe());
  FRUGAL_CHECK(x1.dtype() == x2.dtype() && x1.device() == x2.device(),
               "cdist: x1 and x2 must have one dtype and device, got ", x1.describe(), " and ", x2.describe());
  FRUGAL_CHECK(p >= 0, "cdist: p must be >= 0, got ", p);
  if (p == 2.0 && (x1.size(-2) > 25 || x2.size(-2) > 25)) {
    const AutocastGuard full_precision(x1.device(), kFloat16, /*enabled=*/false);  // the matmul too, as PyTorch's
    const Tensor x2t = x2.transpose(-2, -1);
    const Tensor squares = add(sum(mul(x1, x1), {-1}, true), sum(mul(x2t, x2t), {-2}, true));  // (..., P, R)
    const Tensor d2 = clamp(sub(squares, mul(matmul(x1, x2t), 2.0)), 0.0, std::numeric_limits<double>::infinity());
    // sqrt's gradient 1 / (2 sqrt(d2)) is inf at 0: there the distance is a constant 0 instead.
    const Tensor positive = autograd::raw([&] { return ops::gt(d2.detach(), 0.0); });
    const Tensor one = ones({}, d2.options()), zero = zeros({}, d2.options());
    return where(positive, sqrt(where(positive, d2, one)), zero);
  }
  return vector_norm(sub(x1.unsqueeze(-2), x2.unsqueeze(-3)), p, {-1});
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative, double margin,
                           double p, double eps, bool swap, Reduction reduction) {
  core::OpScope scope("triplet_margin_loss");
  if (auto c = autocast::cast_inputs(autocast::Policy::Float32, {&anchor, &positive, &negative}))
    return triplet_margin_loss((*c)[0], (*c)[1], (*c)[2], margin, p, eps, swap, reduction);
  check_operand("triplet_margin_loss", "anchor", anchor);
  check_operand("triplet_margin_loss", "positive", positive);
  check_operand("triplet_margin_loss", "negative", negative);
  FRUGAL_CHECK(anchor.dim() == positive.dim() && anchor.dim() == negative.dim() && anchor.dim() >= 1,
               "triplet_margin_loss: anchor, positive and negative must have the same number of dims (at least one), "
               "got ",
               anchor.describe(), ", ", positive.describe(), " and ", negative.describe());
  FRUGAL_CHECK(std::isfinite(margin), "triplet_margin_loss: margin must be finite, got ", margin);
  const Tensor d_pos = pairwise_distance(anchor, positive, p, eps);
  Tensor d_neg = pairwise_distance(anchor, negative, p, eps);
  if (swap) d_neg = minimum(d_neg, pairwise_distance(positive, negative, p, eps));
  return reduced(clamp(add(sub(d_pos, d_neg), margin), 0.0, kInf), reduction);
}

Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin, Reduction reduction) {
  constexpr const char* op = "cosine_embedding_loss";
  core::OpScope scope(op);
  if (auto c = autocast::cast_inputs(autocast::Policy::Float32, {&x1, &x2}))
    return cosine_embedding_loss((*c)[0], (*c)[1], y, margin, reduction);
  check_operand(op, "x1", x1);
  check_operand(op, "x2", x2);
  FRUGAL_CHECK(y.defined() && (is_floating(y.dtype()) || is_integral(y.dtype())), op,
               ": expects a numeric target y, got ", y.defined() ? y.describe() : "undefined");
  FRUGAL_CHECK(x1.sizes() == x2.sizes() && (x1.dim() == 1 || x1.dim() == 2), op, ": x1 ", x1.describe(), " and x2 ",
               x2.describe(), " must have one shape, (N, D) or (D)");
  FRUGAL_CHECK(y.dim() == x1.dim() - 1 && (y.dim() == 0 || y.size(0) == x1.size(0)), op, ": the target ", y.describe(),
               " must have shape (N) for inputs ", x1.describe(), " (0-d for (D))");
  FRUGAL_CHECK(x1.device() == y.device() && x2.device() == y.device(), op, ": x1 ", x1.describe(), ", x2 ",
               x2.describe(), " and y ", y.describe(), " must be on one device");
  FRUGAL_CHECK(std::isfinite(margin), op, ": margin must be finite, got ", margin);
  constexpr double kEpsilon = 1e-12;  // aten's EPSILON
  const int64_t d = x1.dim() - 1;
  const Tensor dot = sum(mul(x1, x2), {d});
  const Tensor norms = sqrt(mul(add(sum(square(x1), {d}), kEpsilon), add(sum(square(x2), {d}), kEpsilon)));
  const Tensor cos = div(dot, norms);
  const Tensor zero = zeros_like(cos);
  const Tensor similar = autograd::raw([&] { return ops::eq(y, 1.0); });
  const Tensor dissimilar = autograd::raw([&] { return ops::eq(y, -1.0); });
  const Tensor loss =
      add(where(similar, rsub(cos, 1.0), zero), where(dissimilar, clamp(sub(cos, margin), 0.0, kInf), zero));
  return reduced(loss, reduction);
}

}  // namespace frugal
