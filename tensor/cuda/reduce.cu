// CUDA reductions over the (outer, R, inner) view of Note [Reduction geometry].
//
// Note [CUDA reduction kernels]
// Rows (inner == 1): a warp per row when rows are short, a 256-thread block per row
// when they are long; each thread folds a strided slice, then warp shuffles and
// shared memory merge (tensor/cuda/block_reduce.cuh). Columns (inner > 1): a block of
// 32 x 16 threads takes 32 consecutive inner outputs (coalesced reads), its 16 rows
// of threads split R, and shared memory merges them. When that leaves the GPU idle
// (few, long reductions: a full sum, a bias gradient), R is also split across
// blocks: a first pass writes partial accumulators to an arena workspace and a
// second pass merges them with the reducer's combine (PartialReducer/MergeReducer).
// Half types accumulate in float, f64 in double, integers in int64 (Note [Half types
// compute in f32]); the tree order is fixed, so results are deterministic.
#include <algorithm>
#include <limits>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/reduce.h"
#include "tensor/reduction.h"

namespace frugal::ops::cuda {

using reduction::Geometry;

namespace {

constexpr int kRowBlock = 256;              // threads per block of the row kernel
constexpr int kColX = 32, kColY = 16;       // column kernel block: inner x R-split
constexpr int64_t kMinRowChunk = 4096;      // elements of R per block worth a split (rows)
constexpr int64_t kMinColChunk = 256;       // rows of R per block worth a split (columns)

/// First pass of a split reduction: stores the raw accumulator.
template <typename Red>
struct PartialReducer {
  using in_t = typename Red::in_t;
  using acc_t = typename Red::acc_t;
  Red red;
  acc_t* partial;
  __device__ acc_t identity() const { return red.identity(); }
  __device__ acc_t step(acc_t a, in_t v, int64_t r) const { return red.step(a, v, r); }
  __device__ acc_t combine(acc_t a, acc_t b) const { return red.combine(a, b); }
  __device__ void store(int64_t o, acc_t a) const { partial[o] = a; }
};

/// Second pass: folds the partial accumulators and stores the result.
template <typename Red>
struct MergeReducer {
  using in_t = typename Red::acc_t;
  using acc_t = typename Red::acc_t;
  Red red;
  __device__ acc_t identity() const { return red.identity(); }
  __device__ acc_t step(acc_t a, acc_t v, int64_t) const { return red.combine(a, v); }
  __device__ acc_t combine(acc_t a, acc_t b) const { return red.combine(a, b); }
  __device__ void store(int64_t o, acc_t a) const { red.store(o, a); }
};

// x: (outer, R) with strides (so, sr), each row cut into `splits` chunks; output item
// o * splits + s. kThreads threads (32: a warp, or kRowBlock: the block) per item.
template <typename Red, int kThreads>
__global__ void __launch_bounds__(kRowBlock)
    reduce_rows_kernel(Red red, const typename Red::in_t* __restrict__ x, Geometry g, int64_t splits) {
  using A = typename Red::acc_t;
  constexpr int kItemsPerBlock = kRowBlock / kThreads;
  const auto combine = [&](A a, A b) { return red.combine(a, b); };
  const int lane = int(threadIdx.x % kThreads);
  const int64_t items = g.outer * splits, chunk = (g.R + splits - 1) / splits;
  for (int64_t item = int64_t(blockIdx.x) * kItemsPerBlock + threadIdx.x / kThreads; item < items;
       item += int64_t(gridDim.x) * kItemsPerBlock) {
    const int64_t o = item / splits, r0 = item % splits * chunk, r1 = r0 + chunk < g.R ? r0 + chunk : g.R;
    const typename Red::in_t* row = x + o * g.so;
    A a = red.identity();
    for (int64_t r = r0 + lane; r < r1; r += kThreads) a = red.step(a, row[r * g.sr], r);
    if constexpr (kThreads == 32) a = warp_allreduce(a, combine);
    else a = block_allreduce(a, combine, red.identity());
    if (lane == 0) red.store(item, a);
  }
}

// x: (outer, R, inner) with strides (so, sr, si); R cut into `splits` chunks; output
// item (o * splits + s) * inner + i. A tile is 32 consecutive i of one (o, s).
template <typename Red>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_columns_kernel(Red red, const typename Red::in_t* __restrict__ x, Geometry g, int64_t splits) {
  using A = typename Red::acc_t;
  __shared__ alignas(16) unsigned char raw[kColX * kColY * sizeof(A)];
  A* partial = reinterpret_cast<A*>(raw);
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t tiles_per_outer = (g.inner + kColX - 1) / kColX;
  const int64_t tiles = g.outer * tiles_per_outer * splits, chunk = (g.R + splits - 1) / splits;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t s = tile % splits, t = tile / splits;
    const int64_t o = t / tiles_per_outer, i = t % tiles_per_outer * kColX + tx;
    const int64_t r0 = s * chunk, r1 = r0 + chunk < g.R ? r0 + chunk : g.R;
    A a = red.identity();
    if (i < g.inner) {
      const typename Red::in_t* col = x + o * g.so + i * g.si;
      for (int64_t r = r0 + ty; r < r1; r += kColY) a = red.step(a, col[r * g.sr], r);
    }
    partial[ty * kColX + tx] = a;
    __syncthreads();
    if (ty == 0 && i < g.inner) {
      for (int k = 1; k < kColY; ++k) a = red.combine(a, partial[k * kColX + tx]);
      red.store((o * splits + s) * g.inner + i, a);
    }
    __syncthreads();
  }
}

template <typename Red>
void launch_rows(const Red& red, const typename Red::in_t* x, const Geometry& g, int64_t splits, cudaStream_t stream) {
  const int64_t items = g.outer * splits, chunk = (g.R + splits - 1) / splits;
  if (chunk > 256) {
    const unsigned grid = unsigned(std::min<int64_t>(items, max_blocks(16)));
    reduce_rows_kernel<Red, kRowBlock><<<grid, kRowBlock, 0, stream>>>(red, x, g, splits);
  } else {
    constexpr int kPerBlock = kRowBlock / 32;
    const unsigned grid = unsigned(std::min<int64_t>((items + kPerBlock - 1) / kPerBlock, max_blocks(16)));
    reduce_rows_kernel<Red, 32><<<grid, kRowBlock, 0, stream>>>(red, x, g, splits);
  }
  FRUGAL_CUDA_CHECK_LAUNCH();
}

template <typename Red>
void launch_columns(const Red& red, const typename Red::in_t* x, const Geometry& g, int64_t splits,
                    cudaStream_t stream) {
  const int64_t tiles = g.outer * ((g.inner + kColX - 1) / kColX) * splits;
  const unsigned grid = unsigned(std::min<int64_t>(tiles, max_blocks(8)));
  reduce_columns_kernel<Red><<<grid, dim3(kColX, kColY), 0, stream>>>(red, x, g, splits);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

/// Runs `red` over the (outer, R, inner) view `in`, splitting R across blocks when
/// the outputs alone cannot fill the GPU (Note [CUDA reduction kernels]).
template <typename Red>
void run(const Red& red, const Tensor& in) {
  using A = typename Red::acc_t;
  DeviceGuard guard(in.device());
  cudaStream_t stream = stream_for(in);
  const Geometry g = Geometry::of(in);
  const auto* x = static_cast<const typename Red::in_t*>(in.data());
  const bool rows = g.inner == 1;
  const int64_t blocks = rows ? g.outer : g.outer * ((g.inner + kColX - 1) / kColX);
  const int64_t min_chunk = rows ? kMinRowChunk : kMinColChunk;
  int64_t splits = 1;
  const int64_t target_blocks = max_blocks(2);  // two blocks per SM
  if (blocks < target_blocks && g.R >= 2 * min_chunk)
    splits = std::min((target_blocks + blocks - 1) / blocks, g.R / min_chunk);
  if (splits == 1) {
    rows ? launch_rows(red, x, g, 1, stream) : launch_columns(red, x, g, 1, stream);
    return;
  }
  // Workspace from the arena, freed (stream-ordered) when this scope ends.
  const Tensor workspace = empty({int64_t(sizeof(A)) * g.outer * splits * g.inner}, {kBool, in.device()});
  A* partial = static_cast<A*>(workspace.data());
  const PartialReducer<Red> first{red, partial};
  const MergeReducer<Red> second{red};
  if (rows) {
    launch_rows(first, x, g, splits, stream);
    launch_rows(second, partial, Geometry{g.outer, splits, 1, splits, 1, 0}, 1, stream);
  } else {
    launch_columns(first, x, g, splits, stream);
    launch_columns(second, partial, Geometry{g.outer, splits, g.inner, splits * g.inner, g.inner, 1}, 1, stream);
  }
}

}  // namespace

void reduce_kernel(ReduceOp op, const Tensor& out, const Tensor& in, int64_t correction) {
  const int64_t R = in.size(1);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      dispatch_all(in.dtype(), op == ReduceOp::Sum ? "sum" : "mean", in.device(), [&]<typename T>() {
        if constexpr (is_floating(dtype_of<T>())) {
          using Acc = opmath_t<T>;
          run(reduction::SumReducer<T, Acc, T>{out.data_ptr<T>(), op == ReduceOp::Mean ? Acc(R) : Acc(1)}, in);
        } else {
          run(reduction::SumReducer<T, int64_t, int64_t>{out.data_ptr<int64_t>(), 1}, in);
        }
      });
      return;
    case ReduceOp::Prod:
      dispatch_all(in.dtype(), "prod", in.device(), [&]<typename T>() {
        if constexpr (is_floating(dtype_of<T>())) {
          run(reduction::ProdReducer<T, opmath_t<T>, T>{out.data_ptr<T>()}, in);
        } else {
          run(reduction::ProdReducer<T, int64_t, int64_t>{out.data_ptr<int64_t>()}, in);
        }
      });
      return;
    case ReduceOp::Max:
    case ReduceOp::Min:
      reduction::with_bool(op == ReduceOp::Max, [&]<bool IsMax>() {
        dispatch_all(in.dtype(), IsMax ? "amax" : "amin", in.device(), [&]<typename T>() {
          using Acc = opmath_t<T>;
          run(reduction::MinMaxReducer<T, Acc, IsMax>{out.data_ptr<T>(), reduction::extreme_identity<Acc, IsMax>()},
              in);
        });
      });
      return;
    case ReduceOp::Var:
      dispatch_floating(in.dtype(), "var", in.device(), [&]<typename T>() {
        run(reduction::VarReducer<T, opmath_t<T>>{out.data_ptr<T>(), correction}, in);
      });
      return;
  }
}

void arg_reduce_kernel(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in) {
  reduction::with_bool(is_max, [&]<bool IsMax>() {
    dispatch_all(in.dtype(), IsMax ? "max" : "min", in.device(), [&]<typename T>() {
      T* v = values.defined() ? values.data_ptr<T>() : nullptr;
      run(reduction::ArgReducer<T, opmath_t<T>, IsMax>{v, indices.data_ptr<int64_t>()}, in);
    });
  });
}

}  // namespace frugal::ops::cuda
