#pragma once
// Attention's softmax rows in float32, compiled once per x86-64 level (Note [Vectorized masked
// softmax] in tensor/cpu/masked_softmax_kernel.cpp; the levels as the GEMM's: Note [GEMM kernels
// per instruction set] in tensor/cpu/gemm.cpp). masked_softmax.cpp (forward) and softmax.cpp
// (the gradient along the last dim, which is also the masked softmax's) pick the level
// gemm_isa() names.
#include <cstdint>

#define FRUGAL_DECLARE_MASKED_SOFTMAX_LEVEL(level)                                                              \
  namespace frugal::ops::cpu::level {                                                                           \
  /* y = softmax(scale * x + mask) over one row of S >= 1 (Note [Masked softmax]): entries s >= keep_end and */ \
  /* those where bool_mask (stride ms) is false are -inf; add_mask (stride ms) is added; at most one mask. */   \
  /* A row with no finite entry gives zeros. z: S floats of scratch. */                                         \
  void masked_softmax_row_f32(float* y, const float* x, int64_t S, float scale, int64_t keep_end,               \
                              const bool* bool_mask, const float* add_mask, int64_t ms, float* z);              \
  /* gi[r] = y[r] * (g[r] - sum(g[r] * y[r])) for each row r of S elements, the sum in double */                \
  void softmax_backward_rows_f32(float* gi, const float* g, const float* y, int64_t rows, int64_t S);           \
  }
FRUGAL_DECLARE_MASKED_SOFTMAX_LEVEL(v2)
FRUGAL_DECLARE_MASKED_SOFTMAX_LEVEL(v3)
FRUGAL_DECLARE_MASKED_SOFTMAX_LEVEL(v4)
#undef FRUGAL_DECLARE_MASKED_SOFTMAX_LEVEL
