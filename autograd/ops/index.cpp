// Indexing, forward and backward side by side.
#include "autograd/ops/index.h"

#include "autograd/function.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/index.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = index_select(x, dim, index)
// grad_x = zeros with g's slices added at index along dim (duplicates accumulate)
struct IndexSelectBackward final : Node {
  SavedTensor index{this};
  Shape in_sizes;
  DType dtype = kFloat32;
  int64_t dim = 0;
  std::string name() const override { return "IndexSelectBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {ops::index_add(zeros(in_sizes, g.options()), dim, index.unpack(name()), g)};
  }
  bool has_graph_backward() const override { return true; }  // linear in g: index_add's own backward
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {frugal::index_add(zeros(in_sizes, g.options()), dim, index.unpack(name()), g)};
  }
};

// out = gather(x, dim, index)
// grad_x = zeros with g scatter-added at index along dim
struct GatherBackward final : Node {
  SavedTensor index{this};
  Shape in_sizes;
  DType dtype = kFloat32;
  int64_t dim = 0;
  std::string name() const override { return "GatherBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    Tensor grad = zeros(in_sizes, g.options());
    ops::scatter_add_(grad, dim, index.unpack(name()), g);
    return {grad};
  }
  bool has_graph_backward() const override { return true; }  // linear in g: scatter_add's own backward
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {frugal::scatter_add(zeros(in_sizes, g.options()), dim, index.unpack(name()), g)};
  }
};

// out = scatter_add(self, dim, index, src)
// grad_self = g, grad_src = gather(g, dim, index), zeros where index is shorter than src
struct ScatterAddBackward final : Node {
  SavedTensor index{this};
  Shape src_sizes;
  DType self_dtype = kFloat32, src_dtype = kFloat32;
  int64_t dim = 0;
  std::string name() const override { return "ScatterAddBackward"; }
  // In differentiable ops, which record nothing in a first-order backward (grad mode off) and
  // make the double backward under create_graph (Note [Double backward]).
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = in_dtype(g, self_dtype);
    if (wants_grad(*this, 1)) {
      // A 0-d index or src counts as 1-d, as in the forward (a 0-d index uses src[0] only).
      const Tensor idx = index.unpack(name());
      const Shape idx_sizes = idx.dim() == 0 ? Shape{1} : idx.sizes();
      const Shape src_sizes_1d = src_sizes.empty() ? Shape{1} : src_sizes;
      Tensor picked = in_dtype(frugal::gather(g, dim, idx), src_dtype).reshape(idx_sizes);
      // src elements beyond index's extent were not used: zeros after it, last dim first (pad's order)
      std::vector<int64_t> pads;
      for (size_t d = idx_sizes.size(); d-- > 0;) pads.insert(pads.end(), {0, src_sizes_1d[d] - idx_sizes[d]});
      if (idx_sizes != src_sizes_1d) picked = frugal::pad(picked, pads, "constant", 0.0);
      out[1] = picked.reshape(src_sizes);
    }
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};

// out = index_add(self, dim, index, src)
// grad_self = g, grad_src = index_select(g, dim, index)
struct IndexAddBackward final : Node {
  SavedTensor index{this};
  Shape src_sizes;
  DType self_dtype = kFloat32, src_dtype = kFloat32;
  int64_t dim = 0;
  std::string name() const override { return "IndexAddBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = in_dtype(g, self_dtype);
    if (wants_grad(*this, 1))
      out[1] = in_dtype(ops::index_select(g, dim, index.unpack(name())), src_dtype).reshape(src_sizes);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = in_dtype(g, self_dtype);
    if (wants_grad(*this, 1))
      out[1] = in_dtype(frugal::index_select(g, dim, index.unpack(name())), src_dtype).reshape(src_sizes);
    return out;
  }
};

// out = weight[indices]
// grad_weight = rows of g summed into the rows `indices` name (ops::embedding_backward),
// the padding row left zero
struct EmbeddingBackward final : Node {
  SavedTensor indices{this};
  int64_t num_weights = 0, padding_idx = -1;
  DType dtype = kFloat32;
  std::string name() const override { return "EmbeddingBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::embedding_backward(in_dtype(grads[0], dtype), indices.unpack(name()), num_weights, padding_idx)};
  }
  bool has_graph_backward() const override { return true; }  // g's rows added at the indices: linear in g
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    const int64_t width = g.size(-1);
    const Tensor idx = indices.unpack(name()).reshape({-1});
    Tensor rows = g.reshape({idx.numel(), width});
    if (padding_idx >= 0)
      rows = frugal::masked_fill(rows, autograd::raw([&] { return ops::eq(idx, double(padding_idx)).unsqueeze(1); }), 0.0);
    return {frugal::index_add(zeros({num_weights, width}, g.options()), 0, idx, rows)};
  }
};

/// Records N (ScatterAddBackward or IndexAddBackward) for out = self with src added
/// along dim at index.
template <typename N>
void record_add_at_index(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (auto node = make_node<N>({self, src})) {
    node->index = index;
    node->src_sizes = src.sizes();
    node->self_dtype = self.dtype();
    node->src_dtype = src.dtype();
    node->dim = dim;
    autograd::record(node, {out});
  }
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  core::OpScope scope("index_select");
  Tensor out = autograd::raw([&] { return ops::index_select(x, dim, index); });
  if (auto node = make_node<IndexSelectBackward>({x})) {
    node->index = index;
    node->in_sizes = x.sizes();
    node->dtype = x.dtype();
    node->dim = dim;
    autograd::record(node, {out});
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  core::OpScope scope("gather");
  Tensor out = autograd::raw([&] { return ops::gather(x, dim, index); });
  if (auto node = make_node<GatherBackward>({x})) {
    node->index = index;
    node->in_sizes = x.sizes();
    node->dtype = x.dtype();
    node->dim = dim;
    autograd::record(node, {out});
  }
  return out;
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  core::OpScope scope("scatter_add");
  Tensor out = autograd::raw([&] { return ops::scatter_add(self, dim, index, src); });
  record_add_at_index<ScatterAddBackward>(out, self, dim, index, src);
  return out;
}

Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  core::OpScope scope("index_add");
  Tensor out = autograd::raw([&] { return ops::index_add(self, dim, index, src); });
  record_add_at_index<IndexAddBackward>(out, self, dim, index, src);
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding) {
  core::OpScope scope("embedding");
  Tensor out = autograd::raw([&] { return ops::embedding(weight, indices); });  // checks weight and indices
  const int64_t num_weights = weight.size(0);
  int64_t padding_idx = -1;  // the raw op's "none"
  if (padding) {
    FRUGAL_CHECK(*padding >= -num_weights && *padding < num_weights, "embedding: padding_idx ", *padding,
                 " must be within [", -num_weights, ", ", num_weights, ") for weight ", weight.describe());
    padding_idx = *padding < 0 ? *padding + num_weights : *padding;  // torch: -1 is the last row
  }
  if (auto node = make_node<EmbeddingBackward>({weight})) {
    node->indices = indices;
    node->num_weights = num_weights;
    node->padding_idx = padding_idx;
    node->dtype = weight.dtype();
    autograd::record(node, {out});
  }
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  core::OpScope scope("one_hot");
  return autograd::raw([&] { return ops::one_hot(index, num_classes); });
}

}  // namespace frugal
