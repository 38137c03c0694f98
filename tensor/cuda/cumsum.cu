// CUDA scans: cumulative sums, products, extremes and log-sum-exps (Note [Cumulative sum dtypes], Note [Cumulative sum order]).
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
// longer than a chunk, the work is split by chunk: every (line, chunk) sums its chunk; every
// (line, span) turns its chunks' totals into carries within the span and its span's total;
// a block per line turns span totals into span carries (only when a line has more than one
// span); every (line, chunk) walks its chunk again from span carry + chunk carry and writes.
// Fewer than 32 rows split so (one long line) take their chunks through the tiles as the
// rows kernel takes rows, 32 chunks a warp, so the reads coalesce there too. x is read
// twice, which is why lines enough to fill the GPU take the one-pass kernels.
#include <algorithm>
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

// The carry chunk c of line t starts from (Note [Cumulative sum order]): span carry + chunk
// carry, laid out [c * lines + t] and [span * lines + t]; span_carries is null when every
// line has one span (its span carry is 0, and 0 + chunk carry is the chunk carry).
template <typename Op, typename Acc>
__device__ __forceinline__ Acc carry_of(const Acc* __restrict__ chunk_carries, const Acc* __restrict__ span_carries,
                                        int64_t c, int64_t t, int64_t lines) {
  const Acc chunk = chunk_carries[c * lines + t];
  return span_carries ? Op::apply(span_carries[(c / kCumsumSpan) * lines + t], chunk) : chunk;
}

// Line (o, i) of x: (outer, D, inner), chunks [c0, c1), from `carry`. Write: out holds the
// sums; Totals: returns the running total of the last chunk walked (c1 = c0 + 1).
template <Walk kWalk, typename Op, typename T, typename Out, typename Acc>
__device__ Acc walk_line(const T* __restrict__ x, Out* __restrict__ out, const CumsumShape& s, int64_t o, int64_t i,
                         int64_t c0, int64_t c1, Acc carry) {
  const int64_t begin = c0 * kCumsumChunk, end = c1 * kCumsumChunk < s.D ? c1 * kCumsumChunk : s.D;
  Acc local = Op::identity();
#pragma unroll 8  // loads of later steps in flight while the sum waits
  for (int64_t step = begin; step < end; ++step) {
    if (step > begin && step % kCumsumChunk == 0) carry = Op::apply(carry, local), local = Op::identity();
    const int64_t at = (o * s.D + (s.reverse ? s.D - 1 - step : step)) * s.inner + i;
    local = Op::apply(local, Acc(x[at]));
    if constexpr (kWalk == Walk::Write) out[at] = Out(Op::apply(carry, local));
  }
  return local;
}

// Thread per line (by_chunk false: the whole line, one pass) or per (line, chunk): item w
// takes line t = w % lines, so neighbouring threads still walk neighbouring lines.
// chunk_sums: where the Totals walk writes each chunk's total, or the Write walk reads its
// chunk carry (and span_carries its span carry, see carry_of).
template <Walk kWalk, typename Op, typename T, typename Out, typename Acc>
__global__ void cumsum_lines_kernel(const T* __restrict__ x, Out* __restrict__ out, Acc* __restrict__ chunk_sums,
                                    const Acc* __restrict__ span_carries, CumsumShape s, bool by_chunk) {
  const int64_t lines = s.outer * s.inner, items = by_chunk ? lines * chunks_of(s) : lines;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < items; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = w % lines, c = w / lines, o = t / s.inner, i = t % s.inner;
    if (!by_chunk) {
      walk_line<Walk::Write, Op>(x, out, s, o, i, 0, chunks_of(s), Op::identity());
    } else if constexpr (kWalk == Walk::Totals) {
      chunk_sums[w] = walk_line<Walk::Totals, Op, T, Out, Acc>(x, out, s, o, i, c, c + 1, Op::identity());
    } else {
      walk_line<Walk::Write, Op>(x, out, s, o, i, c, c + 1, carry_of<Op>(chunk_sums, span_carries, c, t, lines));
    }
  }
}

