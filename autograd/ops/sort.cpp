// sort, argsort and topk: the raw op's order, with values re-read through gather when they
// need a gradient (gather's backward scatters it back, and is itself differentiable).
#include "autograd/ops/sort.h"

#include "autograd/function.h"
#include "autograd/ops/index.h"
#include "core/instrument.h"
#include "tensor/ops/sort.h"

namespace frugal {

namespace {

/// r's values as gather(x, dim, indices) when x needs a gradient (a 0-d x as one element).
ValuesIndices with_gradient(const Tensor& x, int64_t dim, ValuesIndices r) {
  if (!autograd::needs_grad({&x})) return r;
  if (x.dim() == 0) {
    r.values = gather(x.reshape({1}), 0, r.indices.reshape({r.indices.numel()})).reshape(r.indices.sizes());
    return r;
  }
  r.values = gather(x, wrap_dim(dim, x.dim(), "sort"), r.indices);
  return r;
}

}  // namespace

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  core::OpScope scope("sort");
  return with_gradient(x, dim, autograd::raw([&] { return ops::sort(x, dim, descending); }));
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  core::OpScope scope("argsort");
  return autograd::raw([&] { return ops::argsort(x, dim, descending); });
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  core::OpScope scope("topk");
  return with_gradient(x, dim, autograd::raw([&] { return ops::topk(x, k, dim, largest); }));
}

}  // namespace frugal
