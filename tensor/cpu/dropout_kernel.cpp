// One instruction-set level's float32 dropout: built once per level, each time with that level's
// -march, FRUGAL_KERNEL_ISA naming it (v2, v3, v4), -fopenmp-simd and -fno-trapping-math, and
// nothing but its own header in the translation unit, so no inline function of another header
// (philox.h's among them) can be merged across levels (Note [GEMM kernels per instruction set] in
// tensor/cpu/gemm.cpp; tools/check_gemm_objects.py checks it).
//
// Note [Vectorized dropout]
// The generic kernel (dropout.cpp) calls philox4x32 once per four elements, a chain of ten
// dependent rounds of two 32x32 -> 64-bit products each: Philox, not the memory, sets its pace
// (8 ms for BERT-base's (4, 12, 128, 128) attention weights on one core). The counters of
// neighbouring groups are independent, so here kGroups of them run side by side, one per
// vector lane (the widening product is pmuludq), in the order of the rounds of philox.h's
// philox4x32_10, which is copied below and must stay the same function: element i of the output
// is still word i % 4 of the block at counter + i / 4 (Note [Dropout mask from counters]), the
// same bits as the generic path and the CUDA kernel (tests/cpu/test_dropout_simd.cpp compares
// every level with philox.h on every element). The words are then written out interleaved, four
// per group, and the mask applied as the generic path does: philox_uniform(w) < keep_below,
// x * scale in float, 0 otherwise.
#include "tensor/cpu/dropout_kernel.h"

#ifndef FRUGAL_KERNEL_ISA
#error "dropout_kernel.cpp is built with -DFRUGAL_KERNEL_ISA=v2|v3|v4 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA {

namespace {

#define FRUGAL_DROPOUT_INLINE inline __attribute__((always_inline))

/// philox.h's philox4x32(seed, counter) (Philox4x32-10 with c2 = c3 = 0), word by word.
FRUGAL_DROPOUT_INLINE void philox_block(uint64_t seed, uint64_t counter, uint32_t& w0, uint32_t& w1, uint32_t& w2,
                                        uint32_t& w3) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w0 = c0, w1 = c1, w2 = c2, w3 = c3;
}

/// philox.h's philox_uniform: 24 random bits in [0, 1).
FRUGAL_DROPOUT_INLINE float uniform(uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }

constexpr int64_t kGroups = 16;  // Philox blocks computed side by side: 64 elements

}  // namespace

void dropout_f32(float* y, const float* x, int64_t n, uint64_t seed, uint64_t counter, float keep_below, float scale) {
  const int64_t full = n / (4 * kGroups) * kGroups;  // groups handled kGroups at a time
  uint32_t words[4 * kGroups];
  for (int64_t k0 = 0; k0 < full; k0 += kGroups) {
#pragma omp simd
    for (int64_t j = 0; j < kGroups; ++j)
      philox_block(seed, counter + uint64_t(k0 + j), words[4 * j], words[4 * j + 1], words[4 * j + 2],
                   words[4 * j + 3]);
    const float* xb = x + 4 * k0;
    float* yb = y + 4 * k0;
#pragma omp simd
    for (int64_t i = 0; i < 4 * kGroups; ++i) yb[i] = xb[i] * (uniform(words[i]) < keep_below ? scale : 0.0f);
  }
  for (int64_t i = 4 * full; i < n; i += 4) {  // the last (n mod 64) elements, a group at a time
    uint32_t w[4];
    philox_block(seed, counter + uint64_t(i / 4), w[0], w[1], w[2], w[3]);
    for (int64_t e = 0; e < 4 && i + e < n; ++e) y[i + e] = x[i + e] * (uniform(w[e]) < keep_below ? scale : 0.0f);
  }
}

}  // namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA
