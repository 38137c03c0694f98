#include "tensor/ops/cumsum.h"

#include <algorithm>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

namespace {

// Note [Cumulative sum dtypes]: `dtype` converts x before the sums (or products).
Tensor running_totals(const char* op, Cumulative kind, const Tensor& x_in, int64_t dim, bool reverse,
                      std::optional<DType> dtype) {
  FRUGAL_CHECK(x_in.defined(), op, ": undefined input");
  FRUGAL_CHECK(dtype.value_or(x_in.dtype()) != kUInt8, op, ": uint8 is a storage-only dtype, got ", x_in.describe(),
               dtype ? " and dtype uint8" : "", "; convert it with .to(kInt64) first");
  const int64_t nd = std::max<int64_t>(x_in.dim(), 1);  // a 0-d input takes dim 0 or -1, as in PyTorch
  FRUGAL_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " out of range for ", x_in.describe(), " (expected ", -nd,
               "..", nd - 1, ")");
  const Tensor x = dtype ? x_in.to(*dtype).contiguous() : x_in.contiguous();
  const int64_t d = dim < 0 ? dim + nd : dim;
  CumsumShape s;
  s.reverse = reverse;
  s.op = kind;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k < d) s.outer *= x.size(k);
    else if (k == d) s.D = x.size(k);
    else s.inner *= x.size(k);
  }
  Tensor out = empty(x.sizes(), {is_floating(x.dtype()) ? x.dtype() : kInt64, x.device()});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, x.device(), cumsum_kernel, out, x, s);
  return dtype && out.dtype() != *dtype ? out.to(*dtype) : out;  // an integral dtype: summed in int64
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return running_totals("cumsum", Cumulative::Sum, x, dim, false, dtype);
}

Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return running_totals("cumprod", Cumulative::Prod, x, dim, false, dtype);
}

Tensor reverse_cumsum(const Tensor& x, int64_t dim) {
  return running_totals("reverse_cumsum", Cumulative::Sum, x, dim, true, {});
}

}  // namespace frugal::ops