// The rows kernel's work for a warp: rows [row0, row0 + 32) of x: (rows, D), chunks
// [c0, c1), lane r carrying row row0 + r. Write: out gets the sums; Totals: returns lane r's
// running total of the last chunk.
template <Walk kWalk, typename Op, typename T, typename Out, typename Acc>
__device__ Acc walk_rows(const T* __restrict__ x, Out* __restrict__ out, Acc (&tile)[kTile][kTile + 1],
                         const CumsumShape& s, int64_t row0, int64_t c0, int64_t c1, Acc carry) {
  const int lane = int(threadIdx.x) % kTile;
  const int rows = s.outer - row0 < kTile ? int(s.outer - row0) : kTile;
  const int64_t begin = c0 * kCumsumChunk, end = c1 * kCumsumChunk < s.D ? c1 * kCumsumChunk : s.D;
  Acc local = Op::identity();
  for (int64_t step0 = begin; step0 < end; step0 += kTile) {
    if (step0 > begin && step0 % kCumsumChunk == 0) carry = Op::apply(carry, local), local = Op::identity();
    const int cols = end - step0 < kTile ? int(end - step0) : kTile;
    // Tile column k holds line position step0 + k, at column D - 1 - step0 - k when reverse.
    const int64_t col = s.reverse ? s.D - 1 - step0 - lane : step0 + lane;
    T v[kTile] = {};  // all 32 loads in flight before the first is stored (ncu: serialized loads, 12% of DRAM)
#pragma unroll
    for (int r = 0; r < kTile; ++r)
      if (r < rows && lane < cols) v[r] = x[(row0 + r) * s.D + col];
#pragma unroll
    for (int r = 0; r < kTile; ++r) tile[r][lane] = Acc(v[r]);
    __syncwarp();
    if (lane < rows) {
      for (int k = 0; k < cols; ++k) {  // unrolled over 32 it ran a quarter slower (bench_ops)
        local = Op::apply(local, tile[lane][k]);
        if constexpr (kWalk == Walk::Write) tile[lane][k] = Acc(Out(Op::apply(carry, local)));  // exact when stored below
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
// item w takes row group w % groups and chunk w / groups. chunk_sums[c * rows + row], as
// cumsum_lines_kernel's.
template <Walk kWalk, typename Op, typename T, typename Out, typename Acc>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, Out* __restrict__ out, Acc* __restrict__ chunk_sums,
                                   const Acc* __restrict__ span_carries, CumsumShape s, bool by_chunk) {
  __shared__ Acc tiles[kWarpsPerBlock][kTile][kTile + 1];  // + 1: lane r's row walk hits 32 banks
  const int warp = int(threadIdx.x) / kTile, lane = int(threadIdx.x) % kTile;
  const int64_t groups = (s.outer + kTile - 1) / kTile, items = by_chunk ? groups * chunks_of(s) : groups;
  const int64_t w = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (w >= items) return;  // the whole warp: w is uniform across it
  const int64_t row0 = (w % groups) * kTile, c = w / groups, row = row0 + lane;
  if (!by_chunk) {
    walk_rows<Walk::Write, Op>(x, out, tiles[warp], s, row0, 0, chunks_of(s), Op::identity());
  } else if constexpr (kWalk == Walk::Totals) {
    const Acc total = walk_rows<Walk::Totals, Op, T, Out, Acc>(x, out, tiles[warp], s, row0, c, c + 1, Op::identity());
    if (row < s.outer) chunk_sums[c * s.outer + row] = total;
  } else {
    const Acc carry = row < s.outer ? carry_of<Op>(chunk_sums, span_carries, c, row, s.outer) : Op::identity();
    walk_rows<Walk::Write, Op>(x, out, tiles[warp], s, row0, c, c + 1, carry);
  }
}

// The 32 elements p[r * kStride], r < 32, into v; and tile column `lane` out to them.
template <int64_t kStride, typename T>
__device__ __forceinline__ void gather(const T* __restrict__ p, T (&v)[kTile]) {
#pragma unroll
  for (int r = 0; r < kTile; ++r) v[r] = p[r * kStride];
}
template <int64_t kStride, typename Out, typename Acc>
__device__ __forceinline__ void scatter(Out* __restrict__ p, const Acc (&tile)[kTile][kTile + 1], int lane) {
#pragma unroll
  for (int r = 0; r < kTile; ++r) p[r * kStride] = Out(tile[r][lane]);
}

// Few rows split by chunk (x: (outer, D), inner == 1, outer < 32): a warp takes 32
// consecutive (row, chunk) items, item k being chunk k % chunks of row k / chunks, and moves
// them through its 32 x 32 tile as walk_rows moves rows, so each tile row is one coalesced
// read of 32 consecutive elements of a chunk (a thread walking its own chunk would read with
// a stride of a chunk across the warp). Lane r sums item r in order, from its carry when
// writing. chunk_sums and span_carries as cumsum_lines_kernel's.
template <Walk kWalk, typename Op, typename T, typename Out, typename Acc>
__global__ void cumsum_chunk_tiles_kernel(const T* __restrict__ x, Out* __restrict__ out, Acc* __restrict__ chunk_sums,
                                          const Acc* __restrict__ span_carries, CumsumShape s) {
  __shared__ Acc tiles[kWarpsPerBlock][kTile][kTile + 1];
  const int warp = int(threadIdx.x) / kTile, lane = int(threadIdx.x) % kTile;
  const int64_t chunks = chunks_of(s), items = s.outer * chunks;
  const int64_t k0 = (int64_t(blockIdx.x) * kWarpsPerBlock + warp) * kTile;
  if (k0 >= items) return;  // the whole warp: k0 is uniform across it
  Acc(&tile)[kTile][kTile + 1] = tiles[warp];
  const int n = items - k0 < kTile ? int(items - k0) : kTile;
  // Lane r's item: its row's offset and its chunk's [begin, end) positions along the row.
  const int64_t k = k0 + (lane < n ? lane : 0), o = k / chunks, c = k % chunks;
  const int64_t row = o * s.D, begin = c * kCumsumChunk, end = begin + kCumsumChunk < s.D ? begin + kCumsumChunk : s.D;
  const auto at = [&](int64_t item_row, int64_t pos) { return item_row + (s.reverse ? s.D - 1 - pos : pos); };
  // The common case, 32 full chunks of one row: chunk r of the warp starts kCumsumChunk after
  // chunk r - 1 (before it when reverse), so a tile row's 32 addresses are one base plus
  // constant offsets, with no shuffles and no bounds (ncu: those were most of the general
  // path's instructions, which set its pace).
  const int64_t o0 = k0 / chunks, c0 = k0 % chunks;
  const bool full = n == kTile && c0 + kTile <= chunks && (c0 + kTile) * kCumsumChunk <= s.D;
  Acc local = Op::identity(), carry = Op::identity();
  if constexpr (kWalk == Walk::Write) {
    if (lane < n) carry = carry_of<Op>(chunk_sums, span_carries, c, o, s.outer);
  }
  for (int64_t step0 = 0; step0 < kCumsumChunk; step0 += kTile) {
    T v[kTile] = {};  // all 32 loads in flight before the first is stored, as in walk_rows
    const int64_t base = at(o0 * s.D, c0 * kCumsumChunk + step0 + lane);  // the fast path's tile row 0
    if (full && !s.reverse) {
      gather<kCumsumChunk>(x + base, v);
    } else if (full) {
      gather<-kCumsumChunk>(x + base, v);
    } else {
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        const int64_t row_r = __shfl_sync(0xffffffffu, row, r), pos = __shfl_sync(0xffffffffu, begin, r) + step0 + lane;
        if (r < n && pos < __shfl_sync(0xffffffffu, end, r)) v[r] = x[at(row_r, pos)];
      }
    }
#pragma unroll
    for (int r = 0; r < kTile; ++r) tile[r][lane] = Acc(v[r]);
    __syncwarp();
    if (lane < n) {
      const int64_t left = end - begin - step0;
      const int cols = left < kTile ? int(left > 0 ? left : 0) : kTile;
      for (int j = 0; j < cols; ++j) {
        local = Op::apply(local, tile[lane][j]);
        if constexpr (kWalk == Walk::Write) tile[lane][j] = Acc(Out(Op::apply(carry, local)));  // exact when stored below
      }
    }
    __syncwarp();
    if constexpr (kWalk == Walk::Write) {
      if (full && !s.reverse) {
        scatter<kCumsumChunk>(out + base, tile, lane);
      } else if (full) {
        scatter<-kCumsumChunk>(out + base, tile, lane);
      } else {
#pragma unroll
        for (int r = 0; r < kTile; ++r) {
          const int64_t row_r = __shfl_sync(0xffffffffu, row, r),
                        pos = __shfl_sync(0xffffffffu, begin, r) + step0 + lane;
          if (r < n && pos < __shfl_sync(0xffffffffu, end, r)) out[at(row_r, pos)] = Out(tile[r][lane]);
        }
      }
      __syncwarp();
    }
  }
  if constexpr (kWalk == Walk::Totals) {
    if (lane < n) chunk_sums[c * s.outer + o] = local;
  }
}

// sums[c * lines + t]: chunk c's total in, its chunk carry out (the totals of the chunks
// before it in its span, added in order); span_sums[span * lines + t]: the span's total
// (its chunks' totals added in order). A thread per (line, span).
template <typename Op, typename Acc>
__global__ void span_carries_kernel(Acc* __restrict__ sums, Acc* __restrict__ span_sums, int64_t lines,
                                    int64_t chunks) {
  const int64_t spans = (chunks + kCumsumSpan - 1) / kCumsumSpan;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < lines * spans;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = w % lines, span = w / lines, c0 = span * kCumsumSpan;
    const int64_t c1 = c0 + kCumsumSpan < chunks ? c0 + kCumsumSpan : chunks;
    Acc totals[kCumsumSpan];  // every load in flight before the first store, which could alias them
#pragma unroll
    for (int64_t k = 0; k < kCumsumSpan; ++k)
      if (c0 + k < c1) totals[k] = sums[(c0 + k) * lines + t];
    Acc carry = Op::identity();
#pragma unroll
    for (int64_t k = 0; k < kCumsumSpan; ++k) {
      if (c0 + k < c1) {
        sums[(c0 + k) * lines + t] = carry;
        carry = Op::apply(carry, totals[k]);
      }
    }
    span_sums[span * lines + t] = carry;
  }
}

// span_sums[span * lines + t]: span totals in, span carries out (the totals of the spans
// before it, added in order). A block per line loads up to kPiece span totals at once into
// shared memory (a warp loading 32 at a time waited on each load: 58 us for 2048 spans);
// its first warp adds them in order, 32 at a time, every lane adding all 32 (shuffled to it)
// and keeping the carry before its own; the block stores the carries.
template <typename Op, typename Acc>
__global__ void line_carries_kernel(Acc* __restrict__ span_sums, int64_t lines, int64_t spans) {
  constexpr int kPiece = 2048;
  __shared__ Acc piece[kPiece];
  const int lane = int(threadIdx.x) % kTile;
  for (int64_t t = blockIdx.x; t < lines; t += gridDim.x) {
    Acc carry = Op::identity();  // warp 0's, across pieces
    for (int64_t b0 = 0; b0 < spans; b0 += kPiece) {
      const int m = spans - b0 < kPiece ? int(spans - b0) : kPiece;
      for (int k = int(threadIdx.x); k < m; k += int(blockDim.x)) piece[k] = span_sums[(b0 + k) * lines + t];
      __syncthreads();
      if (threadIdx.x < kTile) {
        for (int b = 0; b < m; b += kTile) {
          const Acc total = b + lane < m ? piece[b + lane] : Op::identity();
          const int n = m - b < kTile ? m - b : kTile;
          Acc mine = Op::identity();
#pragma unroll  // the shuffles do not wait on the carry: all 32 in flight
          for (int j = 0; j < kTile; ++j) {
            const Acc v = __shfl_sync(0xffffffffu, total, j);
            if (j < n) {  // n is the same across the warp
              if (lane == j) mine = carry;
              carry = Op::apply(carry, v);
            }
          }
          if (b + lane < m) piece[b + lane] = mine;
        }
      }
      __syncthreads();
      for (int k = int(threadIdx.x); k < m; k += int(blockDim.x)) span_sums[(b0 + k) * lines + t] = piece[k];
      __syncthreads();
    }
  }
}

}  // namespace

