// Products: prod over dims and cumprod along one dim, forward and backward side by side.
//
// Note [Product gradients]
// d prod(x) / d x_k is the product of every other entry. PyTorch divides prod(x) by x_k
// when it finds no zero (a host sync to look) and takes another path when it does; here it
// is always the product of the entries before k times that of the entries after k, two
// exclusive cumulative products (one run backwards): no division, exact at zeros, no sync.
// A product over several dims moves them last and flattens them into one line first.
//
// cumprod's gradient, grad_k = sum over j >= k of g_j * prod(x_i : i <= j, i != k), is
// reverse_cumsum(g * cumprod(x))_k / x_k wherever no zero comes at or before k. Let z be
// a line's first zero. At z, the products skip x_z: grad_z = reverse_cumsum(g *
// cumprod(x'))_z, x' being x with x_z set to 1. Past z every term holds the factor x_z = 0,
// so grad_k = 0; the first-order backward computes these three parts for every line with
// masks, no sync. Its derivative in x_z is not 0, though: past z, grad_k = x_z * G_k, where
// G is this gradient again at x' (its entries past z skip x_z just so). apply_graph writes
// it that way, recursing once per zero of a line while any remain (a host sync per level,
// O(zeros * n), where PyTorch's double backward with zeros is O(n^2)), so every order of
// derivative is exact, as gradgradcheck at inputs with one, two and three zeros confirms.
#include "autograd/autocast.h"
#include "autograd/formula_node.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/join.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/reduce.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;
namespace graph = autograd::graph;

namespace {

/// Each entry's product of the entries before it along dim (1 for the first).
Tensor exclusive_cumprod(const Tensor& x, int64_t dim) {
  Shape one = x.sizes();
  one[size_t(dim)] = 1;
  return cumprod(cat({ones(one, x.options()), x.narrow(dim, 0, x.size(dim) - 1)}, dim), dim);
}

/// d prod(x) / d x along dim, each entry the product of the others (Note [Product gradients]).
Tensor product_of_others(const Tensor& x, int64_t dim) {
  return mul(exclusive_cumprod(x, dim), flip(exclusive_cumprod(flip(x, {dim}), dim), {dim}));
}

/// product_of_others over the (wrapped) dims `reduced`: they are moved last and flattened.
Tensor product_of_others(const Tensor& x, const std::vector<int64_t>& reduced) {
  std::vector<int64_t> order;
  Shape lines;
  std::vector<bool> is_reduced(size_t(x.dim()), false);
  for (int64_t d : reduced) is_reduced[size_t(d)] = true;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!is_reduced[size_t(d)]) order.push_back(d), lines.push_back(x.size(d));
  order.insert(order.end(), reduced.begin(), reduced.end());
  const Tensor moved = x.permute(order);
  Shape flat = lines;
  flat.push_back(-1);
  const Tensor others = product_of_others(moved.reshape(flat), int64_t(lines.size())).reshape(moved.sizes());
  std::vector<int64_t> inverse(order.size());
  for (size_t k = 0; k < order.size(); ++k) inverse[size_t(order[k])] = int64_t(k);
  return others.permute(inverse);
}

// out = prod(x, dims)
// grad_x = g (broadcast back) * the product of the others in each reduced line
struct ProdBackward final : autograd::FormulaNode {
  std::vector<int64_t> reduced;  // wrapped
  Shape kept;                    // x's shape with 1 at each reduced dim
  DType dtype = kFloat32;        // x's
  std::string name() const override { return "ProdBackward"; }
  Tensor grad_from(const Tensor& g, const Tensor& xv, bool graph_mode) const override {
    if (xv.numel() == 0) {
      const Tensor none = zeros(xv.sizes(), {dtype, xv.device()});
      return graph_mode ? graph::with_zero_derivative(none, *this, 0) : none;
    }
    const DType compute = opmath_dtype(dtype);
    return in_dtype(mul(in_dtype(g, compute).reshape(kept), product_of_others(in_dtype(xv, compute), reduced)), dtype);
  }
};

