#pragma once
// Bulk float16 <-> float32 conversion on the CPU: F16C's instructions at x86-64-v3 and v4, half.h's
// routines at v2, the same bits at every level (Note [Bulk float16 conversion] in
// tensor/cpu/half_convert_kernel.cpp). The dtype-cast copy, via_float32.h's chunks and the float16
// GEMM's float32 copies convert through these; a single element still converts with Half's own
// operators, which give the same bits.
#include <cstdint>

namespace frugal {
struct Half;
}

namespace frugal::ops::cpu {

/// y[i] = float(x[i]) for i in [0, n): exact; a NaN keeps its sign and payload and is made quiet.
/// y and x contiguous, not overlapping; at the level gemm_isa() names.
void half_to_float(float* y, const Half* x, int64_t n);

/// y[i] = Half(x[i]) for i in [0, n): to nearest, ties to even, subnormal halves kept, overflow
/// (|x| >= 65520) to +-inf, a NaN to 0x7e00 with its sign. y and x contiguous, not overlapping.
void float_to_half(Half* y, const float* x, int64_t n);

}  // namespace frugal::ops::cpu
