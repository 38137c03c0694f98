#pragma once
// CUDA elementwise loops over an ElementwiseLayout (see Note [Elementwise layout]).
//
//   cuda_map<float, float, float>(L, device, [] __device__(float a, float b) { return a + b; });
//
// Note [Vectorized elementwise]
// When every operand is dense (L.contiguous) and 16-byte aligned, each thread
// moves whole 16-byte vectors per operand (4 floats, 8 halves), the access width
// that saturates HBM; the tail is done with scalar accesses. Otherwise the
// general strided path computes every operand's offset from the linear index,
// with 32-bit index math when the tensor is small enough (64-bit division is
// several times slower on the GPU). All loops are grid-stride.
#include <cuda_runtime.h>
#include <cuda/std/tuple>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/elementwise.h"

namespace frugal::ops::cuda {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

/// Elements per 16-byte access, set by the widest operand type.
template <typename... Ts>
constexpr int vec_width() {
  constexpr size_t widest = std::max({sizeof(Ts)...});
  return widest >= 16 ? 1 : int(16 / widest);
}

namespace detail {

// __global__ templates may have only one trailing pack, so each kernel forwards
// to a __device__ body that also takes the index sequence over its inputs.
template <int N, typename Out, typename F, typename... In, size_t... I>
__device__ __forceinline__ void map_dense_body(int64_t n, F f, std::index_sequence<I...>, Out* __restrict__ out,
                                               const In* __restrict__... in) {
  const int64_t nvec = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    // All loads first, so every operand's 16-byte load is in flight before compute.
    const ::cuda::std::tuple<Vec<In, N>...> loaded{reinterpret_cast<const Vec<In, N>*>(in)[v]...};
    Vec<Out, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = Out(f(::cuda::std::get<I>(loaded).v[j]...));
    reinterpret_cast<Vec<Out, N>*>(out)[v] = o;
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) out[i] = Out(f(in[i]...));
}

template <int N, typename Out, typename F, typename... In>
__global__ void map_dense_kernel(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  map_dense_body<N, Out, F, In...>(n, f, std::index_sequence_for<In...>{}, out, in...);
}

template <typename Index, typename Out, typename F, typename... In, size_t... I>
__device__ __forceinline__ void map_strided_body(const ElementwiseLayout& L, F f, std::index_sequence<I...>) {
  constexpr int K = 1 + sizeof...(In);
  const Index n = Index(L.numel);
  const Index stride = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index off[K] = {};
    Index rem = i;
    for (int d = L.ndim - 1; d >= 0; --d) {
      const Index size = Index(L.sizes[d]);
      const Index idx = rem % size;
      rem /= size;
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += idx * Index(L.strides[k][d]);
    }
    reinterpret_cast<Out*>(L.data[0])[off[0]] = Out(f(reinterpret_cast<const In*>(L.data[I + 1])[off[I + 1]]...));
  }
}

template <typename Index, typename Out, typename F, typename... In>
__global__ void map_strided_kernel(ElementwiseLayout L, F f) {
  map_strided_body<Index, Out, F, In...>(L, f, std::index_sequence_for<In...>{});
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// True when every operand's largest offset fits in int32 (then 32-bit index math is safe).
inline bool fits_int32(const ElementwiseLayout& L) {
  if (L.numel >= (int64_t(1) << 31)) return false;
  for (int k = 0; k < L.noperands; ++k) {
    int64_t last = 0;
    for (int d = 0; d < L.ndim; ++d) last += (L.sizes[d] - 1) * L.strides[k][d];
    if (last >= (int64_t(1) << 31)) return false;
  }
  return true;
}

template <int N, typename Out, typename... In, typename F, size_t... I>
void launch_dense(const ElementwiseLayout& L, F f, cudaStream_t stream, std::index_sequence<I...>) {
  map_dense_kernel<N, Out, F, In...><<<grid_for((L.numel + N - 1) / N), kBlockSize, 0, stream>>>(
      L.numel, f, reinterpret_cast<Out*>(L.data[0]), reinterpret_cast<const In*>(L.data[1 + I])...);
}

}  // namespace detail

/// out[i] = f(in_1[i], ..., in_k[i]) over the layout, on the current stream of `device`.
/// f is a __device__ lambda taking the input element types (Half/BFloat16 convert to
/// float implicitly; see Note [Half types compute in f32]).
template <typename Out, typename... In, typename F>
void cuda_map(const ElementwiseLayout& L, Device device, F f) {
  if (L.numel == 0) return;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_for(device);
  const auto seq = std::index_sequence_for<In...>{};
  if (L.contiguous) {
    constexpr int N = vec_width<Out, In...>();
    bool aligned = true;
    for (int k = 0; k < L.noperands; ++k) aligned = aligned && detail::aligned16(L.data[k]);
    if (aligned) detail::launch_dense<N, Out, In...>(L, f, stream, seq);
    else detail::launch_dense<1, Out, In...>(L, f, stream, seq);
  } else if (detail::fits_int32(L)) {
    detail::map_strided_kernel<int32_t, Out, F, In...><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  } else {
    detail::map_strided_kernel<int64_t, Out, F, In...><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  }
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::ops::cuda
