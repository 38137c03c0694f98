#pragma once
// Layer norm's float32 rows, compiled once per x86-64 level (Note [Vectorized layer norm] in
// tensor/cpu/norm_kernel.cpp; the levels as the GEMM's: Note [GEMM kernels per instruction set] in
// tensor/cpu/gemm.cpp). norm.cpp picks the level gemm_isa() names.
#include <cstdint>

#define FRUGAL_DECLARE_NORM_LEVEL(level)                                                                        \
  namespace frugal::ops::cpu::level {                                                                           \
  /* One row of N: *mean (unless null: RMS norm) and *rstd, and y = (x - mean) rstd [* w] [+ b] */              \
  void layer_norm_row_f32(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,   \
                          int64_t N, double eps);                                                               \
  /* One row of N of the backward (Note [Layer norm statistics]): pw[j] += g xhat, pb[j] += g (unless null), */ \
  /* and gx (unless null); with_mean false: RMS norm */                                                         \
  void layer_norm_backward_row_f32(float* gx, double* pw, double* pb, const float* g, const float* x, float m,  \
                                   float rs, const float* w, int64_t N, bool with_mean);                        \
  }
FRUGAL_DECLARE_NORM_LEVEL(v2)
FRUGAL_DECLARE_NORM_LEVEL(v3)
FRUGAL_DECLARE_NORM_LEVEL(v4)
#undef FRUGAL_DECLARE_NORM_LEVEL