void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s) {
  with_cumulative(s.op, [&]<Cumulative kOp>() {
    const auto scan = [&]<typename T>() {
      using Out = CumsumOut<T>;
      using Acc = CumsumAcc<T>;
      using Op = CumulativeCombine<kOp, Acc>;
      DeviceGuard guard(x.device());
      cudaStream_t stream = stream_for(x);
      const T* xp = x.data_ptr<T>();
      Out* op = out.data_ptr<Out>();
      const int64_t lines = s.outer * s.inner, chunks = (s.D + kCumsumChunk - 1) / kCumsumChunk;
      const int64_t spans = (chunks + kCumsumSpan - 1) / kCumsumSpan;
      const bool by_chunk = chunks > 1 && lines < kFewLines;
      // by chunk: the chunks' totals, turned into chunk carries in place, then the spans'
      // totals, turned into span carries in place (Note [Cumulative sum order])
      const Tensor aux = by_chunk ? empty({lines * (chunks + spans)}, {dtype_of<Acc>(), x.device()}) : Tensor();
      Acc* cp = by_chunk ? static_cast<Acc*>(aux.data()) : nullptr;
      Acc* sp = by_chunk ? cp + lines * chunks : nullptr;
      const Acc* span_carries = spans > 1 ? sp : nullptr;
      const auto carries = [&] {
        span_carries_kernel<Op, Acc><<<grid_for(lines * spans), kBlockSize, 0, stream>>>(cp, sp, lines, chunks);
        if (spans > 1)
          line_carries_kernel<Op, Acc>
              <<<unsigned(std::min<int64_t>(lines, 65535)), kBlockSize, 0, stream>>>(sp, lines, spans);
      };
      constexpr int tile_threads = kTile * kWarpsPerBlock;
      if (s.inner == 1 && s.outer >= kTile) {  // fewer rows would leave most of a warp's lanes idle
        const int64_t groups = (s.outer + kTile - 1) / kTile, items = by_chunk ? groups * chunks : groups;
        const unsigned blocks = unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
        if (by_chunk) {
          cumsum_rows_kernel<Walk::Totals, Op, T, Out, Acc>
              <<<blocks, tile_threads, 0, stream>>>(xp, op, cp, nullptr, s, true);
          carries();
        }
        cumsum_rows_kernel<Walk::Write, Op, T, Out, Acc>
            <<<blocks, tile_threads, 0, stream>>>(xp, op, cp, span_carries, s, by_chunk);
      } else if (s.inner == 1 && by_chunk) {  // few rows: their chunks through tiles
        const int64_t warps = (lines * chunks + kTile - 1) / kTile;
        const unsigned blocks = unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
        cumsum_chunk_tiles_kernel<Walk::Totals, Op, T, Out, Acc>
            <<<blocks, tile_threads, 0, stream>>>(xp, op, cp, nullptr, s);
        carries();
        cumsum_chunk_tiles_kernel<Walk::Write, Op, T, Out, Acc>
            <<<blocks, tile_threads, 0, stream>>>(xp, op, cp, span_carries, s);
      } else {
        const unsigned grid = grid_for(by_chunk ? lines * chunks : lines);
        if (by_chunk) {
          cumsum_lines_kernel<Walk::Totals, Op, T, Out, Acc>
              <<<grid, kBlockSize, 0, stream>>>(xp, op, cp, nullptr, s, true);
          carries();
        }
        cumsum_lines_kernel<Walk::Write, Op, T, Out, Acc>
            <<<grid, kBlockSize, 0, stream>>>(xp, op, cp, span_carries, s, by_chunk);
      }
      FRUGAL_CUDA_CHECK_LAUNCH();
    };
    if constexpr (kOp == Cumulative::LogAddExp) dispatch_floating(x.dtype(), cumulative_name(kOp), x.device(), scan);
    else dispatch_all(x.dtype(), cumulative_name(kOp), x.device(), scan);
  });
}

}  // namespace frugal::ops::cuda
