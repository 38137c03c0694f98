#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/random.h"
#include "tensor/philox.h"

namespace frugal::ops::cuda {

namespace {
// One thread per element; random_element is the same function the CPU loop calls.
template <typename T>
__global__ void random_fill_kernel(T* out, int64_t n, RandomFill f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const uint64_t first = philox_first_counter(f.range.counter, f.range.base);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = random_element<T>(f, first, uint64_t(i));
}
}  // namespace

void random_kernel(const Tensor& t, const RandomFill& fill) {
  DeviceGuard guard(t.device());
  dispatch_numeric(t.dtype(), "random", t.device(), [&]<typename T>() {
    random_fill_kernel<T><<<grid_for(t.numel()), kBlockSize, 0, stream_for(t)>>>(t.data_ptr<T>(), t.numel(), fill);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
