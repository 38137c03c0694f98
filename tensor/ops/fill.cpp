#include "tensor/ops/fill.h"

#include "tensor/device_dispatch.h"

namespace frugal::ops {

void fill_(const Tensor& t, double value) {
  if (t.numel() > 0) FRUGAL_DEVICE_DISPATCH("fill_", t.device(), fill_kernel, t, value);
  t.bump_version();
}

void zero_(const Tensor& t) { fill_(t, 0.0); }

void arange_fill_(const Tensor& t, double start, double step) {
  FRUGAL_CHECK(t.dim() == 1 && t.is_contiguous(), "arange_fill_: needs a contiguous 1-D tensor, got ", t.describe());
  if (t.numel() > 0) FRUGAL_DEVICE_DISPATCH("arange_fill_", t.device(), arange_fill_kernel, t, start, step);
  t.bump_version();
}

}  // namespace frugal::ops
