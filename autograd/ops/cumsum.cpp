// Cumulative sum, forward and backward side by side.
#include "autograd/ops/cumsum.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/index.h"

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

/// t with its slices along dim in reverse order (a gather: views cannot step backwards).
Tensor reversed(const Tensor& t, int64_t dim) {
  const int64_t n = t.size(dim);
  return ops::index_select(t, dim, arange(double(n - 1), -1.0, -1.0, {kInt64, t.device()}));
}

// out[j] = sum of x[k] for k <= j along dim
// grad_x[k] = sum of g[j] for j >= k: the cumulative sum of g run backwards
struct CumsumBackward final : Node {
  DType dtype = kFloat32;
  int64_t dim = 0;  // wrapped; -1 for a 0-d input (its own sum)
  std::string name() const override { return "CumsumBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    if (dim < 0) return {g};
    return {reversed(ops::cumsum(reversed(g, dim), dim), dim)};
  }
};

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  core::OpScope scope("cumsum");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return cumsum((*c)[0], dim);
  Tensor out = autograd::raw([&] { return ops::cumsum(x, dim); });
  if (auto node = make_node<CumsumBackward>({x})) {
    node->dtype = x.dtype();
    node->dim = x.dim() == 0 ? -1 : wrap_dim(dim, x.dim(), "cumsum");
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
