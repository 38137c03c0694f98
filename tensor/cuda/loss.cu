// CUDA cross entropy forward and backward (see Note [Fused cross entropy]).
//
// Rows are taken as in the softmax kernels (Note [CUDA softmax kernels]): a warp per
// row when C <= 1024, a 512-thread block per row for vocabularies. The forward folds
// the online (max, sum of exp) pair and sum(x) in one read of the row; lane 0 checks
// the target, reads x_t and writes the row's loss and lse. A bad target is recorded in
// a device flag (atomicCAS) that the front-end reads back later (Note [Index validation],
// Note [Deferred index checks]): the forward issues no host-device sync.
// The backward is elementwise per row: exp(x - lse) minus the smoothed one-hot, scaled.
// lse is float64 and the loss is formed from m - x_t and log(sum) (Note [Cross entropy
// keeps lse in float64]): one double add per row, one double subtract per element.
#include <cmath>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/online_softmax.cuh"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/loss.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kWarpRowsBlock = 128;
constexpr int kLongRowBlock = 512;
constexpr int64_t kWarpRowMax = 1024;

/// Online softmax state (running max m, sum of exp(x - m)) plus the plain sum of x.
template <typename Acc>
struct RowState {
  Acc m, s, sx;
};

template <typename Acc>
__device__ __forceinline__ RowState<Acc> state_add(RowState<Acc> st, Acc x) {
  const MaxSum<Acc> ms = max_sum_add(MaxSum<Acc>{st.m, st.s}, x);
  return {ms.m, ms.s, st.sx + x};
}

template <typename Acc>
__device__ __forceinline__ RowState<Acc> state_merge(RowState<Acc> a, RowState<Acc> b) {
  const MaxSum<Acc> ms = max_sum_merge(MaxSum<Acc>{a.m, a.s}, MaxSum<Acc>{b.m, b.s});
  return {ms.m, ms.s, a.sx + b.sx};
}

// rec = {flag, value, position}: the first thread to meet a bad target claims the flag.
__device__ __forceinline__ void record_bad_target(unsigned long long* rec, int64_t v, int64_t pos) {
  if (atomicCAS(rec, 0ull, 1ull) == 0ull) {
    rec[1] = static_cast<unsigned long long>(v);
    rec[2] = static_cast<unsigned long long>(pos);
  }
}

// loss: (R); lse: (R) float64; x: (R, C); target: (R)
template <typename T, typename I, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock)
    cross_entropy_forward_kernel(opmath_t<T>* __restrict__ loss, double* __restrict__ lse, const T* __restrict__ x,
                                 const I* __restrict__ target, int64_t R, int64_t C, int64_t ignore_index,
                                 opmath_t<T> smoothing, unsigned long long* rec) {
  using Acc = opmath_t<T>;
  using S = RowState<Acc>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const auto merge = [](S a, S b) { return state_merge(a, b); };
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < R;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * C;
    S st{Acc(-INFINITY), Acc(0), Acc(0)};
    for (int64_t c = lane; c < C; c += kThreads) st = state_add(st, Acc(xr[c]));
    if constexpr (kThreads == 32) st = warp_allreduce(st, merge);
    else st = block_allreduce(st, merge, S{Acc(-INFINITY), Acc(0), Acc(0)});
    if (lane != 0) continue;
    const Acc lrel = log_acc(st.s);  // lse - m, in [0, log C]
    lse[row] = st.m == Acc(-INFINITY) ? double(st.m) : double(st.m) + double(lrel);
    const int64_t t = int64_t(target[row]);
    Acc v = Acc(0);
    if (t != ignore_index) {
      if (t < 0 || t >= C) {
        record_bad_target(rec, t, row);
      } else {
        v = (Acc(1) - smoothing) * ((st.m - Acc(xr[t])) + lrel);
        if (smoothing > Acc(0)) v += smoothing * ((st.m - st.sx / Acc(C)) + lrel);
      }
    }
    loss[row] = v;
  }
}

