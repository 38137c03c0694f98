// Diagonals, forward and backward side by side. diagonal's backward writes g along the
// diagonal of zeros and diag_embed's reads g's diagonal: each is the other's adjoint.
#include "autograd/ops/diagonal.h"

#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/view_history.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/diagonal.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

/// Where a diagonal lies: its offset and the two dims (wrapped) of the tensor it lies in.
struct DiagonalPlace {
  int64_t offset = 0, dim1 = 0, dim2 = 1;
};

DiagonalPlace place_of(int64_t offset, int64_t dim1, int64_t dim2, int64_t ndim) {
  return {offset, dim1 < 0 ? dim1 + ndim : dim1, dim2 < 0 ? dim2 + ndim : dim2};
}

/// g written along the diagonal `p` of zeros of `sizes` (diagonal's backward, run raw).
Tensor embed_along(const Tensor& g, const Shape& sizes, const DiagonalPlace& p) {
  Tensor out = zeros(sizes, g.options());
  ops::copy_into(ops::diagonal(out, p.offset, p.dim1, p.dim2), g);
  return out;
}

// out = diagonal(x, offset, dim1, dim2), a view of x
// grad_x = zeros of x's shape with g along that diagonal
struct DiagonalBackward final : autograd::ViewNode {
  DiagonalPlace place;
  Shape in_sizes;
  DType dtype = kFloat32;
  std::string name() const override { return "DiagonalBackward"; }
  TensorList apply(TensorList&& grads) override { return {embed_along(in_dtype(grads[0], dtype), in_sizes, place)}; }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    const DiagonalPlace p = place;
    const Tensor out = autograd::raw([&] { return embed_along(g.detach(), in_sizes, p); });
    return {autograd::graph::linear_map(
        out, g, [p](const Tensor& G) { return frugal::diagonal(G, p.offset, p.dim1, p.dim2); }, "DiagonalBackward")};
  }
};

// out = diag_embed(x, offset, dim1, dim2)
// grad_x = diagonal(g, offset, dim1, dim2)
struct DiagEmbedBackward final : Node {
  DiagonalPlace place;  // in the output's dims
  DType dtype = kFloat32;
  std::string name() const override { return "DiagEmbedBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::diagonal(in_dtype(grads[0], dtype), place.offset, place.dim1, place.dim2)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    return {frugal::diagonal(in_dtype(grads[0], dtype), place.offset, place.dim1, place.dim2)};
  }
};

}  // namespace

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  core::OpScope scope("diagonal");
  Tensor out = autograd::raw([&] { return ops::diagonal(x, offset, dim1, dim2); });
  if (auto node = make_node<DiagonalBackward>({x})) {
    node->place = place_of(offset, dim1, dim2, x.dim());
    node->in_sizes = x.sizes();
    node->dtype = x.dtype();
    node->set_base(x);  // a view of x (Note [Views of a tensor written in place])
    autograd::record(node, {out});
  }
  return out;
}

Tensor diag_embed(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  core::OpScope scope("diag_embed");
  Tensor out = autograd::raw([&] { return ops::diag_embed(x, offset, dim1, dim2); });
  if (auto node = make_node<DiagEmbedBackward>({x})) {
    node->place = place_of(offset, dim1, dim2, out.dim());
    node->dtype = x.dtype();
    autograd::record(node, {out});
  }
  return out;
}

Tensor diag(const Tensor& x, int64_t offset) {
  FRUGAL_CHECK(x.defined(), "diag: undefined input");
  FRUGAL_CHECK(x.dim() == 1 || x.dim() == 2, "diag: expects a 1-d or 2-d tensor, got ", x.describe());
  return x.dim() == 1 ? diag_embed(x, offset, 0, 1) : diagonal(x, offset, 0, 1).clone();
}

Tensor trace(const Tensor& x) {
  FRUGAL_CHECK(x.defined(), "trace: undefined input");
  FRUGAL_CHECK(x.dim() == 2 && x.dtype() != kUInt8, "trace: expects a matrix (2 dims) of a numeric dtype, got ",
               x.describe());
  return sum(diagonal(x));
}

}  // namespace frugal
