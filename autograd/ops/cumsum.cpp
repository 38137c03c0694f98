// Cumulative sum, forward and backward side by side.
#include "autograd/ops/cumsum.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

// out[j] = sum of x[k] for k <= j along dim
// grad_x[k] = sum of g[j] for j >= k: the cumulative sum of g run backwards, in x's dtype
struct CumsumBackward final : Node {
  DType dtype = kFloat32;  // x's
  int64_t dim = 0;         // wrapped; -1 for a 0-d input (its own sum)
  std::string name() const override { return "CumsumBackward"; }
  TensorList apply(TensorList&& grads) override {
    if (dim < 0) return {in_dtype(grads[0], dtype)};
    // Summed in the wider of x's dtype and the gradient's: a cumsum into a 16-bit dtype must
    // not round x's gradient prefixes to 16 bits (PyTorch sums in x's dtype).
    const Tensor& g = grads[0];
    return {in_dtype(ops::reverse_cumsum(in_dtype(g, promote_types(g.dtype(), dtype)), dim), dtype)};
  }
  bool has_graph_backward() const override { return true; }  // reverse_cumsum as flip, cumsum, flip
  TensorList apply_graph(TensorList&& grads) override {
    if (dim < 0) return {in_dtype(grads[0], dtype)};
    const Tensor g = in_dtype(grads[0], promote_types(grads[0].dtype(), dtype));
    return {in_dtype(frugal::flip(frugal::cumsum(frugal::flip(g, {dim}), dim), {dim}), dtype)};
  }
};

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  core::OpScope scope("cumsum");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return cumsum((*c)[0], dim, dtype);
  Tensor out = autograd::raw([&] { return ops::cumsum(x, dim, dtype); });
  if (auto node = make_node<CumsumBackward>({x})) {
    FRUGAL_CHECK(is_floating(out.dtype()), "cumsum: cannot sum ", x.describe(), ", which requires grad, into ",
                 dtype_name(out.dtype()), " (only floating tensors can require grad)");
    node->dtype = x.dtype();
    node->dim = x.dim() == 0 ? -1 : wrap_dim(dim, x.dim(), "cumsum");
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
