#include "tensor/ops/dropout.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

namespace frugal::ops {

namespace {

void check_dropout(const char* op, const Tensor& x, double p) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
  FRUGAL_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], got ", p, " (input ", x.describe(), ")");
}

/// Masks x with the counters of `range` (0 < p < 1; see Note [Dropout mask from counters]).
Tensor apply_mask([[maybe_unused]] const char* op, const Tensor& x, double p, Generator::Range range) {
  if (p == 0.0) return x.clone();
  if (p == 1.0) return mul(x, 0.0);  // x * 0: an inf or NaN gives NaN (Note [Dropout mask from counters])
  Tensor out = empty(x.sizes(), x.options());
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, x.device(), dropout_kernel, out, x.contiguous(), p, range);
  return out;
}

}  // namespace

DropoutResult dropout(const Tensor& x, double p, Generator* gen) {
  constexpr const char* op = "dropout";
  check_dropout(op, x, p);
  Generator::Range range{0, 0};
  if (p > 0.0 && p < 1.0 && x.numel() > 0) {
    Generator& g = gen ? *gen : default_generator();
    range = g.reserve(uint64_t(x.numel() + 3) / 4);
  }
  return {apply_mask(op, x, p, range), range};
}

Tensor dropout_with_range(const Tensor& x, double p, Generator::Range range) {
  constexpr const char* op = "dropout_with_range";
  check_dropout(op, x, p);
  return apply_mask(op, x, p, range);
}

}  // namespace frugal::ops
