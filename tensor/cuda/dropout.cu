// CUDA dropout: one thread per Philox call, i.e. per four neighbouring elements
// (see Note [Dropout mask from counters]); the same words as the CPU loop.
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/dropout.h"
#include "tensor/philox.h"

namespace frugal::ops::cuda {

namespace {

// y, x: (n)
template <typename T>
__global__ void dropout_forward_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n, float keep_below,
                                       opmath_t<T> scale, Generator::Range range) {
  using Acc = opmath_t<T>;
  const int64_t groups = (n + 3) / 4, stride = int64_t(gridDim.x) * blockDim.x;
  const uint64_t first = philox_first_counter(range.counter, range.base);
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < groups; k += stride) {
    const PhiloxResult r = philox4x32(range.seed, first + uint64_t(k));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * k + w;
      if (i < n) y[i] = T(Acc(x[i]) * (philox_uniform(r.x[w]) < keep_below ? scale : Acc(0)));
    }
  }
}

}  // namespace

void dropout_kernel(const Tensor& out, const Tensor& x, double p, Generator::Range range) {
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), "dropout", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    const int64_t n = x.numel();
    dropout_forward_kernel<T><<<grid_for((n + 3) / 4), kBlockSize, 0, stream_for(x)>>>(
        out.data_ptr<T>(), x.data_ptr<T>(), n, float(1.0 - p), Acc(1.0 / (1.0 - p)), range);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