/// The sums of t's entries from each position to the end of its line along dim; recorded
/// (flip, cumsum, flip) when `graph`.
Tensor reverse_cumsum(const Tensor& t, int64_t dim, bool graph) {
  return graph ? flip(cumsum(flip(t, {dim}), dim), {dim}) : ops::reverse_cumsum(t, dim);
}

/// cumprod's gradient at x from g along dim (Note [Product gradients]); `graph`: in recorded
/// ops, exact at every order.
Tensor cumprod_grad(const Tensor& g, const Tensor& x, int64_t dim, bool graph) {
  const Tensor is_zero = ops::eq(x.detach(), 0.0);
  const Tensor zeros_so_far = ops::cumsum(is_zero, dim);
  const Tensor before = ops::eq(zeros_so_far, 0.0);                            // before the line's first zero
  const Tensor first = ops::logical_and(is_zero, ops::eq(zeros_so_far, 1.0));  // the first zero
  const Tensor one = scalar_tensor(1.0, x.options()), zero = scalar_tensor(0.0, x.options());
  const Tensor until_first = div(reverse_cumsum(mul(g, cumprod(x, dim)), dim, graph), where(before, x, one));
  const Tensor skip_first = where(first, one, x);  // x' of the Note
  if (!graph) {
    const Tensor at_first = reverse_cumsum(mul(g, cumprod(skip_first, dim)), dim, false);
    return where(before, until_first, where(first, at_first, zero));
  }
  if (ops::sum(is_zero).item<int64_t>() == 0) return until_first;
  const Tensor first_zero = sum(where(first, x, zero), {dim}, true);  // 0, yet its derivative counts
  return where(before, until_first, mul(cumprod_grad(g, skip_first, dim, true), where(first, one, first_zero)));
}

// out = cumprod(x, dim)
// grad_x = cumprod_grad(g, x) (Note [Product gradients])
struct CumprodBackward final : autograd::FormulaNode {
  int64_t dim = 0;  // wrapped; -1 for a 0-d x (its own product)
  DType dtype = kFloat32;
  std::string name() const override { return "CumprodBackward"; }
  Tensor grad_from(const Tensor& g, const Tensor& xv, bool graph) const override {
    if (dim < 0 || xv.numel() == 0) return in_dtype(g, dtype);
    const DType compute = opmath_dtype(dtype);
    return in_dtype(cumprod_grad(in_dtype(g, compute), in_dtype(xv, compute), dim, graph), dtype);
  }
};

/// The check both ops make before recording a node: x requires grad, so `out` must be floating.
void check_differentiable(const char* op, const Tensor& x, DType out) {
  FRUGAL_CHECK(is_floating(out), op, ": cannot multiply ", x.describe(), ", which requires grad, into ",
               dtype_name(out), " (only floating tensors can require grad)");
}

}  // namespace

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope("prod");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return prod((*c)[0], dims, keepdim);
  Tensor out = autograd::raw([&] { return ops::prod(x, dims, keepdim); });
  if (auto node = make_node<ProdBackward>({x})) {
    check_differentiable("prod", x, out.dtype());
    node->x = x;
    node->dtype = x.dtype();
    node->kept = x.sizes();
    for (int64_t d = 0; d < x.dim(); ++d) {
      const bool all = dims.empty();
      bool listed = false;
      for (int64_t e : dims) listed = listed || wrap_dim(e, x.dim(), "prod") == d;
      if (all || listed) node->reduced.push_back(d), node->kept[size_t(d)] = 1;
    }
    autograd::record(node, {out});
  }
  return out;
}

Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  core::OpScope scope("cumprod");
  FRUGAL_CHECK(x.defined(), "cumprod: undefined input");
  if (dtype && *dtype != x.dtype()) {  // the conversion records its own backward
    if (autograd::needs_grad({&x})) check_differentiable("cumprod", x, *dtype);
    return cumprod(x.to(*dtype), dim);
  }
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return cumprod((*c)[0], dim);
  Tensor out = autograd::raw([&] { return ops::cumprod(x, dim); });
  if (auto node = make_node<CumprodBackward>({x})) {
    check_differentiable("cumprod", x, out.dtype());
    node->x = x;
    node->dtype = x.dtype();
    node->dim = x.dim() == 0 ? -1 : wrap_dim(dim, x.dim(), "cumprod");
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
