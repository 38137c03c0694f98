// CUDA softmax / log_softmax and their backward formulas (Note [Stable softmax]).
//
// Note [CUDA softmax kernels]
// Every kernel makes one reading pass that folds a per-slice state, merges the
// states across threads, then a writing pass. The forward state is the online
// (max, sum) pair: a new maximum rescales the running sum, so the max and the sum
// come out of a single read of x (one exp per element). The backward state is
// sum(g * y) (softmax) or sum(g) (log_softmax). Slices along the last dim (inner == 1)
// take a warp each when D <= 1024 and a 512-thread block each when longer; slices
// along another dim take a 32 x 8 block per 32 neighbouring slices: threadIdx.x
// walks inner (coalesced), threadIdx.y splits D, and shared memory merges.
#include <cmath>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/online_softmax.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/softmax.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kWarpRowsBlock = 128;  // warp-per-row kernel: 4 rows per block
constexpr int kLongRowBlock = 512;   // block-per-row kernel
constexpr int64_t kWarpRowMax = 1024;
constexpr int kColX = 32, kColY = 8;

// x, y: (outer, D, inner) contiguous; offsets are element offsets into both.
template <typename T, bool Log>
struct SoftmaxForward {
  using Acc = opmath_t<T>;
  using state_t = MaxSum<Acc>;
  const T* __restrict__ x;
  T* __restrict__ y;
  __device__ state_t init() const { return {Acc(-INFINITY), Acc(0)}; }
  __device__ state_t add(state_t st, int64_t off) const { return max_sum_add(st, Acc(x[off])); }
  __device__ state_t merge(state_t a, state_t b) const { return max_sum_merge(a, b); }
  /// Turns the sum into what the writing pass needs: log(sum) or 1 / sum.
  __device__ state_t finish(state_t st) const { return {st.m, Log ? log_acc(st.s) : Acc(1) / st.s}; }
  __device__ void write(int64_t off, state_t st) const {
    const Acc d = Acc(x[off]) - st.m;
    y[off] = Log ? T(d - st.s) : T(exp_acc(d) * st.s);
  }
};

// g (grad_out), y (forward output), gi (grad_in): (outer, D, inner) contiguous.
template <typename T, bool Log>
struct SoftmaxBackward {
  using Acc = opmath_t<T>;
  using state_t = Acc;
  const T* __restrict__ g;
  const T* __restrict__ y;
  T* __restrict__ gi;
  __device__ state_t init() const { return Acc(0); }
  __device__ state_t add(state_t s, int64_t off) const { return Log ? s + Acc(g[off]) : s + Acc(g[off]) * Acc(y[off]); }
  __device__ state_t merge(state_t a, state_t b) const { return a + b; }
  __device__ state_t finish(state_t s) const { return s; }
  __device__ void write(int64_t off, state_t s) const {
    const Acc gv = Acc(g[off]), yv = Acc(y[off]);
    gi[off] = Log ? T(gv - exp_acc(yv) * s) : T(yv * (gv - s));
  }
};

// Slices along the last dim: rows of D elements. kThreads per row (32: a warp).
template <typename Op, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock) softmax_rows_kernel(Op op, int64_t rows, int64_t D) {
  using S = typename Op::state_t;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const auto merge = [&](S a, S b) { return op.merge(a, b); };
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t base = row * D;
    S st = op.init();
    for (int64_t j = lane; j < D; j += kThreads) st = op.add(st, base + j);
    if constexpr (kThreads == 32) st = warp_allreduce(st, merge);
    else st = block_allreduce(st, merge, op.init());
    st = op.finish(st);
    for (int64_t j = lane; j < D; j += kThreads) op.write(base + j, st);
  }
}

// Slices along another dim: (outer, D, inner); a block takes 32 neighbouring slices.
template <typename Op>
__global__ void __launch_bounds__(kColX* kColY) softmax_columns_kernel(Op op, SoftmaxShape s) {
  using S = typename Op::state_t;
  __shared__ alignas(16) unsigned char raw[kColX * kColY * sizeof(S)];
  S* partial = reinterpret_cast<S*>(raw);
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t tiles_per_outer = (s.inner + kColX - 1) / kColX;
  for (int64_t tile = blockIdx.x; tile < s.outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer, i = tile % tiles_per_outer * kColX + tx;
    const int64_t base = o * s.D * s.inner + i;
    S st = op.init();
    if (i < s.inner)
      for (int64_t j = ty; j < s.D; j += kColY) st = op.add(st, base + j * s.inner);
    partial[ty * kColX + tx] = st;
    __syncthreads();
    if (ty == 0) {
      for (int k = 1; k < kColY; ++k) st = op.merge(st, partial[k * kColX + tx]);
      partial[tx] = op.finish(st);
    }
    __syncthreads();
    st = partial[tx];
    if (i < s.inner)
      for (int64_t j = ty; j < s.D; j += kColY) op.write(base + j * s.inner, st);
    __syncthreads();  // partial is reused by the next tile
  }
}

template <typename Op>
void launch(const Op& op, const SoftmaxShape& s, Device device) {
  DeviceGuard guard(device);
  cudaStream_t stream = stream_for(device);
  if (s.inner == 1 && s.D <= kWarpRowMax) {
    constexpr int kRowsPerBlock = kWarpRowsBlock / 32;
    const unsigned grid = unsigned(std::min<int64_t>((s.outer + kRowsPerBlock - 1) / kRowsPerBlock, max_blocks(16)));
    softmax_rows_kernel<Op, 32, kWarpRowsBlock><<<grid, kWarpRowsBlock, 0, stream>>>(op, s.outer, s.D);
  } else if (s.inner == 1) {
    const unsigned grid = unsigned(std::min<int64_t>(s.outer, max_blocks(16)));
    softmax_rows_kernel<Op, kLongRowBlock, kLongRowBlock><<<grid, kLongRowBlock, 0, stream>>>(op, s.outer, s.D);
  } else {
    const unsigned grid = unsigned(std::min<int64_t>(s.outer * ((s.inner + kColX - 1) / kColX), max_blocks(16)));
    softmax_columns_kernel<Op><<<grid, dim3(kColX, kColY), 0, stream>>>(op, s);
  }
  FRUGAL_CUDA_CHECK_LAUNCH();
}

template <typename F>
void with_bool(bool b, F&& f) {
  if (b) f.template operator()<true>();
  else f.template operator()<false>();
}

}  // namespace

void softmax_kernel(const Tensor& out, const Tensor& x, SoftmaxShape s, bool log) {
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", x.device(), [&]<typename T>() {
    with_bool(log, [&]<bool Log>() {
      launch(SoftmaxForward<T, Log>{x.data_ptr<T>(), out.data_ptr<T>()}, s, x.device());
    });
  });
}

void softmax_backward_kernel(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                             bool log) {
  dispatch_floating(out.dtype(), log ? "log_softmax_backward" : "softmax_backward", out.device(), [&]<typename T>() {
    with_bool(log, [&]<bool Log>() {
      launch(SoftmaxBackward<T, Log>{grad_out.data_ptr<T>(), out.data_ptr<T>(), grad_in.data_ptr<T>()}, s,
             out.device());
    });
  });
}

}  // namespace frugal::ops::cuda
