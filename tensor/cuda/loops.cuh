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
// several times slower on the GPU). Between the two, when the innermost dim runs
// along memory (stride 1) or is broadcast (stride 0) in every operand - a bias
// added or copied over rows, a per-channel scale on NHWC, a view that only skips
// rows - each thread still moves vectors along that dim: it computes the offsets
// once per vector instead of once per element, and a broadcast operand's element is
// loaded once and repeated. (Copying a (8192, 3072) bfloat16 bias over its rows took
// 0.106 ms element by element on an H200, twice a 50 MB write's time.)
// All loops are grid-stride.
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

/// N elements of T at `base`: a vector load, or with `broadcast` one element repeated.
template <typename T, int N, typename Index>
__device__ __forceinline__ Vec<T, N> load_vec_or_repeat(const char* base, Index off, bool broadcast) {
  const T* p = reinterpret_cast<const T*>(base) + off;
  if (!broadcast) return reinterpret_cast<const Vec<T, N>*>(p)[0];
  Vec<T, N> v;
  const T x = *p;
#pragma unroll
  for (int j = 0; j < N; ++j) v.v[j] = x;
  return v;
}

/// The inner-vector path of Note [Vectorized elementwise]: thread t handles the N elements
/// from t * N along the innermost dim (its size a multiple of N), operand k's innermost
/// stride being 1, or 0 (inner_broadcast bit k: the element repeats).
template <typename Index, int N, typename Out, typename F, typename... In, size_t... I>
__device__ __forceinline__ void map_inner_vec_body(const ElementwiseLayout& L, unsigned inner_broadcast, F f,
                                                   std::index_sequence<I...>) {
  constexpr int K = 1 + sizeof...(In);
  const int last = L.ndim - 1;
  const Index inner = Index(L.sizes[last]);
  const Index nvec = Index(L.numel / N);
  const Index stride = Index(gridDim.x) * blockDim.x;
  for (Index v = Index(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    Index rem = v * N / inner;
    const Index j = v * N - rem * inner;
    Index off[K];
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = j * Index(L.strides[k][last]);
    for (int d = last - 1; d >= 0; --d) {
      const Index size = Index(L.sizes[d]);
      const Index idx = rem % size;
      rem /= size;
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += idx * Index(L.strides[k][d]);
    }
    const ::cuda::std::tuple<Vec<In, N>...> loaded{
        load_vec_or_repeat<In, N>(L.data[I + 1], off[I + 1], (inner_broadcast >> (I + 1)) & 1u)...};
    Vec<Out, N> o;
#pragma unroll
    for (int e = 0; e < N; ++e) o.v[e] = Out(f(::cuda::std::get<I>(loaded).v[e]...));
    reinterpret_cast<Vec<Out, N>*>(reinterpret_cast<Out*>(L.data[0]) + off[0])[0] = o;
  }
}

template <typename Index, int N, typename Out, typename F, typename... In>
__global__ void map_inner_vec_kernel(ElementwiseLayout L, unsigned inner_broadcast, F f) {
  map_inner_vec_body<Index, N, Out, F, In...>(L, inner_broadcast, f, std::index_sequence_for<In...>{});
}

/// Whether the inner-vector path applies with N-element vectors (operand k's element being
/// elem_bytes[k] bytes): the innermost size is a multiple of N, the output runs along it,
/// and each input runs along it or is broadcast on it; every operand that runs along it
/// starts each vector at an (N * element)-byte boundary (an aligned base, outer strides
/// that are multiples of N). Sets bit k of *inner_broadcast for the broadcast operands.
inline bool inner_vec_applies(const ElementwiseLayout& L, int N, const size_t* elem_bytes, unsigned* inner_broadcast) {
  const int last = L.ndim - 1;
  if (N == 1 || L.ndim < 1 || L.sizes[last] % N != 0 || L.strides[0][last] != 1) return false;
  *inner_broadcast = 0;
  for (int k = 0; k < L.noperands; ++k) {
    const int64_t s = L.strides[k][last];
    if (s == 0) {
      *inner_broadcast |= 1u << k;
      continue;
    }
    if (s != 1 || reinterpret_cast<uintptr_t>(L.data[k]) % (uintptr_t(N) * elem_bytes[k]) != 0) return false;
    for (int d = 0; d < last; ++d)
      if (L.sizes[d] > 1 && L.strides[k][d] % N != 0) return false;
  }
  return true;
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
    FRUGAL_CUDA_CHECK_LAUNCH();
    return;
  }
  constexpr int N = vec_width<Out, In...>();
  constexpr size_t elem_bytes[] = {sizeof(Out), sizeof(In)...};
  const bool small = detail::fits_int32(L);
  unsigned inner_broadcast = 0;
  if (detail::inner_vec_applies(L, N, elem_bytes, &inner_broadcast)) {
    const unsigned grid = grid_for(L.numel / N);
    if (small)
      detail::map_inner_vec_kernel<int32_t, N, Out, F, In...><<<grid, kBlockSize, 0, stream>>>(L, inner_broadcast, f);
    else
      detail::map_inner_vec_kernel<int64_t, N, Out, F, In...><<<grid, kBlockSize, 0, stream>>>(L, inner_broadcast, f);
  } else if (small) {
    detail::map_strided_kernel<int32_t, Out, F, In...><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  } else {
    detail::map_strided_kernel<int64_t, Out, F, In...><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  }
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::ops::cuda
