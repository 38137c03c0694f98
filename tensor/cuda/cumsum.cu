// CUDA cumulative sum (Note [Cumulative sum dtypes], Note [Cumulative sum order]).
//
// Every line is summed by one thread per chunk in the order the Note fixes, so CUDA and
// the CPU give the same bits. What differs is how the elements reach that thread:
// - Not along the last dim (inner > 1): thread t takes line (o, i) with o = t / inner and
//   i = t % inner, so neighbouring threads walk neighbouring lines and each of their steps
//   is one coalesced read and write.
// - Along the last dim (inner == 1) a line is a row, and a thread walking its own row
//   would read with stride D across the warp. Instead (given 32 rows or more; fewer take
//   the first kernel, by chunk when long) a warp takes 32 rows and moves
//   them through a 32 x 32 tile in shared memory: it loads the tile row by row (32
//   consecutive elements, one coalesced read), lane r sums row r of the tile onwards from
//   its running total, and the warp stores the tile row by row.
// A reverse sum walks j from D - 1 down to 0; the tile then holds columns in reverse
// order, which keeps each of its reads and writes within one 32-element segment.
//
// Few long lines would leave most of the GPU idle (one line of 10^8 entries: one thread;
// 16384 rows of 4096: 512 warps on 132 SMs), so when there are fewer than kFewLines lines
// longer than a chunk, the work is split by chunk in three kernels: every (line, chunk)
// sums its chunk; one thread per line turns those totals into carries (exclusive running
// sums, in order); every (line, chunk) walks its chunk again from its carry and writes. x is read twice, which is why lines
// enough to fill the GPU take the one-pass kernels.
#include <type_traits>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kTile = 32;             // rows per warp and columns per tile step
constexpr int kWarpsPerBlock = 4;     // tiles of 32 x 33 accumulators per block
constexpr int64_t kFewLines = 65536;  // below this, lines longer than a chunk are split by chunk
static_assert(kCumsumChunk % kTile == 0, "a chunk boundary must fall between tile steps");

// What a walk over chunks does: sum one chunk into totals, or write the outputs.
enum class Walk { Totals, Write };

__device__ __forceinline__ int64_t chunks_of(const CumsumShape& s) { return (s.D + kCumsumChunk - 1) / kCumsumChunk; }

// Line (o, i) of x: (outer, D, inner), chunks [c0, c1), from `carry`. Write: out holds the
// sums; Totals: returns the running total of the last chunk walked (c1 = c0 + 1).
template <Walk kWalk, typename T, typename Out, typename Acc>
__device__ Acc walk_line(const T* __restrict__ x, Out* __restrict__ out, const CumsumShape& s, int64_t o, int64_t i,
                         int64_t c0, int64_t c1, Acc carry) {
  const int64_t begin = c0 * kCumsumChunk, end = c1 * kCumsumChunk < s.D ? c1 * kCumsumChunk : s.D;
  Acc local = Acc(0);
#pragma unroll 8  // loads of later steps in flight while the sum waits
  for (int64_t step = begin; step < end; ++step) {
    if (step > begin && step % kCumsumChunk == 0) carry += local, local = Acc(0);
    const int64_t at = (o * s.D + (s.reverse ? s.D - 1 - step : step)) * s.inner + i;
    local += Acc(x[at]);
    if constexpr (kWalk == Walk::Write) out[at] = Out(carry + local);
  }
  return local;
}

// Thread per line (by_chunk false: the whole line, one pass) or per (line, chunk): item w
// takes line t = w % lines, so neighbouring threads still walk neighbouring lines.
// chunk_sums: where the Totals walk writes each chunk's total, or the Write walk reads its
// carry.
template <Walk kWalk, typename T, typename Out, typename Acc>
__global__ void cumsum_lines_kernel(const T* __restrict__ x, Out* __restrict__ out, Acc* __restrict__ chunk_sums,
                                    CumsumShape s, bool by_chunk) {
  const int64_t lines = s.outer * s.inner, items = by_chunk ? lines * chunks_of(s) : lines;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < items; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = w % lines, c = w / lines, o = t / s.inner, i = t % s.inner;
    if (!by_chunk) {
      walk_line<Walk::Write>(x, out, s, o, i, 0, chunks_of(s), Acc(0));
    } else if constexpr (kWalk == Walk::Totals) {
      chunk_sums[w] = walk_line<Walk::Totals, T, Out, Acc>(x, out, s, o, i, c, c + 1, Acc(0));
    } else {
      walk_line<Walk::Write>(x, out, s, o, i, c, c + 1, chunk_sums[w]);
    }
  }
}

// The rows kernel's work for a warp: rows [row0, row0 + 32) of x: (rows, D), chunks
// [c0, c1), lane r carrying row row0 + r. Write: out gets the sums; Totals: returns lane r's
// running total of the last chunk.
template <Walk kWalk, typename T, typename Out, typename Acc>
__device__ Acc walk_rows(const T* __restrict__ x, Out* __restrict__ out, Acc (&tile)[kTile][kTile + 1],
                         const CumsumShape& s, int64_t row0, int64_t c0, int64_t c1, Acc carry) {
  const int lane = int(threadIdx.x) % kTile;
  const int rows = s.outer - row0 < kTile ? int(s.outer - row0) : kTile;
  const int64_t begin = c0 * kCumsumChunk, end = c1 * kCumsumChunk < s.D ? c1 * kCumsumChunk : s.D;
  Acc local = Acc(0);
  for (int64_t step0 = begin; step0 < end; step0 += kTile) {
    if (step0 > begin && step0 % kCumsumChunk == 0) carry += local, local = Acc(0);
    const int cols = end - step0 < kTile ? int(end - step0) : kTile;
    // Tile column k holds line position step0 + k, at column D - 1 - step0 - k when reverse.
    const int64_t col = s.reverse ? s.D - 1 - step0 - lane : step0 + lane;
#pragma unroll  // 32 independent loads in flight, not one at a time
    for (int r = 0; r < kTile; ++r)
      if (r < rows && lane < cols) tile[r][lane] = Acc(x[(row0 + r) * s.D + col]);
    __syncwarp();
    if (lane < rows) {
      for (int k = 0; k < cols; ++k) {  // unrolled over 32 it ran a quarter slower (bench_ops)
        local += tile[lane][k];
        if constexpr (kWalk == Walk::Write) tile[lane][k] = Acc(Out(carry + local));  // exact when stored below
      }
    }
    __syncwarp();
    if constexpr (kWalk == Walk::Write) {
#pragma unroll
      for (int r = 0; r < kTile; ++r)
        if (r < rows && lane < cols) out[(row0 + r) * s.D + col] = Out(tile[r][lane]);
      __syncwarp();
    }
  }
  return local;
}

