// vector_norm (declared in autograd/ops/reduce.h), forward and backward side by side.
//
// Note [Vector norm gradients]
// PyTorch's linalg_vector_norm_backward, with n the norm and g its gradient, both with the
// reduced dims kept:
//   ord = 2:        x * (g / n), 0 where n == 0
//   ord >= 1:       s * (g / n^(ord - 1)), 0 where n == 0
//   ord < 1:        s * g * n^(1 - ord)   (n^(1 - ord) is 0 where n == 0)
//   ord = 0:        0 (a count has no gradient)
//   ord = +-inf:    amax/amin of |x|: g shared evenly by the entries equal to n
// with s = x |x|^(ord - 2), 0 where x == 0: sgn(x) |x|^(ord - 1), written so that no sign
// op is needed. So a norm of zeros has gradient 0 rather than the NaN the composite
// pow(sum(pow(|x|, ord)), 1 / ord) would give.
#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/dims.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

// out = (sum |x|^ord)^(1 / ord) for a finite ord != 0, in the compute dtype then x's
// grad_x: Note [Vector norm gradients]
struct VectorNormBackward final : Node {
  SavedTensor x{this}, norm{this};  // norm: in the compute dtype, the reduced dims kept
  double ord = 2.0;
  std::vector<int64_t> dims;  // as given (empty: every dim)
  DType dtype = kFloat32;     // x's
  std::string name() const override { return "VectorNormBackward"; }
  // The same formula in differentiable ops, n recomputed from x (Note [Double backward]): n is a
  // vector_norm again, so any order can be taken.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor xv = autograd::graph::saved_input(*this, 0, x);
    const DType compute = norm.unpack(name()).dtype();
    const Tensor xc = in_dtype(xv, compute);
    const Tensor n = frugal::vector_norm(xc, ord, dims, /*keepdim=*/true);
    const Tensor g = in_dtype(grads[0], compute).reshape(n.sizes());
    const Tensor norm_is_zero = autograd::raw([&] { return ops::eq(n.detach(), 0.0); });
    Tensor grad;
    if (ord == 2.0) {
      grad = frugal::mul(xc, frugal::masked_fill(frugal::div(g, n), norm_is_zero, 0.0));
    } else {
      const Tensor x_is_zero = autograd::raw([&] { return ops::eq(xc.detach(), 0.0); });
      const Tensor s = frugal::masked_fill(frugal::mul(xc, frugal::pow(frugal::abs(xc), ord - 2.0)), x_is_zero, 0.0);
      grad = ord >= 1.0
                 ? frugal::mul(s, frugal::masked_fill(frugal::div(g, frugal::pow(n, ord - 1.0)), norm_is_zero, 0.0))
                 : frugal::mul(s, frugal::mul(g, frugal::pow(n, 1.0 - ord)));
    }
    return {in_dtype(grad, dtype)};
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor xv = x.unpack(name()), n = norm.unpack(name());
    const Tensor xc = xv.to(n.dtype()), g = grads[0].to(n.dtype()).reshape(n.sizes());
    const Tensor norm_is_zero = ops::eq(n, 0.0);
    Tensor grad;
    if (ord == 2.0) {
      grad = ops::mul(xc, ops::masked_fill(ops::div(g, n), norm_is_zero, 0.0));
    } else {
      const Tensor s = ops::masked_fill(ops::mul(xc, ops::pow(ops::abs(xc), ord - 2.0)), ops::eq(xc, 0.0), 0.0);
      grad = ord >= 1.0 ? ops::mul(s, ops::masked_fill(ops::div(g, ops::pow(n, ord - 1.0)), norm_is_zero, 0.0))
                        : ops::mul(s, ops::mul(g, ops::pow(n, 1.0 - ord)));
    }
    return {in_dtype(grad, dtype)};
  }
};

}  // namespace

Tensor vector_norm(const Tensor& x, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  constexpr const char* op = "vector_norm";
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined() && is_floating(x.dtype()), op, ": expects a floating tensor, got ",
               x.defined() ? x.describe() : "undefined");
  FRUGAL_CHECK(!std::isnan(ord), op, ": ord is NaN");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return vector_norm((*c)[0], ord, dims, keepdim);
  const std::vector<bool> reduced = ops::dims_mask(op, x, dims, /*empty_means_all=*/true);
  FRUGAL_CHECK(ops::reduced_count(x, reduced) > 0 || (ord >= 0 && !std::isinf(ord)), op, ": cannot take the ", ord,
               " norm over an empty slice of ", x.describe(), " (the reduction has no identity)");
  if (std::isinf(ord)) return ord > 0 ? amax(abs(x), dims, keepdim) : amin(abs(x), dims, keepdim);
  if (ord == 1.0) return sum(abs(x), dims, keepdim);
  const DType compute = opmath_dtype(x.dtype());
  if (ord == 0.0) {  // a count: no gradient, as PyTorch's
    return autograd::raw([&] { return ops::sum(ops::ne(x, 0.0).to(compute), dims, keepdim).to(x.dtype()); });
  }
  // The norm with the reduced dims kept, in the compute dtype: backward's n.
  const Tensor norm_kept = autograd::raw([&] {
    const Tensor a = ops::abs(x.to(compute));
    return ord == 2.0 ? ops::sqrt(ops::sum(ops::mul(a, a), dims, true))
                      : ops::pow(ops::sum(ops::pow(a, ord), dims, true), 1.0 / ord);
  });
  Tensor out = autograd::raw([&] {  // never sharing norm_kept's storage: backward reads it
    const Tensor r = norm_kept.reshape(ops::reduced_shape(x, reduced, keepdim));
    return r.dtype() == x.dtype() ? r.clone() : r.to(x.dtype());
  });
  if (auto node = make_node<VectorNormBackward>({x})) {
    node->x = x;
    node->norm = norm_kept;
    node->ord = ord;
    node->dims = dims;
    node->dtype = x.dtype();
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
