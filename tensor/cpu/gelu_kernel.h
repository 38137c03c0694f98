#pragma once
// Exact GELU in float32 on contiguous arrays, compiled once per x86-64 level (like the GEMM:
// Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp; Note [Vectorized GELU] in
// tensor/cpu/gelu_kernel.cpp). unary.cpp picks the level gemm_isa() names.
#include <cstdint>

#define FRUGAL_DECLARE_GELU_LEVEL(level)                                             \
  namespace frugal::ops::cpu::level {                                                \
  /* y[i] = gelu(x[i]) = x Phi(x) */                                                 \
  void gelu_f32(float* y, const float* x, int64_t n);                                \
  /* grad_in[i] = g[i] (Phi(x[i]) + x[i] phi(x[i])) */                               \
  void gelu_backward_f32(float* grad_in, const float* g, const float* x, int64_t n); \
  }
FRUGAL_DECLARE_GELU_LEVEL(v2)
FRUGAL_DECLARE_GELU_LEVEL(v3)
FRUGAL_DECLARE_GELU_LEVEL(v4)
#undef FRUGAL_DECLARE_GELU_LEVEL
