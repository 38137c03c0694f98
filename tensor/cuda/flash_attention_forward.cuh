#pragma once
// Flash attention forward kernel (FlashAttention-2; see Note [Flash attention] and Note
// [Flash attention tiles]). A block owns 64 queries of one (batch, head); its 4 warps keep
// their 16 query rows of q as A fragments in registers and walk the keys 64 at a time:
// S = q k^T (tensor cores), the online softmax on S in registers, o += P v with P reused as
// A fragments (Note [MMA fragments]). The next k, v tiles stream into the other half of a
// double buffer (cp.async) while the current one is used.
#include "tensor/cuda/flash_attention_common.cuh"

namespace frugal::ops::cuda::flash {

/// Dynamic shared memory of the forward kernel: q tile and two k and v tiles.
template <typename T, int kD>
constexpr size_t forward_smem_bytes() {
  return size_t(kBlockRows + 4 * kBlockCols) * (kD + 8) * sizeof(T);
}

// out: (B, H, L, E) contiguous; lse: (B, H, L) f32; q: (B, H, L, E), k, v: (B, H, S, E)
// strided as in p; mask: read through ScoreMask (null when p.mask_kind == 0).
// Grid: one block per (query tile, batch * head), query tiles of a head adjacent.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, const void* __restrict__ mask, const FlashAttentionParams p,
                         const float scale_log2, const float keep_below, const float drop_scale) {
  constexpr int kPitch = kD + 8;
  constexpr int kN = kBlockCols / 8;  // n-tiles of a score tile
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);     // [kBlockRows][kPitch]
  T* k_s = q_s + kBlockRows * kPitch;      // [2][kBlockCols][kPitch]
  T* v_s = k_s + 2 * kBlockCols * kPitch;  // [2][kBlockCols][kPitch]

  const int64_t q_tiles = (p.L + kBlockRows - 1) / kBlockRows;
  const int64_t bh = int64_t(blockIdx.x) / q_tiles, b = bh / p.H, h = bh % p.H;
  // Causal: the longest tiles (last queries) first, so the short ones fill the tail.
  const int64_t tile = p.causal ? q_tiles - 1 - int64_t(blockIdx.x) % q_tiles : int64_t(blockIdx.x) % q_tiles;
  const int64_t q0 = tile * kBlockRows;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const T* qb = q + b * p.q_stride[0] + h * p.q_stride[1];
  const T* kb = k + b * p.k_stride[0] + h * p.k_stride[1];
  const T* vb = v + b * p.v_stride[0] + h * p.v_stride[1];
  const ScoreMask sm = score_mask(mask, p, b, h);

  int64_t n_tiles = (p.S + kBlockCols - 1) / kBlockCols;
  if (p.causal) n_tiles = min(n_tiles, (min(q0 + kBlockRows, p.L) + kBlockCols - 1) / kBlockCols);

  load_tile<T, kBlockRows, kD, kThreads>(q_s, qb, p.q_stride[2], q0, p.L, p.E);
  load_tile<T, kBlockCols, kD, kThreads>(k_s, kb, p.k_stride[2], 0, p.S, p.E);
  load_tile<T, kBlockCols, kD, kThreads>(v_s, vb, p.v_stride[2], 0, p.S, p.E);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // This warp's 16 query rows as A fragments, for the whole key loop.
  uint32_t qf[kD / 16][4];
  const T* qw = q_s + 16 * warp * kPitch;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    qf[kk][0] = lds32(qw + g * kPitch + 16 * kk + 2 * t);
    qf[kk][1] = lds32(qw + (g + 8) * kPitch + 16 * kk + 2 * t);
    qf[kk][2] = lds32(qw + g * kPitch + 16 * kk + 8 + 2 * t);
    qf[kk][3] = lds32(qw + (g + 8) * kPitch + 16 * kk + 8 + 2 * t);
  }

  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g and g + 8 (base-2 units)
  const int64_t rows[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};

  for (int64_t j = 0; j < n_tiles; ++j) {
    const int buf = int(j & 1);
    if (j + 1 < n_tiles) {  // prefetch the next k, v tiles into the other buffer
      load_tile<T, kBlockCols, kD, kThreads>(k_s + (buf ^ 1) * kBlockCols * kPitch, kb, p.k_stride[2],
                                             (j + 1) * kBlockCols, p.S, p.E);
      load_tile<T, kBlockCols, kD, kThreads>(v_s + (buf ^ 1) * kBlockCols * kPitch, vb, p.v_stride[2],
                                             (j + 1) * kBlockCols, p.S, p.E);
      cp_async_commit();
    }
    const T* kt = k_s + buf * kBlockCols * kPitch;
    const T* vt = v_s + buf * kBlockCols * kPitch;

    // s = q k^T: B[e][s] = k[s][e], element pairs along a row of k.
    float s[kN][4];
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const T* kr = kt + (8 * nt + g) * kPitch + 16 * kk + 2 * t;
        mma_16816<T>(s[nt], qf[kk], lds32(kr), lds32(kr + 8));
      }
    }

    const int64_t s0 = j * kBlockCols;
    const bool check = sm.kind != 0 || s0 + kBlockCols > p.S || (p.causal && s0 + kBlockCols - 1 > q0);
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[nt][i] = check ? masked_score<T>(s[nt][i], scale_log2, rows[i >> 1], s0 + 8 * nt + 2 * t + (i & 1), sm)
                         : s[nt][i] * scale_log2;
      }
    }

    // Online softmax of rows g (hf = 0: elements 0, 1) and g + 8 (hf = 1: elements 2, 3).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of group g share the row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[hf], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // an all-masked row so far: weights 0
      const float alpha = fast_exp2(row_max[hf] - m_use);
      row_max[hf] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        s[nt][2 * hf] = fast_exp2(s[nt][2 * hf] - m_use);
        s[nt][2 * hf + 1] = fast_exp2(s[nt][2 * hf + 1] - m_use);
        sum += s[nt][2 * hf] + s[nt][2 * hf + 1];
      }
      row_sum[hf] = row_sum[hf] * alpha + sum;  // this lane's columns only; summed over the group at the end
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        o[dt][2 * hf] *= alpha;
        o[dt][2 * hf + 1] *= alpha;
      }
    }

    if (p.dropout_p > 0.0) {  // the sums above are of the undropped weights, as the softmax's
      uint32_t dropped = 0;   // bit 4 nt + i: weight (nt, i) dropped
#pragma unroll 1
      for (int bit = 0; bit < 4 * kN; bit += 2) {  // a loop, not unrolled: one Philox body in the code
        const int nt = bit / 4, hf = (bit / 2) % 2;
        const uint64_t index = uint64_t((bh * p.L + q0 + 16 * warp + g + 8 * hf) * p.S + s0 + 8 * nt + 2 * t);
        bool k0, k1;
        dropout_keep_pair(p.range, index, keep_below, k0, k1);
        dropped |= (k0 ? 0u : 1u) << bit | (k1 ? 0u : 2u) << bit;
      }
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] *= (dropped >> (4 * nt + i)) & 1u ? 0.f : drop_scale;
    }

    // o += P v: P from the score registers, B[s][e] = v[s][e] by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBlockCols / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const T* vrow = vt + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + (lane >> 4) * 8;
#pragma unroll
      for (int dt = 0; dt < kD / 8; dt += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vrow + 8 * dt);
        mma_16816<T>(o[dt], a, bv[0], bv[1]);
        mma_16816<T>(o[dt + 1], a, bv[2], bv[3]);
      }
    }
    cp_async_wait_all();  // the next tiles have landed ...
    __syncthreads();      // ... and no warp reads this buffer any more before it is refilled
  }

  T* ob = out + b * p.o_stride[0] + h * p.o_stride[1];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = row_sum[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a row without keys gives zeros
    const int64_t r = rows[hf];
    if (r >= p.L) continue;
    T* orow = ob + r * p.o_stride[2];
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const int col = 8 * dt + 2 * t;
      if (col < p.E) *reinterpret_cast<uint32_t*>(orow + col) = pack2<T>(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
    }
    if (t == 0) lse[bh * p.L + r] = sum > 0.f ? (row_max[hf] + log2f(sum)) / kLog2e : -INFINITY;
  }
}

}  // namespace frugal::ops::cuda::flash
