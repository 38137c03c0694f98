#pragma once
// Flash attention backward kernels (FlashAttention-2's; see Note [Flash attention] and Note
// [Flash attention tiles]). Three launches:
//  1. flash_backward_dot_kernel: D = rowsum(dout * out) per query row, f32 (B, H, L).
//  2. flash_backward_kernel: a block owns 64 keys of one (batch, head), each warp 16 of
//     them, with their dk and dv accumulators in registers, and walks the query tiles:
//       S^T = k q^T, P^T = exp2(S^T - lse)          (keys as rows: P^T is the A operand of dv)
//       dv += (P f)^T dout,  dP^T = v dout^T,  dS^T = P^T (dP^T f - D),  dk += dS^T q
//     with f the dropout factor. dS goes through shared memory (as dS, queries as rows) so
//     the block can form dq_tile = dS k, which is added to an f32 (B, H, L, E) accumulator
//     with atomics: other key blocks add to the same rows.
//  3. flash_backward_dq_kernel: dq = scale * accumulator, in q's dtype.
#include "tensor/cuda/flash_attention_common.cuh"

namespace frugal::ops::cuda::flash {

/// Dynamic shared memory of the backward kernel: k, v, q, dout tiles, dS, lse and D.
template <typename T, int kD>
constexpr size_t backward_smem_bytes() {
  return size_t(2 * kBlockCols + 2 * kBlockRows) * (kD + 8) * sizeof(T) +
         size_t(kBlockRows) * (kBlockCols + 8) * sizeof(T) + 2 * kBlockRows * sizeof(float);
}

// dot: (B, H, L) f32; dout: (B, H, L, E) strided as p.o_stride; out: (B, H, L, E) strided as
// p.out_stride. One warp per row.
template <typename T>
__global__ void flash_backward_dot_kernel(float* __restrict__ dot, const T* __restrict__ dout,
                                          const T* __restrict__ out, const FlashAttentionParams p) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.B * p.H * p.L) return;
  const int lane = int(threadIdx.x) % 32;
  const int64_t l = row % p.L, bh = row / p.L, b = bh / p.H, h = bh % p.H;
  const T* g = dout + b * p.o_stride[0] + h * p.o_stride[1] + l * p.o_stride[2];
  const T* o = out + b * p.out_stride[0] + h * p.out_stride[1] + l * p.out_stride[2];
  float acc = 0.f;
  for (int64_t e = lane; e < p.E; e += 32) acc += float(g[e]) * float(o[e]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) dot[row] = acc;
}

// dq: (B, H, L, E) strided as p.dq_stride, in T = scale * acc: (B, H, L, E) f32 contiguous.
template <typename T>
__global__ void flash_backward_dq_kernel(T* __restrict__ dq, const float* __restrict__ acc,
                                         const FlashAttentionParams p, float scale) {
  const int64_t n = p.B * p.H * p.L * p.E;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % p.E, row = i / p.E, l = row % p.L, bh = row / p.L;
    dq[(bh / p.H) * p.dq_stride[0] + (bh % p.H) * p.dq_stride[1] + l * p.dq_stride[2] + e] = T(acc[i] * scale);
  }
}

