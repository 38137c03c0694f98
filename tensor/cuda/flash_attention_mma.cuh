#pragma once
// Tensor-core building blocks of the flash attention kernels (tensor/cuda/flash_attention.cu):
// mma.sync m16n8k16 with f32 accumulators, ldmatrix, cp.async and their fragment layouts.
//
// Note [MMA fragments]
// Within a warp, lane = 4 * g + t (g = lane / 4 in 0..7, "group"; t = lane % 4). For
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16} (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   A (16 x 16, row major), four 32-bit registers of two 16-bit elements (low half first):
//     a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, +9]   a[3] = A[g+8][2t+8, +9]
//   B (16 x 8, "col": K x N read along K), two registers:
//     b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C/D (16 x 8, f32), four floats:
//     c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// Consequences the kernels rely on:
//  - A row-major X (16 x k) in shared memory gives A fragments by 32-bit loads of element
//    pairs (X[g][16kk + 2t], ...). B = Y^T for a row-major Y (n x k) likewise:
//    b[0] = Y[g][16kk + 2t, +1], b[1] = Y[g][16kk + 2t + 8, +9] (q k^T, dout v^T).
//  - B = Y for a row-major Y (k x n) (P v, dS k, P^T dout, dS^T q) needs element pairs down a
//    column: ldmatrix .trans delivers them. ldmatrix.x4 loads four 8 x 8 b16 matrices; lanes
//    8i..8i+7 give the row addresses of matrix i, and with .trans lane (g, t) receives of
//    matrix i the elements (rows 2t, 2t+1; column g), i.e. exactly b[0] of an 8 x 8 block of
//    Y. So matrices (rows k0..k0+7, cols n0..), (k0+8.., n0..), (k0.., n0+8..), (k0+8.., n0+8..)
//    give b[0], b[1] of the n-tile at n0 and b[0], b[1] of the n-tile at n0 + 8.
//  - The C fragments of two neighbouring n-tiles (columns 16kk..16kk+15) are, element for
//    element, the A fragment of k-step kk: a[0] = pack(c_2kk[0], c_2kk[1]), a[1] =
//    pack(c_2kk[2], c_2kk[3]), a[2] = pack(c_2kk+1[0], c_2kk+1[1]), a[3] = pack(c_2kk+1[2],
//    c_2kk+1[3]). A score tile computed in registers feeds the next product without shared
//    memory (FlashAttention-2's P v).
// Shared-memory rows are padded by 8 elements (16 bytes): a row of kD + 8 16-bit elements
// is (kD / 2 + 4) words, so the 8 rows one 32-bit fragment load (or one ldmatrix phase)
// touches start 4 banks apart and the 32 lanes hit 32 different banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tensor/half.h"

namespace frugal::ops::cuda::flash {

/// D = A B + D for one m16n8k16 tile (fragments as in Note [MMA fragments]).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<Half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<BFloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as a register of two 16-bit T (lo in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<Half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<BFloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// The 32-bit element pair at p (shared memory).
__device__ __forceinline__ uint32_t lds32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// ldmatrix.x4.trans: lane l gives the address of row l % 8 of matrix l / 8 (16 bytes each).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

/// Asynchronous 16-byte copy global -> shared; src_bytes = 0 writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/// 2^x with the SFU (2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Copies rows [row0, row0 + kRows) x columns [0, kD) of a (n, e) row-major matrix with row
/// stride `stride` into shared memory `dst` (row pitch kD + 8), zero beyond n rows or e
/// columns (e % 8 == 0). All kThreads threads of the block call it; issue only (cp.async).
template <typename T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t stride, int64_t row0, int64_t n, int64_t e) {
  constexpr int kChunksPerRow = kD / 8;
  for (int c = int(threadIdx.x); c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = row0 + r < n && col < e;
    const T* from = valid ? src + (row0 + r) * stride + col : src;
    cp_async_16(dst + r * (kD + 8) + col, from, valid ? 16 : 0);
  }
}

}  // namespace frugal::ops::cuda::flash
