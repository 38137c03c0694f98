// CUDA masked softmax (see Note [Masked softmax]). Rows as in the softmax kernels
// (Note [CUDA softmax kernels]): a warp per row when S <= 1024, a 512-thread block per
// row beyond. Pass 1 folds the online (max, sum of exp) pair of the scaled, masked
// logits; pass 2 recomputes each logit (one multiply and one mask load) and writes.
#include <cmath>
#include <type_traits>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/online_softmax.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/masked_softmax.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kWarpRowsBlock = 128;
constexpr int kLongRowBlock = 512;
constexpr int64_t kWarpRowMax = 1024;

/// Entry s of one row: scale * x plus the mask (-inf where masked out).
template <typename T, typename M>
struct RowLogits {
  using Acc = opmath_t<T>;
  const T* x;     // the row
  const M* mask;  // the row's mask entries (stride ms), or null
  int64_t ms;
  int64_t keep_end;  // causal: keys < keep_end
  Acc scale;
  __device__ __forceinline__ Acc operator()(int64_t s) const {
    if (s >= keep_end) return Acc(-INFINITY);
    Acc v = Acc(x[s]) * scale;
    if constexpr (std::is_same_v<M, bool>) {
      if (mask && !mask[s * ms]) return Acc(-INFINITY);
    } else {
      if (mask) v += Acc(mask[s * ms]);
    }
    return v;
  }
};

// y, x: (rows, S); mask: read at p's offsets (null when p.kind == 0)
template <typename T, typename M, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock)
    masked_softmax_forward_kernel(T* __restrict__ y, const T* __restrict__ x, const M* __restrict__ mask,
                                  MaskedSoftmaxParams p, int64_t rows) {
  using Acc = opmath_t<T>;
  using S = MaxSum<Acc>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const auto merge = [](S a, S b) { return max_sum_merge(a, b); };
  const int64_t D = p.sizes[p.ndim - 1];
  const int64_t L = p.ndim >= 2 ? p.sizes[p.ndim - 2] : 1;
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const RowLogits<T, M> z{x + row * D, mask ? mask + p.mask_row_offset(row) : nullptr, p.mask_strides[p.ndim - 1],
                            p.causal ? row % L + 1 : D, Acc(p.scale)};
    S st{Acc(-INFINITY), Acc(0)};
    for (int64_t s = lane; s < D; s += kThreads) st = max_sum_add(st, z(s));
    if constexpr (kThreads == 32) st = warp_allreduce(st, merge);
    else st = block_allreduce(st, merge, S{Acc(-INFINITY), Acc(0)});
    T* yr = y + row * D;
    if (st.m == Acc(-INFINITY)) {  // no key left: zeros (Note [Masked softmax])
      for (int64_t s = lane; s < D; s += kThreads) yr[s] = T(Acc(0));
      continue;
    }
    const Acc inv = Acc(1) / st.s;
    for (int64_t s = lane; s < D; s += kThreads) {
      const Acc v = z(s);
      yr[s] = T(v == Acc(-INFINITY) ? Acc(0) : exp_acc(v - st.m) * inv);
    }
  }
}

template <typename T, typename M>
void launch(const Tensor& out, const Tensor& scores, const M* mask, const MaskedSoftmaxParams& p) {
  const int64_t D = p.sizes[p.ndim - 1], rows = scores.numel() / D;
  cudaStream_t stream = stream_for(scores);
  if (D <= kWarpRowMax) {
    constexpr int kRowsPerBlock = kWarpRowsBlock / 32;
    const unsigned grid = unsigned(std::clamp<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1, max_blocks(16)));
    masked_softmax_forward_kernel<T, M, 32, kWarpRowsBlock>
        <<<grid, kWarpRowsBlock, 0, stream>>>(out.data_ptr<T>(), scores.data_ptr<T>(), mask, p, rows);
  } else {
    const unsigned grid = unsigned(std::clamp<int64_t>(rows, 1, max_blocks(16)));
    masked_softmax_forward_kernel<T, M, kLongRowBlock, kLongRowBlock>
        <<<grid, kLongRowBlock, 0, stream>>>(out.data_ptr<T>(), scores.data_ptr<T>(), mask, p, rows);
  }
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void masked_softmax_kernel(const Tensor& out, const Tensor& scores, const Tensor& mask,
                           const MaskedSoftmaxParams& params) {
  DeviceGuard guard(scores.device());
  dispatch_floating(scores.dtype(), "masked_softmax", scores.device(), [&]<typename T>() {
    if (params.kind == 1) launch<T, bool>(out, scores, static_cast<const bool*>(mask.data()), params);
    else if (params.kind == 2) launch<T, T>(out, scores, static_cast<const T*>(mask.data()), params);
    else launch<T, T>(out, scores, nullptr, params);
  });
}

}  // namespace frugal::ops::cuda