// A warp per 32 rows (by_chunk false: whole rows, one pass) or per (32 rows, chunk): warp
// item w takes row group w % groups and chunk w / groups. chunk_sums[c * rows + row].
template <Walk kWalk, typename T, typename Out, typename Acc>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, Out* __restrict__ out, Acc* __restrict__ chunk_sums,
                                   CumsumShape s, bool by_chunk) {
  __shared__ Acc tiles[kWarpsPerBlock][kTile][kTile + 1];  // + 1: lane r's row walk hits 32 banks
  const int warp = int(threadIdx.x) / kTile, lane = int(threadIdx.x) % kTile;
  const int64_t groups = (s.outer + kTile - 1) / kTile, items = by_chunk ? groups * chunks_of(s) : groups;
  const int64_t w = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (w >= items) return;  // the whole warp: w is uniform across it
  const int64_t row0 = (w % groups) * kTile, c = w / groups, row = row0 + lane;
  if (!by_chunk) {
    walk_rows<Walk::Write>(x, out, tiles[warp], s, row0, 0, chunks_of(s), Acc(0));
  } else if constexpr (kWalk == Walk::Totals) {
    const Acc total = walk_rows<Walk::Totals, T, Out, Acc>(x, out, tiles[warp], s, row0, c, c + 1, Acc(0));
    if (row < s.outer) chunk_sums[c * s.outer + row] = total;
  } else {
    const Acc carry = row < s.outer ? chunk_sums[c * s.outer + row] : Acc(0);
    walk_rows<Walk::Write>(x, out, tiles[warp], s, row0, c, c + 1, carry);
  }
}

// carries[c * lines + t]: the sum of the totals of chunks 0..c-1 of line t, in order.
template <typename Acc>
__global__ void chunk_carries_kernel(const Acc* __restrict__ totals, Acc* __restrict__ carries, int64_t lines,
                                     int64_t chunks) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lines; t += int64_t(gridDim.x) * blockDim.x) {
    Acc carry = Acc(0);
#pragma unroll 16  // one line of 10^8 entries has 10^5 chunks: keep their loads in flight
    for (int64_t c = 0; c < chunks; ++c) {
      carries[c * lines + t] = carry;
      carry += totals[c * lines + t];
    }
  }
}

}  // namespace

void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s) {
  dispatch_all(x.dtype(), "cumsum", x.device(), [&]<typename T>() {
    using Out = CumsumOut<T>;
    using Acc = CumsumAcc<T>;
    DeviceGuard guard(x.device());
    cudaStream_t stream = stream_for(x);
    const T* xp = x.data_ptr<T>();
    Out* op = out.data_ptr<Out>();
    const int64_t lines = s.outer * s.inner, chunks = (s.D + kCumsumChunk - 1) / kCumsumChunk;
    const bool by_chunk = chunks > 1 && lines < kFewLines;
    // by chunk: the chunks' totals, then their carries (Note [Cumulative sum order])
    const Tensor aux = by_chunk ? empty({2, lines * chunks}, {dtype_of<Acc>(), x.device()}) : Tensor();
    Acc* tp = by_chunk ? static_cast<Acc*>(aux.data()) : nullptr;
    Acc* cp = by_chunk ? tp + lines * chunks : nullptr;
    if (s.inner == 1 && s.outer >= kTile) {  // fewer rows would leave most of a warp's lanes idle
      const int64_t groups = (s.outer + kTile - 1) / kTile, items = by_chunk ? groups * chunks : groups;
      const unsigned blocks = unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
      constexpr int threads = kTile * kWarpsPerBlock;
      if (by_chunk) {
        cumsum_rows_kernel<Walk::Totals, T, Out, Acc><<<blocks, threads, 0, stream>>>(xp, op, tp, s, true);
        chunk_carries_kernel<Acc><<<grid_for(lines), kBlockSize, 0, stream>>>(tp, cp, lines, chunks);
      }
      cumsum_rows_kernel<Walk::Write, T, Out, Acc><<<blocks, threads, 0, stream>>>(xp, op, cp, s, by_chunk);
    } else {
      const unsigned grid = grid_for(by_chunk ? lines * chunks : lines);
      if (by_chunk) {
        cumsum_lines_kernel<Walk::Totals, T, Out, Acc><<<grid, kBlockSize, 0, stream>>>(xp, op, tp, s, true);
        chunk_carries_kernel<Acc><<<grid_for(lines), kBlockSize, 0, stream>>>(tp, cp, lines, chunks);
      }
      cumsum_lines_kernel<Walk::Write, T, Out, Acc><<<grid, kBlockSize, 0, stream>>>(xp, op, cp, s, by_chunk);
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
