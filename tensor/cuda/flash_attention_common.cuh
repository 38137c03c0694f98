#pragma once
// Shared by the flash attention forward and backward kernels: tile sizes, the masked score
// of one (query, key) pair and the dropout test (see Note [Flash attention]).
#include <cmath>

#include "tensor/cuda/flash_attention_mma.cuh"
#include "tensor/ops/flash_attention.h"

namespace frugal::ops::cuda::flash {

// Note [Flash attention tiles]
// A block is 4 warps (128 threads) and works on a 64 x 64 (queries x keys) tile at a time;
// each warp owns 16 rows of it (queries in the forward, keys in the backward), so a warp's
// products are m16 tiles and its softmax rows never leave the warp (a row's 64 scores are
// spread over the 4 lanes of one group g: Note [MMA fragments]). The head dim is padded to
// kD in {32, 64, 96, 128} (zero columns: they add nothing to q k^T and are never stored).
constexpr int kBlockRows = 64;  // queries per tile (Br)
constexpr int kBlockCols = 64;  // keys per tile (Bc)
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

/// What every thread needs to mask a score: the mask of one (batch, head) slice.
struct ScoreMask {
  const void* mask;  // bool or T, read at off + l * sl + s * ss; null when kind == 0
  int64_t off, sl, ss;
  int kind;  // 0 none, 1 bool, 2 added
  int64_t L, S;
  bool causal;
};

/// scale * log2(e) * q.k + log2(e) * mask for query l and key s, -inf where masked or out of
/// range: the exponent base 2 of the unnormalized weight (Note [Flash attention]).
template <typename T>
__device__ __forceinline__ float masked_score(float dot, float scale_log2, int64_t l, int64_t s, const ScoreMask& m) {
  if (s >= m.S || l >= m.L || (m.causal && s > l)) return -INFINITY;
  float x = dot * scale_log2;
  if (m.kind == 1) {
    if (!static_cast<const bool*>(m.mask)[m.off + l * m.sl + s * m.ss]) return -INFINITY;
  } else if (m.kind == 2) {
    x += float(static_cast<const T*>(m.mask)[m.off + l * m.sl + s * m.ss]) * kLog2e;
  }
  return x;
}

__device__ __forceinline__ uint32_t philox_word(const PhiloxResult& r, int w) {
  return w == 0 ? r.x[0] : w == 1 ? r.x[1] : w == 2 ? r.x[2] : r.x[3];
}

/// Whether dropout keeps weights `index` and `index + 1` (row-major in (B, H, L, S)).
__device__ __forceinline__ void dropout_keep_pair(Generator::Range range, uint64_t index, float keep_below, bool& k0,
                                                  bool& k1) {
  const uint64_t counter = philox_first_counter(range.counter, range.base) + index / 4;
  const PhiloxResult r = philox4x32(range.seed, counter);
  const int w = int(index % 4);
  k0 = philox_uniform(philox_word(r, w)) < keep_below;
  if (w < 3) {
    k1 = philox_uniform(philox_word(r, w + 1)) < keep_below;
  } else {
    const PhiloxResult r1 = philox4x32(range.seed, counter + 1);
    k1 = philox_uniform(r1.x[0]) < keep_below;
  }
}

/// Whether dropout keeps weight `index`.
__device__ __forceinline__ bool dropout_keep(Generator::Range range, uint64_t index, float keep_below) {
  const PhiloxResult r = philox4x32(range.seed, philox_first_counter(range.counter, range.base) + index / 4);
  return philox_uniform(philox_word(r, int(index % 4))) < keep_below;
}

/// ScoreMask of slice (b, h).
__host__ __device__ inline ScoreMask score_mask(const void* mask, const FlashAttentionParams& p, int64_t b, int64_t h) {
  return {
      mask,    b * p.mask_stride[0] + h * p.mask_stride[1], p.mask_stride[2], p.mask_stride[3], p.mask_kind, p.L, p.S,
      p.causal};
}

}  // namespace frugal::ops::cuda::flash