// dq_acc: (B, H, L, E) f32, zeroed; dk, dv: (B, H, S, E) strided as p.dk_stride, p.dv_stride
// (even strides and 4-byte aligned rows: the stores below write pairs); dout, q: (B, H, L, E),
// k, v: (B, H, S, E) strided as in p; lse, dot: (B, H, L) f32. Grid: one block per
// (key tile, batch * head), key tiles of a head adjacent.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv,
                          const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dot,
                          const void* __restrict__ mask, const FlashAttentionParams p, const float scale_log2,
                          const float keep_below, const float drop_scale) {
  constexpr int kPitch = kD + 8;
  constexpr int kSPitch = kBlockCols + 8;
  constexpr int kN = kBlockRows / 8;  // n-tiles of a (keys x queries) score tile
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);                                   // [kBlockCols][kPitch]
  T* v_s = k_s + kBlockCols * kPitch;                                    // [kBlockCols][kPitch]
  T* q_s = v_s + kBlockCols * kPitch;                                    // [kBlockRows][kPitch]
  T* do_s = q_s + kBlockRows * kPitch;                                   // [kBlockRows][kPitch]
  T* ds_s = do_s + kBlockRows * kPitch;                                  // [kBlockRows][kSPitch]: dS, queries as rows
  float* lse_s = reinterpret_cast<float*>(ds_s + kBlockRows * kSPitch);  // [kBlockRows], base 2
  float* dot_s = lse_s + kBlockRows;                                     // [kBlockRows]

  const int64_t k_tiles = (p.S + kBlockCols - 1) / kBlockCols;
  const int64_t bh = int64_t(blockIdx.x) / k_tiles, b = bh / p.H, h = bh % p.H;
  const int64_t k0 = (int64_t(blockIdx.x) % k_tiles) * kBlockCols;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const T* qb = q + b * p.q_stride[0] + h * p.q_stride[1];
  const T* kb = k + b * p.k_stride[0] + h * p.k_stride[1];
  const T* vb = v + b * p.v_stride[0] + h * p.v_stride[1];
  const T* dob = dout + b * p.o_stride[0] + h * p.o_stride[1];
  const ScoreMask sm = score_mask(mask, p, b, h);

  load_tile<T, kBlockCols, kD, kThreads>(k_s, kb, p.k_stride[2], k0, p.S, p.E);
  load_tile<T, kBlockCols, kD, kThreads>(v_s, vb, p.v_stride[2], k0, p.S, p.E);
  cp_async_commit();

  float dk_acc[kD / 8][4], dv_acc[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk_acc[dt][i] = dv_acc[dt][i] = 0.f;
  const int64_t keys[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  const T* kw = k_s + 16 * warp * kPitch;  // this warp's 16 keys
  const T* vw = v_s + 16 * warp * kPitch;
  // ldmatrix.trans row of this lane within a 16-row k-step, and its column offset (Note [MMA fragments]).
  const int trans_row = (lane & 7) + ((lane >> 3) & 1) * 8, trans_col = (lane >> 4) * 8;

  const int64_t q_tiles = (p.L + kBlockRows - 1) / kBlockRows;
  // Causal: a query tile before the one holding query k0 sees none of these keys.
  for (int64_t qt = p.causal ? k0 / kBlockRows : 0; qt < q_tiles; ++qt) {
    const int64_t q0 = qt * kBlockRows;
    load_tile<T, kBlockRows, kD, kThreads>(q_s, qb, p.q_stride[2], q0, p.L, p.E);
    load_tile<T, kBlockRows, kD, kThreads>(do_s, dob, p.o_stride[2], q0, p.L, p.E);
    cp_async_commit();
    if (threadIdx.x < kBlockRows) {
      const int64_t l = q0 + threadIdx.x;
      const float row_lse = l < p.L ? lse[bh * p.L + l] : -INFINITY;
      // An empty row (lse = -inf) has weights 0: exp2(score - inf) = 0.
      lse_s[threadIdx.x] = row_lse == -INFINITY ? INFINITY : row_lse * kLog2e;
      dot_s[threadIdx.x] = l < p.L ? dot[bh * p.L + l] : 0.f;
    }
    cp_async_wait_all();
    __syncthreads();

    // S^T = k q^T (this warp's 16 keys x 64 queries): B[e][l] = q[l][e], pairs along a row of q.
    float pt[kN][4];
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) pt[nt][0] = pt[nt][1] = pt[nt][2] = pt[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t a[4] = {lds32(kw + g * kPitch + 16 * kk + 2 * t), lds32(kw + (g + 8) * kPitch + 16 * kk + 2 * t),
                             lds32(kw + g * kPitch + 16 * kk + 8 + 2 * t),
                             lds32(kw + (g + 8) * kPitch + 16 * kk + 8 + 2 * t)};
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const T* qr = q_s + (8 * nt + g) * kPitch + 16 * kk + 2 * t;
        mma_16816<T>(pt[nt], a, lds32(qr), lds32(qr + 8));
      }
    }

    // P^T: element i of n-tile nt is key keys[i >> 1], query q0 + 8 nt + 2 t + (i & 1).
    const bool check =
        sm.kind != 0 || k0 + kBlockCols > p.S || q0 + kBlockRows > p.L || (p.causal && k0 + kBlockCols - 1 > q0);
    uint32_t dropped = 0;  // bit 4 nt + i: weight dropped
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int ql = 8 * nt + 2 * t + (i & 1);
        const float x =
            check ? masked_score<T>(pt[nt][i], scale_log2, q0 + ql, keys[i >> 1], sm) : pt[nt][i] * scale_log2;
        pt[nt][i] = fast_exp2(x - lse_s[ql]);
      }
    }
    if (p.dropout_p > 0.0) {
#pragma unroll 1
      for (int bit = 0; bit < 4 * kN; ++bit) {  // a loop, not unrolled: one Philox body in the code
        const int ql = 8 * (bit / 4) + 2 * t + (bit & 1);
        const int64_t key = k0 + 16 * warp + g + 8 * ((bit / 2) & 1);
        const uint64_t index = uint64_t((bh * p.L + q0 + ql) * p.S + key);
        if (!dropout_keep(p.range, index, keep_below)) dropped |= 1u << bit;
      }
    }
    auto factor = [&](int nt, int i) { return (dropped >> (4 * nt + i)) & 1u ? 0.f : drop_scale; };

    // dv += (P f)^T dout: A from the P^T registers, B[l][e] = dout[l][e] by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBlockRows / 16; ++kk) {
      const int n0 = 2 * kk, n1 = 2 * kk + 1;
      const uint32_t a[4] = {pack2<T>(pt[n0][0] * factor(n0, 0), pt[n0][1] * factor(n0, 1)),
                             pack2<T>(pt[n0][2] * factor(n0, 2), pt[n0][3] * factor(n0, 3)),
                             pack2<T>(pt[n1][0] * factor(n1, 0), pt[n1][1] * factor(n1, 1)),
                             pack2<T>(pt[n1][2] * factor(n1, 2), pt[n1][3] * factor(n1, 3))};
      const T* drow = do_s + (16 * kk + trans_row) * kPitch + trans_col;
