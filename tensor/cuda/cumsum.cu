// CUDA cumulative sum (Note [Cumulative sum dtypes]).
//
// One thread per line along D: thread t takes line (o, i) with o = t / inner and
// i = t % inner, so neighbouring threads walk neighbouring lines and each of their D steps
// is one coalesced read and write when the sum is not along the last dim. Along the last
// dim (inner == 1) each thread walks a row alone: simple and exact in order, as the CPU.
#include <type_traits>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/cumsum.h"

namespace frugal::ops::cuda {

namespace {

// x: (outer, D, inner) of T; out: the same of Out.
template <typename T, typename Out, typename Acc>
__global__ void cumsum_lines_kernel(const T* __restrict__ x, Out* __restrict__ out, CumsumShape s) {
  const int64_t lines = s.outer * s.inner;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lines; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = t / s.inner, i = t % s.inner;
    int64_t at = o * s.D * s.inner + i;
    Acc acc = Acc(0);
    for (int64_t j = 0; j < s.D; ++j, at += s.inner) {
      acc += Acc(x[at]);
      out[at] = Out(acc);
    }
  }
}

}  // namespace

void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s) {
  dispatch_all(x.dtype(), "cumsum", x.device(), [&]<typename T>() {
    // Floating: T out, opmath_t<T> sums; integers and bool: int64 out and sums.
    using Out = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, T, int64_t>;
    using Acc = std::conditional_t<std::is_same_v<Out, int64_t>, int64_t, opmath_t<T>>;
    DeviceGuard guard(x.device());
    cumsum_lines_kernel<T, Out, Acc>
        <<<grid_for(s.outer * s.inner), kBlockSize, 0, stream_for(x)>>>(x.data_ptr<T>(), out.data_ptr<Out>(), s);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
