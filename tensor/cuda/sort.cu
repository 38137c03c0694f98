// The CUDA sort (Note [Sort order] in tensor/ops/sort.h).
//
// Rows sort as (key, index) pairs (Note [Sort keys] in tensor/ops/sort_key.h, the CPU's keys),
// by key then index, which gives the one order Note [Sort order] defines whatever the network:
//  - rows of up to kBlockRow elements: a block per row sorts the pairs in shared memory with a
//    bitonic network (padding keys sort last), then writes the first k values (the input's
//    elements themselves, so NaN payloads and -0 survive) and indices;
//  - longer rows: cub's stable segmented radix sort of (key, index) by key, then the same gather.
#include <cub/device/device_segmented_sort.cuh>

#include <cstdint>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/sort.h"
#include "tensor/ops/sort_key.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kBlockRow = 2048;  // elements a block sorts in shared memory (2048 x 12 or 16 bytes)

// One block per row: a bitonic sort of P = next power of two >= L pairs in shared memory.
template <typename T>
__global__ void block_sort_kernel(T* __restrict__ values, int64_t* __restrict__ indices, const T* __restrict__ x,
                                  int32_t L, int32_t P, int32_t k, bool descending) {
  using K = SortKey<T>;
  extern __shared__ unsigned char shared[];
  K* keys = reinterpret_cast<K*>(shared);
  int32_t* pos = reinterpret_cast<int32_t*>(keys + P);
  const int64_t row = blockIdx.x;
  const T* in = x + row * L;
  for (int32_t i = threadIdx.x; i < P; i += blockDim.x) {
    keys[i] = i < L ? sort_key(in[i], descending) : ~K(0);
    pos[i] = i;  // padding: indices past L, after every real index of an equal (maximal) key
  }
  __syncthreads();
  for (int32_t size = 2; size <= P; size <<= 1)
    for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int32_t i = threadIdx.x; i < P; i += blockDim.x) {
        const int32_t j = i ^ stride;
        if (j <= i) continue;
        const bool up = (i & size) == 0;  // this pair's run sorts ascending
        const bool after = keys[i] > keys[j] || (keys[i] == keys[j] && pos[i] > pos[j]);
        if (after == up) {
          const K tk = keys[i];
          keys[i] = keys[j], keys[j] = tk;
          const int32_t tp = pos[i];
          pos[i] = pos[j], pos[j] = tp;
        }
      }
      __syncthreads();
    }
  for (int32_t j = threadIdx.x; j < k; j += blockDim.x) {
    if (values) values[row * k + j] = in[pos[j]];  // null: argsort
    indices[row * k + j] = pos[j];
  }
}

// Long rows: the keys and each element's index within its row, for cub.
template <typename T>
__global__ void keys_kernel(SortKey<T>* __restrict__ keys, int64_t* __restrict__ pos, const T* __restrict__ x, int64_t L,
                            int64_t n, bool descending) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = sort_key(x[i], descending);
    pos[i] = i % L;
  }
}

__global__ void offsets_kernel(int64_t* __restrict__ offsets, int64_t L, int64_t rows) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r <= rows; r += int64_t(gridDim.x) * blockDim.x)
    offsets[r] = r * L;
}

template <typename T>
__global__ void gather_kernel(T* __restrict__ values, int64_t* __restrict__ indices, const T* __restrict__ x,
                              const int64_t* __restrict__ pos, int64_t L, int64_t k, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / k, j = i % k, p = pos[row * L + j];
    if (values) values[i] = x[row * L + p];  // null: argsort
    indices[i] = p;
  }
}

/// values' data, or null for argsort's undefined values (the kernels then write indices only).
template <typename T>
T* values_or_null(const Tensor& values) {
  return values.defined() ? values.data_ptr<T>() : nullptr;
}

/// Scratch memory from the caching allocator, freed stream-ordered after the op's kernels.
Tensor scratch(int64_t bytes, Device device) { return empty({(bytes + 7) / 8}, {kInt64, device}); }

template <typename T>
void segmented_sort(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending,
                    cudaStream_t stream) {
  using K = SortKey<T>;
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1), n = rows * L;
  FRUGAL_CHECK(n < (int64_t(1) << 31), "sort: CUDA rows of more than ", kBlockRow, " elements are sorted by cub, ",
               "which takes under 2^31 elements in all; got ", rows, " rows of ", L);
  const Tensor keys_in = scratch(n * int64_t(sizeof(K)), x.device()),
               keys_out = scratch(n * int64_t(sizeof(K)), x.device());
  const Tensor pos_in = empty({n}, {kInt64, x.device()}), pos_out = empty({n}, {kInt64, x.device()});
  const Tensor offsets = empty({rows + 1}, {kInt64, x.device()});
  auto* kin = reinterpret_cast<K*>(keys_in.data_ptr<int64_t>());
  auto* kout = reinterpret_cast<K*>(keys_out.data_ptr<int64_t>());
  keys_kernel<T>
      <<<grid_for(n), kBlockSize, 0, stream>>>(kin, pos_in.data_ptr<int64_t>(), x.data_ptr<T>(), L, n, descending);
  FRUGAL_CUDA_CHECK_LAUNCH();
  offsets_kernel<<<grid_for(rows + 1), kBlockSize, 0, stream>>>(offsets.data_ptr<int64_t>(), L, rows);
  FRUGAL_CUDA_CHECK_LAUNCH();
  const int64_t* begin = offsets.data_ptr<int64_t>();
  size_t temp_bytes = 0;
  FRUGAL_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(nullptr, temp_bytes, kin, kout,
                                                              pos_in.data_ptr<int64_t>(), pos_out.data_ptr<int64_t>(),
                                                              n, rows, begin, begin + 1, stream));
  const Tensor temp = scratch(int64_t(temp_bytes), x.device());
  FRUGAL_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(temp.data_ptr<int64_t>(), temp_bytes, kin, kout,
                                                              pos_in.data_ptr<int64_t>(), pos_out.data_ptr<int64_t>(),
                                                              n, rows, begin, begin + 1, stream));
  const int64_t out = rows * k;
  gather_kernel<T><<<grid_for(out), kBlockSize, 0, stream>>>(values_or_null<T>(values), indices.data_ptr<int64_t>(),
                                                             x.data_ptr<T>(), pos_out.data_ptr<int64_t>(), L, k, out);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending) {
  DeviceGuard guard(x.device());
  const cudaStream_t stream = stream_for(x);
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1);
  dispatch_numeric(x.dtype(), "sort", x.device(), [&]<typename T>() {
    if (L > kBlockRow) return segmented_sort<T>(values, indices, x, descending, stream);
    int32_t P = 1;
    while (P < L) P <<= 1;
    const size_t shared = size_t(P) * (sizeof(SortKey<T>) + sizeof(int32_t));
    const int threads = P < 1024 ? (P < 32 ? 32 : P) : 1024;
    block_sort_kernel<T><<<unsigned(rows), threads, shared, stream>>>(
        values_or_null<T>(values), indices.data_ptr<int64_t>(), x.data_ptr<T>(), int32_t(L), P, int32_t(k), descending);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
