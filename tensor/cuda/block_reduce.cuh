#pragma once
// Warp- and block-wide all-reduce of any trivially copyable value under a caller's
// combine (used by reduce.cu and softmax.cu). Include only from .cu files.
//
// Note [All-reduce results agree]
// Every thread gets the same bits back: a warp butterfly (xor shuffles) ends with a
// broadcast of lane 0, and in a block every warp folds the same per-warp partials in
// the same order. Kernels that reuse the result per element (softmax's max and sum)
// rely on this; a non-commutative rounding would otherwise differ across lanes.
#include <cuda_runtime.h>

#include <cstring>

namespace frugal::ops::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

/// __shfl_xor_sync of a trivially copyable value of any size, 4 bytes at a time.
template <typename T>
__device__ __forceinline__ T shfl_xor_any(T v, int mask) {
  constexpr int N = int((sizeof(T) + 3) / 4);
  int w[N] = {};
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = __shfl_xor_sync(kFullMask, w[k], mask);
  memcpy(&v, w, sizeof(T));
  return v;
}

template <typename T>
__device__ __forceinline__ T shfl_any(T v, int src_lane) {
  constexpr int N = int((sizeof(T) + 3) / 4);
  int w[N] = {};
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = __shfl_sync(kFullMask, w[k], src_lane);
  memcpy(&v, w, sizeof(T));
  return v;
}

/// Every lane of a full warp returns combine over the warp's 32 values.
template <typename T, typename F>
__device__ __forceinline__ T warp_allreduce(T v, const F& combine) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v = combine(v, shfl_xor_any(v, m));
  return shfl_any(v, 0);
}

/// Every thread of a 1-d block (blockDim.x a multiple of 32, <= 1024) returns combine
/// over the block's values. Must be reached by all threads of the block.
template <typename T, typename F>
__device__ __forceinline__ T block_allreduce(T v, const F& combine, T identity) {
  __shared__ alignas(16) unsigned char raw[32 * sizeof(T)];
  T* partial = reinterpret_cast<T*>(raw);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), nwarps = int(blockDim.x / 32);
  v = warp_allreduce(v, combine);
  __syncthreads();  // the previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_allreduce(lane < nwarps ? partial[lane] : identity, combine);
}

}  // namespace frugal::ops::cuda