// g, x: (R, C); target: (R); lse: (R) float64; scale: (R) with stride scale_stride
template <typename T, typename I, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock)
    cross_entropy_backward_kernel_impl(T* __restrict__ g, const T* __restrict__ x, const I* __restrict__ target,
                                       const double* __restrict__ lse, const opmath_t<T>* __restrict__ scale,
                                       int64_t scale_stride, int64_t R, int64_t C, int64_t ignore_index, opmath_t<T> on,
                                       opmath_t<T> off) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < R;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    T* gr = g + row * C;
    const T* xr = x + row * C;
    const int64_t t = int64_t(target[row]);
    if (t == ignore_index) {
      for (int64_t c = lane; c < C; c += kThreads) gr[c] = T(Acc(0));
      continue;
    }
    const Acc s = scale[row * scale_stride];
    const double l = lse[row];
    for (int64_t c = lane; c < C; c += kThreads)
      gr[c] = T(s * (exp_acc(Acc(double(Acc(xr[c])) - l)) - (c == t ? on : Acc(0)) - off));
  }
}

template <typename F>
void with_row_shape(int64_t C, F&& f) {
  if (C <= kWarpRowMax) f.template operator()<32, kWarpRowsBlock>();
  else f.template operator()<kLongRowBlock, kLongRowBlock>();
}

template <int kThreads, int kBlock>
unsigned row_grid(int64_t R) {
  constexpr int64_t rows_per_block = kBlock / kThreads;
  return unsigned(std::clamp<int64_t>((R + rows_per_block - 1) / rows_per_block, 1, max_blocks(16)));
}

}  // namespace

void cross_entropy_kernel(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          int64_t ignore_index, double label_smoothing, IndexError& err) {
  const int64_t R = logits.size(0), C = logits.size(1);
  DeviceGuard guard(logits.device());
  cudaStream_t stream = stream_for(logits);
  const Tensor rec = empty({3}, {kInt64, logits.device()});
  FRUGAL_CUDA_CHECK(cudaMemsetAsync(rec.data(), 0, 3 * sizeof(int64_t), stream));
  auto* rec_ptr = static_cast<unsigned long long*>(rec.data());
  dispatch_floating(logits.dtype(), "cross_entropy", logits.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    dispatch_index(target.dtype(), "cross_entropy", target.device(), [&]<typename I>() {
      with_row_shape(C, [&]<int kThreads, int kBlock>() {
        cross_entropy_forward_kernel<T, I, kThreads, kBlock><<<row_grid<kThreads, kBlock>(R), kBlock, 0, stream>>>(
            loss.data_ptr<Acc>(), lse.data_ptr<double>(), logits.data_ptr<T>(), target.data_ptr<I>(), R, C, ignore_index,
            Acc(label_smoothing), rec_ptr);
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
    });
  });
  err.record = rec;  // read by the front-end, now or deferred (Note [Deferred index checks])
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   const Tensor& scale, int64_t scale_stride, int64_t ignore_index,
                                   double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  DeviceGuard guard(logits.device());
  cudaStream_t stream = stream_for(logits);
  dispatch_floating(logits.dtype(), "cross_entropy_backward", logits.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    dispatch_index(target.dtype(), "cross_entropy_backward", target.device(), [&]<typename I>() {
      with_row_shape(C, [&]<int kThreads, int kBlock>() {
        cross_entropy_backward_kernel_impl<T, I, kThreads, kBlock>
            <<<row_grid<kThreads, kBlock>(R), kBlock, 0, stream>>>(
                grad.data_ptr<T>(), logits.data_ptr<T>(), target.data_ptr<I>(), lse.data_ptr<double>(),
                scale.data_ptr<Acc>(), scale_stride, R, C, ignore_index, Acc(1.0 - label_smoothing),
                Acc(label_smoothing / double(C)));
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace frugal::ops::cuda
