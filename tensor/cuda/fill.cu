#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/fill.h"

namespace frugal::ops::cuda {

namespace {
template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};
template <typename T>
__global__ void arange_fill(T* out, int64_t n, double start, double step, bool exact) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (exact) {  // Note [Integer arange]
        out[i] = T(int64_t(uint64_t(int64_t(start)) + uint64_t(i) * uint64_t(int64_t(step))));
        continue;
      }
    }
    const double v = __dadd_rn(start, __dmul_rn(double(i), step));  // rounded twice as the host does: no FMA
    if constexpr (std::is_same_v<T, bool>) out[i] = v != 0.0;
    else out[i] = T(static_cast<opmath_t<T>>(v));
  }
}
}  // namespace

void fill_kernel(const Tensor& t, double value) {
  const ElementwiseLayout L = make_elementwise_layout("fill_", t, {});
  dispatch_all(t.dtype(), "fill_", t.device(), [&]<typename T>() {
    const T v = std::is_same_v<T, bool> ? T(value != 0.0) : T(static_cast<opmath_t<T>>(value));
    cuda_map<T>(L, t.device(), Constant<T>{v});
  });
}

// On the device, not built on the host and copied: a captured step (BERT's position ids)
// may make one, and a host copy cannot be captured.
void arange_fill_kernel(const Tensor& t, double start, double step) {
  DeviceGuard guard(t.device());
  cudaStream_t stream = stream_for(t);
  dispatch_all(t.dtype(), "arange_fill_", t.device(), [&]<typename T>() {
    arange_fill<T><<<grid_for(t.numel()), kBlockSize, 0, stream>>>(t.data_ptr<T>(), t.numel(), start, step,
                                                                   integral_arange(start, step));
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
