#include "tensor/ops/svd.h"

#include <algorithm>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

SVDResult svd(const Tensor& a) {
  FRUGAL_CHECK(a.defined(), "svd: undefined input");
  FRUGAL_CHECK(a.dim() >= 2, "svd: expected a (..., m, n) tensor of at least 2 dims, got ", a.describe());
  FRUGAL_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64, "svd: not implemented for ", dtype_name(a.dtype()),
               " on ", a.device().str(), " (", a.describe(),
               "); supported dtypes: float32, float64 (convert with .to(kFloat32))");
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const Shape batch(a.sizes().begin(), a.sizes().end() - 2);
  auto with = [&](std::initializer_list<int64_t> tail) {
    Shape s = batch;
    s.insert(s.end(), tail);
    return s;
  };
  SVDResult r{empty(with({m, k}), a.options()), empty(with({k}), a.options()), empty(with({k, n}), a.options())};
  if (r.S.numel() == 0) return r;  // empty batch, or k == 0: every output is empty
  const int64_t B = numel_of(batch);
  FRUGAL_DEVICE_DISPATCH("svd", a.device(), svd_kernel, a.contiguous().view({B, m, n}), r.U.view({B, m, k}),
                         r.S.view({B, k}), r.Vh.view({B, k, n}));
  return r;
}

}  // namespace frugal::ops
