#include "tensor/ops/fill.h"

#include "tensor/device_dispatch.h"

namespace frugal::ops {

void fill_(const Tensor& t, double value) {
  if (t.numel() > 0) FRUGAL_DEVICE_DISPATCH("fill_", t.device(), fill_kernel, t, value);
  t.bump_version();
}

void zero_(const Tensor& t) { fill_(t, 0.0); }

}  // namespace frugal::ops
