// nonzero, masked_select and masked_select's backward on CUDA (Note [Data-dependent output
// sizes]): the front-end's cumsum is the scan across blocks; here every element of the flat
// mask finds its output slot in pos, so a grid-stride loop writes the rows in row-major
// order without atomics.
#include <cstdint>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/masked.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kMaxNonzeroDims = 16;  // nonzero's coordinates are computed from sizes held by value

struct Sizes {
  int64_t v[kMaxNonzeroDims];
  int ndim;
};

// out: (count); x, mask, pos: (n)
template <typename U>
__global__ void masked_select_cuda_kernel(U* __restrict__ out, const U* __restrict__ x, const bool* __restrict__ mask,
                                          const int64_t* __restrict__ pos, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (mask[i]) out[pos[i] - 1] = x[i];
}

// out: (count, s.ndim); mask, pos: (n)
__global__ void nonzero_cuda_kernel(int64_t* __restrict__ out, const bool* __restrict__ mask,
                                    const int64_t* __restrict__ pos, int64_t n, Sizes s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (!mask[i]) continue;
    int64_t* row = out + (pos[i] - 1) * s.ndim;
    int64_t rem = i;
    for (int d = s.ndim - 1; d >= 0; --d) {  // row-major coordinates of i
      row[d] = rem % s.v[d];
      rem /= s.v[d];
    }
  }
}

// out, mask, pos: (n); src: (count)
template <typename U>
__global__ void masked_scatter_cuda_kernel(U* __restrict__ out, const bool* __restrict__ mask,
                                           const int64_t* __restrict__ pos, const U* __restrict__ src, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = mask[i] ? src[pos[i] - 1] : U(0);  // all-zero bits: +0 in every dtype
}

}  // namespace

void masked_select_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, const Tensor& pos) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  const int64_t n = x.numel();
  dispatch_bytes(element_size(x.dtype()), "masked_select", [&]<typename U>() {
    masked_select_cuda_kernel<U>
        <<<grid_for(n), kBlockSize, 0, stream>>>(static_cast<U*>(out.data()), static_cast<const U*>(x.data()),
                                                 mask.data_ptr<bool>(), pos.data_ptr<int64_t>(), n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void nonzero_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Shape& sizes) {
  FRUGAL_CHECK(sizes.size() <= size_t(kMaxNonzeroDims), "nonzero: at most ", kMaxNonzeroDims, " dims on CUDA, got ",
               mask.describe());
  Sizes s{};
  s.ndim = int(sizes.size());
  for (int d = 0; d < s.ndim; ++d) s.v[d] = sizes[size_t(d)];
  DeviceGuard guard(mask.device());
  cudaStream_t stream = stream_for(mask);
  const int64_t n = mask.numel();
  nonzero_cuda_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out.data_ptr<int64_t>(), mask.data_ptr<bool>(),
                                                              pos.data_ptr<int64_t>(), n, s);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

void masked_scatter_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Tensor& src) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_for(out);
  const int64_t n = out.numel();
  dispatch_bytes(element_size(out.dtype()), "masked_select_backward", [&]<typename U>() {
    masked_scatter_cuda_kernel<U>
        <<<grid_for(n), kBlockSize, 0, stream>>>(static_cast<U*>(out.data()), mask.data_ptr<bool>(),
                                                 pos.data_ptr<int64_t>(), static_cast<const U*>(src.data()), n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
