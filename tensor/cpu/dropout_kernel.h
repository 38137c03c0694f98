#pragma once
// Dropout of a dense float32 array, compiled once per x86-64 level (Note [Vectorized dropout] in
// tensor/cpu/dropout_kernel.cpp; the levels as the GEMM's: Note [GEMM kernels per instruction set]
// in tensor/cpu/gemm.cpp). dropout.cpp picks the level gemm_isa() names.
#include <cstdint>

#define FRUGAL_DECLARE_DROPOUT_LEVEL(level)                                                                \
  namespace frugal::ops::cpu::level {                                                                      \
  /* y[i] = x[i] * scale if philox_uniform(word i % 4 of philox4x32(seed, counter + i / 4)) < */           \
  /* keep_below, else 0, for i in [0, n): element 0 is word 0 of the block at `counter` */                 \
  void dropout_f32(float* y, const float* x, int64_t n, uint64_t seed, uint64_t counter, float keep_below, \
                   float scale);                                                                           \
  }
FRUGAL_DECLARE_DROPOUT_LEVEL(v2)
FRUGAL_DECLARE_DROPOUT_LEVEL(v3)
FRUGAL_DECLARE_DROPOUT_LEVEL(v4)
#undef FRUGAL_DECLARE_DROPOUT_LEVEL
