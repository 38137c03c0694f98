// Helpers of the nodes' apply_graph (Note [Double backward] in autograd/graph_backward.h).
#include "autograd/graph_backward.h"

#include "autograd/function.h"
#include "autograd/meta.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"

namespace frugal::autograd::graph {

namespace {
/// A new handle on `values` whose gradient flows into `edge` (none: the values as they are).
Tensor with_history(const Tensor& values, const Edge& edge) {
  if (!values.defined() || !edge.valid() || !is_grad_enabled()) return values;
  Tensor joined = values.detach();  // a handle of its own: the saved one stays detached
  set_history(joined, edge.fn, edge.input_nr);
  return joined;
}

/// with_zero_derivative's node: the gradient passes to `result`, zeros to the other input.
struct ZeroDerivativeBackward final : Node {
  OutputMeta other;
  std::string name() const override { return "ZeroDerivativeBackward"; }
  bool saves_tensors() const override { return false; }
  TensorList apply(TensorList&& grads) override {
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = grads[0];
    if (wants_grad(*this, 1)) out[1] = zeros(other.sizes, {other.dtype, other.device});
    return out;
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};

/// linear_map's node: the adjoint of a linear map, itself in differentiable ops.
struct LinearMapBackward final : Node {
  std::function<Tensor(const Tensor&)> adjoint;  // may hold tensors (max pooling's indices) till the node dies
  const char* label = "LinearMapBackward";
  std::string name() const override { return label; }
  bool saves_tensors() const override { return false; }
  TensorList apply(TensorList&& grads) override { return {adjoint(grads[0])}; }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};
}  // namespace

Tensor linear_map(const Tensor& out, const Tensor& g, std::function<Tensor(const Tensor&)> adjoint, const char* name) {
  if (!is_grad_enabled() || !requires_grad(g)) return out;
  auto node = std::make_shared<LinearMapBackward>();
  node->next_edges = {gradient_edge(g)};
  node->adjoint = std::move(adjoint);
  node->label = name;
  Tensor recorded = out.detach();
  record(node, {recorded});
  return recorded;
}

Tensor with_zero_derivative(const Tensor& result, const Node& node, size_t i) {
  if (!is_grad_enabled() || i >= node.next_edges.size() || !node.next_edges[i].valid()) return result;
  auto link = std::make_shared<ZeroDerivativeBackward>();
  link->next_edges = {gradient_edge(result), node.next_edges[i]};
  link->other = {result.sizes(), result.dtype(), result.device()};
  Tensor out = result.detach();
  record(link, {out});
  return out;
}

Tensor saved_input(const Node& node, size_t i, const SavedTensor& saved) {
  const Tensor values = saved.unpack(node.name());
  return i < node.next_edges.size() ? with_history(values, node.next_edges[i]) : values;
}

Tensor saved_output(Node& node, size_t k, const SavedTensor& saved) {
  return with_history(saved.unpack(node.name()), Edge{node.shared_from_this(), uint32_t(k)});
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const std::vector<int64_t> dims = stretched_dims(grad.sizes(), shape);
  const Tensor r = dims.empty() ? grad : frugal::sum(grad, dims, /*keepdim=*/true);
  return r.reshape(shape);
}

Tensor normalized_input_grad(const Tensor& dxhat, const Tensor& xhat, const Tensor& rstd,
                             const std::vector<int64_t>& dims, bool centred) {
  auto mean = [&](const Tensor& t) { return frugal::mean(t, dims, /*keepdim=*/true); };
  const Tensor along_xhat = frugal::mul(xhat, mean(frugal::mul(dxhat, xhat)));
  return frugal::mul(rstd, frugal::sub(centred ? frugal::sub(dxhat, mean(dxhat)) : dxhat, along_xhat));
}

Tensor reduce_grad(const Tensor& grad, const Shape& shape, DType dtype) { return in_dtype(sum_to(grad, shape), dtype); }

}  // namespace frugal::autograd::graph
