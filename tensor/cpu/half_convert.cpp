// The level dispatch of the bulk float16 conversions (Note [Bulk float16 conversion] in
// tensor/cpu/half_convert_kernel.cpp).
#include "tensor/cpu/half_convert.h"

#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the conversions too
#include "tensor/cpu/half_convert_kernel.h"
#include "tensor/half.h"

namespace frugal::ops::cpu {

static_assert(sizeof(Half) == sizeof(uint16_t));

void half_to_float(float* y, const Half* x, int64_t n) {
  const auto* bits = reinterpret_cast<const uint16_t*>(x);
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return v4::half_to_float(y, bits, n);
    case GemmIsa::X86_64_V3: return v3::half_to_float(y, bits, n);
    case GemmIsa::X86_64_V2: break;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = detail::half_bits_to_float(bits[i]);
}

void float_to_half(Half* y, const float* x, int64_t n) {
  auto* bits = reinterpret_cast<uint16_t*>(y);
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return v4::float_to_half(bits, x, n);
    case GemmIsa::X86_64_V3: return v3::float_to_half(bits, x, n);
    case GemmIsa::X86_64_V2: break;
  }
  for (int64_t i = 0; i < n; ++i) bits[i] = detail::float_to_half_bits(x[i]);
}

}  // namespace frugal::ops::cpu
