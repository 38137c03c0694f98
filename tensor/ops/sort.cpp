// sort, argsort and topk: validation and layout; the kernels are tensor/cpu/sort.cpp and
// tensor/cuda/sort.cu (Note [Sort order] in tensor/ops/sort.h).
#include "tensor/ops/sort.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

namespace {

/// The first k of x's order along `dim`: x's rows along dim made contiguous (dim moved last),
/// sorted by the kernel, and moved back.
ValuesIndices sorted_along(const char* op, const Tensor& x, int64_t k, int64_t dim, bool descending,
                           bool want_values = true) {
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  FRUGAL_CHECK(is_floating(x.dtype()) || x.dtype() == kInt32 || x.dtype() == kInt64, op,
               ": expects a floating-point or integer tensor, got ", x.describe());
  if (x.dim() == 0) {
    FRUGAL_CHECK(dim == 0 || dim == -1, op, ": dim ", dim, " is out of range for a 0-d tensor");
    FRUGAL_CHECK(k == 0 || k == 1, op, ": k=", k, " is out of range for a 0-d tensor (1 element)");
    ValuesIndices one = sorted_along(op, x.reshape({1}), k, 0, descending, want_values);
    if (k == 0) return one;
    return {want_values ? one.values.reshape({}) : Tensor(), one.indices.reshape({})};
  }
  const int64_t d = wrap_dim(dim, x.dim(), op), L = x.size(d);
  FRUGAL_CHECK(k >= 0 && k <= L, op, ": k=", k, " must be between 0 and the size ", L, " of dim ", d, " of ",
               x.describe());
  const Tensor rows = x.detach().transpose(d, -1).contiguous();  // (..., L) with dim last
  Shape out_shape = rows.sizes();
  out_shape.back() = k;
  // argsort's values are never made: the kernels skip an undefined values tensor.
  ValuesIndices r{want_values ? empty(out_shape, x.options()) : Tensor(), empty(out_shape, {kInt64, x.device()})};
  if (r.indices.numel() > 0) {
    const int64_t n = rows.numel() / L;
    FRUGAL_DEVICE_DISPATCH(op, x.device(), sort_kernel, want_values ? r.values.view({n, k}) : Tensor(),
                           r.indices.view({n, k}), rows.view({n, L}), descending);
  }
  if (d != x.dim() - 1) {
    if (want_values) r.values = r.values.transpose(d, -1).contiguous();
    r.indices = r.indices.transpose(d, -1).contiguous();
  }
  return r;
}

/// The number of elements x sorts along `dim` (a 0-d or undefined x: 1, which sorted_along checks).
int64_t length_along(const char* op, const Tensor& x, int64_t dim) {
  return x.defined() && x.dim() > 0 ? x.size(wrap_dim(dim, x.dim(), op)) : 1;
}

}  // namespace

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  return sorted_along("sort", x, length_along("sort", x, dim), dim, descending);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return sorted_along("argsort", x, length_along("argsort", x, dim), dim, descending, /*want_values=*/false).indices;
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  return sorted_along("topk", x, k, dim, largest);
}

}  // namespace frugal::ops
