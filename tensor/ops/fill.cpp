#include "tensor/ops/fill.h"

#include "tensor/device_dispatch.h"

namespace frugal::ops {

void check_fill_value(const char* op, double value, const Tensor& t) {
  const DType dtype = t.dtype();
  if (!is_integral(dtype)) return;
  // The range as doubles: [-2^31, 2^31 - 1] is exact; int64's largest value rounds up to
  // 2^63, which itself does not fit, hence the strict bound.
  const bool fits = dtype == DType::Int32 ? value >= -2147483648.0 && value <= 2147483647.0
                                          : value >= -9223372036854775808.0 && value < 9223372036854775808.0;
  FRUGAL_CHECK(fits, op, ": value ", value, " cannot be converted to ", dtype_name(dtype), " without overflow (",
               t.describe(), "); see Note [Integer fill values]");
}

void fill_(const Tensor& t, double value) {
  check_fill_value("fill_", value, t);
  if (t.numel() > 0) FRUGAL_DEVICE_DISPATCH("fill_", t.device(), fill_kernel, t, value);
  t.bump_version();
}

void zero_(const Tensor& t) { fill_(t, 0.0); }

void arange_fill_(const Tensor& t, double start, double step) {
  FRUGAL_CHECK(t.dim() == 1 && t.is_contiguous(), "arange_fill_: needs a contiguous 1-D tensor, got ", t.describe());
  if (t.numel() > 0) {
    // The values run monotonically, so the first and the last bound them all.
    check_fill_value("arange", start, t);
    check_fill_value("arange", start + double(t.numel() - 1) * step, t);
    FRUGAL_DEVICE_DISPATCH("arange_fill_", t.device(), arange_fill_kernel, t, start, step);
  }
  t.bump_version();
}

}  // namespace frugal::ops
