#include "tensor/ops/cumsum.h"

#include <algorithm>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

Tensor cumsum(const Tensor& x, int64_t dim) {
  constexpr const char* op = "cumsum";
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(x.dtype() != kUInt8, op, ": uint8 is a storage-only dtype, got ", x.describe(),
               "; convert it with .to(kInt64) first");
  const int64_t nd = std::max<int64_t>(x.dim(), 1);  // a 0-d input takes dim 0 or -1, as in PyTorch
  FRUGAL_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " out of range for ", x.describe(), " (expected ", -nd, "..",
               nd - 1, ")");
  const int64_t d = dim < 0 ? dim + nd : dim;
  CumsumShape s;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k < d) s.outer *= x.size(k);
    else if (k == d) s.D = x.size(k);
    else s.inner *= x.size(k);
  }
  // Note [Cumulative sum dtypes]
  Tensor out = empty(x.sizes(), {is_floating(x.dtype()) ? x.dtype() : kInt64, x.device()});
  if (out.numel() == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), cumsum_kernel, out, x.contiguous(), s);
  return out;
}

}  // namespace frugal::ops
