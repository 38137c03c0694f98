// Note [bfloat16 GEMM]
// Without a kernel of its own, a bfloat16 product on the CPU converted both operands to float32
// and ran the float32 GEMM: as fast as float32 at best, where PyTorch (oneDNN) runs bfloat16
// 2.5x faster than that on a CPU with AVX512-BF16 (1024^3 on one core of the development
// machine's EPYC: 23 ms against 9). That extension's VDPBF16PS multiplies 16 pairs of
// bfloat16 per 32-bit lane and adds both products into float32 lanes: twice the multiply-adds
// of a float32 FMA per instruction, on operands half the size. This file is a GotoBLAS-style
// GEMM on it:
//   - B's block of KC pairs of rows by NC columns is packed into slivers of NR = 32 columns,
//     each row pair of a sliver one 64-byte vector of (b[2p][j], b[2p+1][j]) words; A's block
//     of MC rows into slivers of MR = 12 rows, each pair (a[i][2p], a[i][2p+1]) one word that
//     the micro-kernel broadcasts. An odd K pads the last pair with a zero, tails of M and N
//     pad the slivers with zero rows and columns (computed, never stored).
//   - The micro-kernel keeps a 12 x 32 tile of out in 24 zmm accumulators over KC pairs; a
//     later K block adds to what the earlier ones stored.
// The packing reads any strides, so transposed and sliced views cost no copy.
//
// Rounding: each product of two bfloat16 is exact in float32, and the instruction adds the pair
// to the accumulator one after the other, rounding each time (as two FMAs): within float32's
// rounding of the float64 sum, as the float32 path. Unlike it, the instruction treats
// subnormal inputs and results as zero (|x| < 2^-126 ~ 1.2e-38), as oneDNN's bfloat16 GEMM in
// PyTorch. The order of the additions depends on the shapes alone (the blocks), so the bits do
// not depend on the thread count (Note [CPU determinism]).
#include "tensor/cpu/gemm_bf16_kernel.h"  // first, and free of other headers' inline code

#include <immintrin.h>

#include <cstring>

#ifndef __AVX512BF16__
#error "gemm_bf16_kernel.cpp is built with -march=x86-64-v4 -mavx512bf16 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::v4 {

namespace {

constexpr int kMR = 12;                // rows of a micro-tile
constexpr int kVectors = 2;            // zmm vectors across a micro-tile's row
constexpr int kNR = 16 * kVectors;     // columns of a micro-tile
constexpr int64_t kKC = 256;           // pairs of K per block: a B sliver (32 KB) stays in L1
constexpr int64_t kMC = 12 * kMR;      // rows of an A block (144 x 256 pairs: 144 KB, in L2)
constexpr int64_t kNC = 1024;          // columns of a B block (1 MB), a multiple of kNR
constexpr int64_t kPackA = kMC * kKC;  // words
constexpr int64_t kPackB = kKC * kNC;

constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

/// A's rows [i0, i0 + mc) and pairs [p0, p0 + kp) into slivers of kMR rows: word (s, p, r) at
/// dst[s * kp * kMR + p * kMR + r].
void pack_a(uint32_t* dst, const Bf16Matrix& a, int64_t i0, int64_t mc, int64_t p0, int64_t kp) {
  const int64_t rs = a.row_stride, cs = a.col_stride, k0 = 2 * p0;
  const int64_t full = min64(kp, (a.cols - k0) / 2);  // pairs with both halves in A
  for (int64_t s = 0; s < mc; s += kMR) {
    const int64_t rows = min64(kMR, mc - s);
    uint32_t* d = dst + s * kp;
    if (rows < kMR) std::memset(d, 0, size_t(kp * kMR) * sizeof(uint32_t));
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* row = a.data + (i0 + s + r) * rs + k0 * cs;
      for (int64_t p = 0; p < full; ++p) d[p * kMR + r] = pair(row[2 * p * cs], row[(2 * p + 1) * cs]);
      if (full < kp) d[full * kMR + r] = pair(row[2 * full * cs], 0);  // odd K: the last pair's high half
    }
  }
}

