#pragma once
// float16 <-> float32 on contiguous arrays with F16C's conversion instructions, compiled once per
// x86-64 level that has them, v3 and v4 (Note [Bulk float16 conversion] in
// tensor/cpu/half_convert_kernel.cpp; the levels as the GEMM's: Note [GEMM kernels per instruction
// set] in tensor/cpu/gemm.cpp). half_convert.cpp picks the level gemm_isa() names; x86-64-v2 has no
// F16C and converts with half.h's routines. The arrays hold float16's bits.
#include <cstdint>

#define FRUGAL_DECLARE_HALF_CONVERT_LEVEL(level)                         \
  namespace frugal::ops::cpu::level {                                    \
  /* y[i] = x[i] as float32, exactly, for i in [0, n) */                 \
  void half_to_float(float* y, const uint16_t* x, int64_t n);            \
  /* y[i] = x[i] rounded to float16 (to nearest, ties to even; */        \
  /* a NaN to the quiet NaN 0x7e00 with x[i]'s sign), for i in [0, n) */ \
  void float_to_half(uint16_t* y, const float* x, int64_t n);            \
  }
FRUGAL_DECLARE_HALF_CONVERT_LEVEL(v3)
FRUGAL_DECLARE_HALF_CONVERT_LEVEL(v4)
#undef FRUGAL_DECLARE_HALF_CONVERT_LEVEL
