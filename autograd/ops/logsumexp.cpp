// logsumexp as a composite of differentiable ops: no node of its own.
//
// Note [Stable logsumexp]
// logsumexp(x) = log(sum(exp(x - m))) + m with m = amax(x) over the reduced dims, so the
// largest term is exp(0) = 1: nothing overflows and the sum is >= 1. m is a constant of the
// graph (detached): the gradient of the formula does not depend on it, and amax's gradient,
// which splits ties, would only add terms that cancel. m is the largest value below +inf,
// 0 where there is none, so that x - m is never inf - inf: a slice of only -inf gives
// exp(-inf) = 0, a sum of 0 and log(0) = -inf, and a slice holding +inf gives +inf, as
// PyTorch does, with PyTorch's gradient exp(x - out): 0 for its finite entries (an m of 0
// there made exp(100) overflow and their gradients 0 * inf = NaN). Where the sum is 0
// (a slice of only -inf, or an empty one) the log is taken of 1 and the result filled with
// -inf afterwards: the log's gradient g / 0 = inf would otherwise meet exp's 0 and give NaN
// to every element of the slice (PyTorch's formula, g * exp(x - out), gives NaN there too;
// frugal gives 0, the gradient of a function that stays -inf under small changes).
#include "autograd/ops/logsumexp.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/dims.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autocast::Policy;

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  constexpr const char* op = "logsumexp";
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  if (!is_floating(x.dtype())) return logsumexp(x.to(kFloat32), dims, keepdim);  // as PyTorch's integer inputs
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return logsumexp((*c)[0], dims, keepdim);
  // The reduced dims, checked here so that errors name logsumexp.
  const std::vector<bool> reduced = ops::dims_mask(op, x, dims, /*empty_means_all=*/true);
  const Shape kept = ops::reduced_shape(x, reduced, /*keepdim=*/true);
  const int64_t count = ops::reduced_count(x, reduced);  // elements per slice
  // m: the slices' maxima, detached, 0 where infinite or where a slice is empty.
  const Tensor m = autograd::raw([&] {
    if (count == 0) return zeros(kept, x.options());
    const Tensor xd = x.detach();
    const Tensor a = ops::amax(ops::masked_fill(xd, ops::eq(xd, INFINITY), -INFINITY), dims, /*keepdim=*/true);
    return ops::masked_fill(a, ops::eq(a, -INFINITY), 0.0);
  });
  const Tensor s = sum(exp(sub(x, m)), dims, keepdim);
  // m in the result's shape: no grad, so the result's last node is the add, not a view (an
  // in-place op on it is fine, as on any fresh tensor).
  const Tensor m_out =
      keepdim ? m : autograd::raw([&] { return m.reshape(ops::reduced_shape(x, reduced, /*keepdim=*/false)); });
  const Tensor none = autograd::raw([&] { return ops::eq(s.detach(), 0.0); });  // log(0): see the Note
  return add(masked_fill(log(masked_fill(s, none, 1.0)), none, -INFINITY), m_out);
}

}  // namespace frugal
