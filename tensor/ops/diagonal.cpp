#include "tensor/ops/diagonal.h"

#include <algorithm>

#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::ops {

namespace {

/// dim1 and dim2 wrapped for an ndim-dim tensor, checked.
std::pair<int64_t, int64_t> two_dims(const char* op, int64_t dim1, int64_t dim2, int64_t ndim, const Tensor& x) {
  FRUGAL_CHECK(ndim >= 2, op, ": needs at least 2 dims, got ", x.describe());
  FRUGAL_CHECK(dim1 >= -ndim && dim1 < ndim && dim2 >= -ndim && dim2 < ndim, op, ": dims ", dim1, " and ", dim2,
               " out of range for ", ndim, " dims (", x.describe(), ")");
  const int64_t d1 = dim1 < 0 ? dim1 + ndim : dim1, d2 = dim2 < 0 ? dim2 + ndim : dim2;
  FRUGAL_CHECK(d1 != d2, op, ": dim1 and dim2 name the same dim (", dim1, ", ", dim2, ") of ", x.describe());
  return {d1, d2};
}

}  // namespace

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  FRUGAL_CHECK(x.defined(), "diagonal: undefined input");
  const auto [d1, d2] = two_dims("diagonal", dim1, dim2, x.dim(), x);
  const int64_t rows = x.size(d1) - std::max<int64_t>(-offset, 0), cols = x.size(d2) - std::max<int64_t>(offset, 0);
  const int64_t n = std::max<int64_t>(std::min(rows, cols), 0);
  int64_t start = x.storage_offset();
  if (n > 0) start += offset >= 0 ? offset * x.stride(d2) : -offset * x.stride(d1);
  Shape sizes, strides;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != d1 && d != d2) sizes.push_back(x.size(d)), strides.push_back(x.stride(d));
  sizes.push_back(n);
  strides.push_back(x.stride(d1) + x.stride(d2));
  return x.as_strided(sizes, strides, start);
}

Tensor diag_embed(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  FRUGAL_CHECK(x.defined(), "diag_embed: undefined input");
  FRUGAL_CHECK(x.dim() >= 1 && x.dtype() != kUInt8, "diag_embed: needs at least 1 dim of a numeric dtype (uint8 is ",
               "storage-only), got ", x.describe());
  const int64_t ndim = x.dim() + 1;
  const auto [d1, d2] = two_dims("diag_embed", dim1, dim2, ndim, x);
  const int64_t n = x.size(-1) + (offset >= 0 ? offset : -offset);
  Shape sizes;
  for (int64_t d = 0, k = 0; d < ndim; ++d) sizes.push_back(d == d1 || d == d2 ? n : x.size(k++));
  Tensor out = zeros(sizes, x.options());
  copy_into(diagonal(out, offset, d1, d2), x);
  return out;
}

}  // namespace frugal::ops
