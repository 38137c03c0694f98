// Joining and splitting, forward and backward side by side.
#include "autograd/ops/join.h"

#include <optional>

#include "autograd/function.h"
#include "autograd/ops/view_history.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/join.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

/// cat's (0,)-shaped inputs take no part in the result (Note [cat skips 1-D empty tensors]).
bool legacy_empty(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

// out = cat(x_0, ..., x_n, dim)
// grad_x_i = g.narrow(dim, offset_i, size_i) (a view of g)
struct CatBackward final : Node {
  struct Piece {
    int64_t offset = 0, size = 0;
    DType dtype = kFloat32;
    bool skipped = false;  // a (0,) input
  };
  std::vector<Piece> pieces;
  int64_t dim = 0;
  std::string name() const override { return "CatBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!wants_grad(*this, i)) continue;
      const Piece& p = pieces[i];
      out[i] = p.skipped ? zeros({0}, {p.dtype, g.device()}) : in_dtype(g.narrow(dim, p.offset, p.size), p.dtype);
    }
    return out;
  }
  bool has_graph_backward() const override { return true; }  // narrow and in_dtype record themselves
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};

// out = stack(x_0, ..., x_n, dim)
// grad_x_i = g.select(dim, i)
struct StackBackward final : Node {
  std::vector<DType> dtypes;
  int64_t dim = 0;
  std::string name() const override { return "StackBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList out(dtypes.size());
    for (size_t i = 0; i < dtypes.size(); ++i)
      if (wants_grad(*this, i)) out[i] = in_dtype(grads[0].select(dim, int64_t(i)), dtypes[i]);
    return out;
  }
  bool has_graph_backward() const override { return true; }  // select and in_dtype record themselves
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};

// Note [Split backward without a copy]
// The grads of a split's pieces often are already adjacent views of one buffer: flash
// attention returns dq, dk, dv of chunk(linear(x), 3, -1) as views of one (B, T, 3, H, E)
// buffer (Note [Flash attention layouts]). Then x's grad is that buffer viewed with x's sizes:
// when every grad shares one storage and its strides, has its piece's sizes, and starts
// where the previous one ends along dim (offset_i = offset_0 + (size_0 + ... + size_{i-1})
// * stride(dim)), element j of x's grad along dim is element j - (earlier sizes) of the piece
// holding it, exactly as in cat's result, so as_strided replaces the copy.

/// The grads as one view of their storage with `sizes`, if they are adjacent along dim.
std::optional<Tensor> adjacent_view(const TensorList& grads, const Shape& sizes, int64_t dim) {
  const Tensor& first = grads[0];
  int64_t along = 0;
  for (const Tensor& g : grads) {
    if (!g.defined() || !g.shares_storage(first) || g.dtype() != first.dtype() || g.strides() != first.strides() ||
        g.dim() != int64_t(sizes.size()))
      return std::nullopt;
    for (int64_t d = 0; d < g.dim(); ++d)
      if (d != dim && g.size(d) != sizes[size_t(d)]) return std::nullopt;
    if (g.storage_offset() != first.storage_offset() + along * first.stride(dim)) return std::nullopt;
    along += g.size(dim);
  }
  if (along != sizes[size_t(dim)]) return std::nullopt;
  return first.as_strided(sizes, first.strides(), first.storage_offset());
}

// pieces = split(x, ..., dim), views of x
// grad_x = cat(g_0, ..., g_n, dim) (the engine gives zeros to pieces that got no gradient),
// or a view when the grads are adjacent (Note [Split backward without a copy])
struct SplitBackward final : autograd::ViewNode {
  int64_t dim = 0;
  DType dtype = kFloat32;
  Shape in_sizes;
  const char* label = "SplitBackward";
  std::string name() const override { return label; }
  TensorList apply(TensorList&& grads) override {
    for (Tensor& g : grads) g = in_dtype(g, dtype);
    if (!grads.empty())
      if (std::optional<Tensor> joined = adjacent_view(grads, in_sizes, dim)) return {std::move(*joined)};
    return {ops::cat(grads, dim)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    for (Tensor& g : grads) g = in_dtype(g, dtype);
    return {frugal::cat(grads, dim)};
  }
};

std::vector<Tensor> record_split(const char* label, const Tensor& x, int64_t dim, std::vector<Tensor> pieces) {
  if (auto node = make_node<SplitBackward>({x})) {
    node->dim = wrap_dim(dim, x.dim(), label);
    node->dtype = x.dtype();
    node->in_sizes = x.sizes();
    node->label = label;
    node->set_base(x);  // the pieces are views of x (Note [Views of a tensor written in place])
    autograd::record(node, pieces);
  }
  return pieces;
}

}  // namespace

// cat and stack promote natively under autocast (Note [Autocast]).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  core::OpScope scope("cat");
  Tensor out = autograd::raw([&] { return ops::cat(tensors, dim); });
  if (auto node = make_node<CatBackward>(tensors)) {
    // The raw op has validated everything; the first non-skipped input sets the rank.
    const Tensor* ref = nullptr;
    for (const Tensor& t : tensors)
      if (!ref && !legacy_empty(t)) ref = &t;
    node->dim = ref ? wrap_dim(dim, ref->dim(), "cat") : 0;
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      CatBackward::Piece p;
      p.dtype = t.dtype();
      p.skipped = ref && legacy_empty(t) && ref->dim() != 1;
      if (!p.skipped) {
        p.offset = offset;
        p.size = t.size(node->dim);
        offset += p.size;
      }
      node->pieces.push_back(p);
    }
    autograd::record(node, {out});
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  core::OpScope scope("stack");
  Tensor out = autograd::raw([&] { return ops::stack(tensors, dim); });
  if (auto node = make_node<StackBackward>(tensors)) {
    node->dim = wrap_dim(dim, out.dim(), "stack");
    for (const Tensor& t : tensors) node->dtypes.push_back(t.dtype());
    autograd::record(node, {out});
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  core::OpScope scope("split");
  return record_split("SplitBackward", x, dim, autograd::raw([&] { return ops::split(x, split_size, dim); }));
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  core::OpScope scope("split_with_sizes");
  return record_split("SplitWithSizesBackward", x, dim,
                      autograd::raw([&] { return ops::split_with_sizes(x, sizes, dim); }));
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  core::OpScope scope("chunk");
  return record_split("SplitBackward", x, dim, autograd::raw([&] { return ops::chunk(x, chunks, dim); }));
}

}  // namespace frugal