/// B's pairs [p0, p0 + kp) and columns [j0, j0 + nc) into slivers of kNR columns: word
/// (s, p, c) at dst[s * kp * kNR + p * kNR + c].
void pack_b(uint32_t* dst, const Bf16Matrix& b, int64_t p0, int64_t kp, int64_t j0, int64_t nc) {
  const int64_t rs = b.row_stride, cs = b.col_stride, k0 = 2 * p0;
  const int64_t full = min64(kp, (b.rows - k0) / 2);
  for (int64_t s = 0; s < nc; s += kNR) {
    const int64_t cols = min64(kNR, nc - s);
    uint32_t* d = dst + s * kp;
    if (cols < kNR) std::memset(d, 0, size_t(kp * kNR) * sizeof(uint32_t));
    const uint16_t* base = b.data + k0 * rs + (j0 + s) * cs;
    if (cs == 1) {  // rows contiguous: interleave two rows at a time
      for (int64_t p = 0; p < full; ++p) {
        const uint16_t *lo = base + 2 * p * rs, *hi = lo + rs;
        for (int64_t c = 0; c < cols; ++c) d[p * kNR + c] = pair(lo[c], hi[c]);
      }
      if (full < kp)
        for (int64_t c = 0; c < cols; ++c) d[full * kNR + c] = pair(base[2 * full * rs + c], 0);
    } else {  // a column at a time (a transposed operand: its pairs are adjacent)
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t* col = base + c * cs;
        for (int64_t p = 0; p < full; ++p) d[p * kNR + c] = pair(col[2 * p * rs], col[(2 * p + 1) * rs]);
        if (full < kp) d[full * kNR + c] = pair(col[2 * full * rs], 0);
      }
    }
  }
}

/// The (rows, cols) <= (kMR, kNR) tile at c, = (or += when `load`) the product of an A sliver
/// and a B sliver over kp pairs.
void micro_tile(const uint32_t* ap, const uint32_t* bp, int64_t kp, float* c, int64_t ldc, int rows, int cols,
                bool load) {
  __m512 acc[kMR][kVectors];
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[kVectors];
    for (int v = 0; v < kVectors; ++v) bv[v] = (__m512bh)_mm512_load_si512(bp + p * kNR + 16 * v);
    for (int r = 0; r < kMR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[p * kMR + r]));
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    for (int v = 0; v < kVectors && cols > 16 * v; ++v) {
      const int left = cols - 16 * v;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      __m512 x = acc[r][v];
      if (load) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, row + 16 * v));
      _mm512_mask_storeu_ps(row + 16 * v, m, x);
    }
  }
}

}  // namespace

int64_t gemm_bf16_workspace_bytes() { return (kPackA + kPackB) * int64_t(sizeof(uint32_t)); }

void gemm_bf16(const Bf16Matrix& a, const Bf16Matrix& b, float* out, int64_t ldc, bool accumulate, void* workspace) {
  const int64_t M = a.rows, N = b.cols, K = a.cols, pairs = (K + 1) / 2;
  if (M == 0 || N == 0) return;
  if (pairs == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::memset(out + i * ldc, 0, size_t(N) * sizeof(float));
    return;
  }
  uint32_t* packed_b = static_cast<uint32_t*>(workspace);
  uint32_t* packed_a = packed_b + kPackB;
  for (int64_t j0 = 0; j0 < N; j0 += kNC) {
    const int64_t nc = min64(kNC, N - j0);
    for (int64_t p0 = 0; p0 < pairs; p0 += kKC) {
      const int64_t kp = min64(kKC, pairs - p0);
      pack_b(packed_b, b, p0, kp, j0, nc);
      const bool load = accumulate || p0 > 0;
      for (int64_t i0 = 0; i0 < M; i0 += kMC) {
        const int64_t mc = min64(kMC, M - i0);
        pack_a(packed_a, a, i0, mc, p0, kp);
        for (int64_t js = 0; js < nc; js += kNR)
          for (int64_t is = 0; is < mc; is += kMR)
            micro_tile(packed_a + is * kp, packed_b + js * kp, kp, out + (i0 + is) * ldc + j0 + js, ldc,
                       int(min64(kMR, mc - is)), int(min64(kNR, nc - js)), load);
      }
    }
  }
}

}  // namespace frugal::ops::cpu::v4
