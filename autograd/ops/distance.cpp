// normalize, cosine_similarity and pairwise_distance.
//
// Note [Distances as compositions]
// Each is PyTorch's formula written with the differentiable ops (vector_norm, clamp, div, mul,
// sum), so the gradients, double backward and autocast come from them, and the forward values
// are PyTorch 1.13's: normalize is F.normalize's x / norm(x).clamp_min(eps); cosine_similarity
// normalizes each operand the same way before the dot product (aten's cosine_similarity since
// 1.12); pairwise_distance is norm(x1 - x2 + eps). One difference: aten clamps
// cosine_similarity's norms in place under no_grad, so its gradient still flows through a norm
// below eps; here the clamp passes no gradient there (d/dx of max(n, eps) = 0 for n < eps), as
// normalize's does in both. Only vectors shorter than eps (1e-8) see it.
#include "autograd/ops/distance.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
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

}  // namespace frugal