#pragma unroll
      for (int dt = 0; dt < kD / 8; dt += 2) {
        uint32_t bd[4];
        ldmatrix_x4_trans(bd, drow + 8 * dt);
        mma_16816<T>(dv_acc[dt], a, bd[0], bd[1]);
        mma_16816<T>(dv_acc[dt + 1], a, bd[2], bd[3]);
      }
    }

    // dP^T = v dout^T: B[e][l] = dout[l][e], pairs along a row of dout.
    float dpt[kN][4];
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) dpt[nt][0] = dpt[nt][1] = dpt[nt][2] = dpt[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t a[4] = {lds32(vw + g * kPitch + 16 * kk + 2 * t), lds32(vw + (g + 8) * kPitch + 16 * kk + 2 * t),
                             lds32(vw + g * kPitch + 16 * kk + 8 + 2 * t),
                             lds32(vw + (g + 8) * kPitch + 16 * kk + 8 + 2 * t)};
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const T* dr = do_s + (8 * nt + g) * kPitch + 16 * kk + 2 * t;
        mma_16816<T>(dpt[nt], a, lds32(dr), lds32(dr + 8));
      }
    }

    // dS^T = P^T (dP^T f - D), in place of dP^T; and dS (queries as rows) into shared memory.
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int ql = 8 * nt + 2 * t + (i & 1);
        dpt[nt][i] = pt[nt][i] * (dpt[nt][i] * factor(nt, i) - dot_s[ql]);
        ds_s[ql * kSPitch + 16 * warp + g + 8 * (i >> 1)] = T(dpt[nt][i]);
      }
    }

    // dk += dS^T q: B[l][e] = q[l][e] by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBlockRows / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]), pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                             pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                             pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
      const T* qrow = q_s + (16 * kk + trans_row) * kPitch + trans_col;
#pragma unroll
      for (int dt = 0; dt < kD / 8; dt += 2) {
        uint32_t bq[4];
        ldmatrix_x4_trans(bq, qrow + 8 * dt);
        mma_16816<T>(dk_acc[dt], a, bq[0], bq[1]);
        mma_16816<T>(dk_acc[dt + 1], a, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS complete

    // dq rows 16 warp .. + 15 of this tile += dS k: A = dS rows (pairs along keys), B[s][e] = k[s][e].
    float dqa[kD / 8][4];
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) dqa[dt][0] = dqa[dt][1] = dqa[dt][2] = dqa[dt][3] = 0.f;
    const T* dsw = ds_s + 16 * warp * kSPitch;
#pragma unroll
    for (int kk = 0; kk < kBlockCols / 16; ++kk) {
      const uint32_t a[4] = {
          lds32(dsw + g * kSPitch + 16 * kk + 2 * t), lds32(dsw + (g + 8) * kSPitch + 16 * kk + 2 * t),
          lds32(dsw + g * kSPitch + 16 * kk + 8 + 2 * t), lds32(dsw + (g + 8) * kSPitch + 16 * kk + 8 + 2 * t)};
      const T* krow = k_s + (16 * kk + trans_row) * kPitch + trans_col;
#pragma unroll
      for (int dt = 0; dt < kD / 8; dt += 2) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, krow + 8 * dt);
        mma_16816<T>(dqa[dt], a, bk[0], bk[1]);
        mma_16816<T>(dqa[dt + 1], a, bk[2], bk[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t l = q0 + 16 * warp + g + 8 * hf;
      if (l >= p.L) continue;
      float* row = dq_acc + (bh * p.L + l) * p.E;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        const int col = 8 * dt + 2 * t;
        if (col < p.E) {
          atomicAdd(row + col, dqa[dt][2 * hf]);
          atomicAdd(row + col + 1, dqa[dt][2 * hf + 1]);
        }
      }
    }
    __syncthreads();  // q, dout, dS, lse and D of this tile no longer read
  }
  cp_async_wait_all();  // k, v of a block that saw no query tile (causal, k0 >= L)

  const float scale = float(p.scale);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t s = keys[hf];
    if (s >= p.S) continue;
    T* dkr = dk + b * p.dk_stride[0] + h * p.dk_stride[1] + s * p.dk_stride[2];
    T* dvr = dv + b * p.dv_stride[0] + h * p.dv_stride[1] + s * p.dv_stride[2];
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const int col = 8 * dt + 2 * t;
      if (col < p.E) {
        *reinterpret_cast<uint32_t*>(dkr + col) = pack2<T>(dk_acc[dt][2 * hf] * scale, dk_acc[dt][2 * hf + 1] * scale);
        *reinterpret_cast<uint32_t*>(dvr + col) = pack2<T>(dv_acc[dt][2 * hf], dv_acc[dt][2 * hf + 1]);
      }
    }
  }
}

}  // namespace frugal::ops::cuda::flash
