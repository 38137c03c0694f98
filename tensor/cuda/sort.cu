// The CUDA sort (Note [Sort order] in tensor/ops/sort.h).
//
// Note [CUDA sort paths]
// Every path orders (key, index) pairs (Note [Sort keys] in tensor/ops/sort_key.h, the CPU's
// keys) by key, then index, which gives the one order Note [Sort order] defines:
//  - rows of up to 256 elements: a block per row runs a bitonic network over the pairs in shared
//    memory (padding keys sort last), comparing keys then indices;
//  - rows of up to 4096: a block per row runs cub's BlockRadixSort over the keys, carrying the
//    indices; a radix sort is stable, and the keys enter in index order (a blocked arrangement),
//    so equal keys keep index order;
//  - longer rows: topk of a small k in two block sorts (Note [CUDA topk of long rows]); else
//    cub's device-wide radix sort of every key, carrying its global position, then
//    (more than one row) a second stable radix sort by row number, which groups the rows and
//    keeps each one's key order. PyTorch's CUDA sort does the same for its large segments.
// Each path then writes the first k values (the input's elements themselves, so NaN payloads and
// -0 survive) and indices. A 16-bit type's keys come from floats whose low 13 (float16) or 16
// (bfloat16) bits are alike across values (zeros, or all ones once complemented), so the radix
// sorts skip those bits: fewer passes, the same order.
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/sort.h"
#include "tensor/ops/sort_key.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kBitonicRow = 256;  // longest row of the bitonic network
constexpr int kBlockRow = 4096;   // longest row of the block radix sort

/// The first key bit that can differ between two values of T (see the Note).
template <typename T>
constexpr int key_begin_bit() {
  if constexpr (std::is_same_v<T, Half>) return 13;
  else if constexpr (std::is_same_v<T, BFloat16>) return 16;
  else return 0;
}

// One block per row: a bitonic sort of P = next power of two >= L pairs in shared memory.
template <typename T>
__global__ void bitonic_sort_kernel(T* __restrict__ values, int64_t* __restrict__ indices, const T* __restrict__ x,
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

// What a block radix sort block sorts: segment s of row r, elements [s * segment, +segment) of the
// row (the last one shorter), writing its first k pairs at block (r * segments + s).
template <typename T>
struct SegmentSort {
  T* values;                 // (blocks, k), or null (argsort: indices only)
  int64_t* indices;          // (blocks, k)
  const T* x;                // row r at x + r * row_stride
  const int64_t* index_map;  // null: an element's index is its position in the row; else index_map[its offset in x]
  int64_t row_stride;
  int32_t length, segment, segments, k;
  bool descending;
};

// One block per segment of up to kThreads * kItems elements: cub's block radix sort of the keys,
// loaded in blocked arrangement (thread t holds elements t * kItems ...), so the sort's stability
// keeps equal keys in index order; the result comes back striped, for coalesced writes.
template <typename T, int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads) block_radix_sort_kernel(const SegmentSort<T> p) {
  using K = SortKey<T>;
  using Sorter = cub::BlockRadixSort<K, kThreads, kItems, int32_t>;
  __shared__ typename Sorter::TempStorage temp;
  const int64_t block = blockIdx.x, row = block / p.segments;
  const int32_t begin = int32_t(block % p.segments) * p.segment;
  const int32_t n = p.length - begin < p.segment ? p.length - begin : p.segment;
  const int64_t offset = row * p.row_stride + begin;
  const T* in = p.x + offset;
  K keys[kItems];
  int32_t pos[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t i = int32_t(threadIdx.x) * kItems + j;
    keys[j] = i < n ? sort_key(in[i], p.descending) : ~K(0);  // padding last, after equal real keys
    pos[j] = i;
  }
  Sorter(temp).SortBlockedToStriped(keys, pos, key_begin_bit<T>(), int(8 * sizeof(K)));
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t rank = j * kThreads + int32_t(threadIdx.x);
    if (rank < p.k) {
      const int64_t out = block * p.k + rank;
      if (p.values) p.values[out] = in[pos[j]];
      p.indices[out] = p.index_map ? p.index_map[offset + pos[j]] : int64_t(begin + pos[j]);
    }
  }
}

// Long rows: every element's key and global position.
template <typename T>
__global__ void keys_kernel(SortKey<T>* __restrict__ keys, int32_t* __restrict__ pos, const T* __restrict__ x,
                            int64_t n, bool descending) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = sort_key(x[i], descending);
    pos[i] = int32_t(i);
  }
}

// The row of each position in key order, the key of the second sort.
__global__ void row_of_kernel(int32_t* __restrict__ row, const int32_t* __restrict__ pos, int64_t L, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    row[i] = int32_t(pos[i] / L);
}

// Output (row, j) from the j-th global position of the row's run.
template <typename T>
__global__ void gather_kernel(T* __restrict__ values, int64_t* __restrict__ indices, const T* __restrict__ x,
                              const int32_t* __restrict__ pos, int64_t L, int64_t k, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / k, p = pos[row * L + i % k];
    if (values) values[i] = x[p];  // null: argsort
    indices[i] = p - row * L;
  }
}

/// values' data, or null for argsort's undefined values (the kernels then write indices only).
template <typename T>
T* values_or_null(const Tensor& values) {
  return values.defined() ? values.data_ptr<T>() : nullptr;
}

/// Scratch memory from the caching allocator, freed stream-ordered after the op's kernels.
Tensor scratch(int64_t bytes, Device device) { return empty({(bytes + 7) / 8}, {kInt64, device}); }
template <typename U>
U* scratch_ptr(const Tensor& t) {
  return reinterpret_cast<U*>(t.data_ptr<int64_t>());
}

template <typename T>
void device_radix_sort(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending,
                       cudaStream_t stream) {
  using K = SortKey<T>;
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1), n = rows * L;
  FRUGAL_CHECK(n < (int64_t(1) << 31), "sort: CUDA rows of more than ", kBlockRow, " elements are sorted by cub, ",
               "which takes under 2^31 elements in all; got ", rows, " rows of ", L);
  const Device device = x.device();
  const Tensor keys_in = scratch(n * int64_t(sizeof(K)), device), keys_out = scratch(n * int64_t(sizeof(K)), device);
  const Tensor pos_a = scratch(n * 4, device), pos_b = scratch(n * 4, device);
  K *kin = scratch_ptr<K>(keys_in), *kout = scratch_ptr<K>(keys_out);
  int32_t *pa = scratch_ptr<int32_t>(pos_a), *pb = scratch_ptr<int32_t>(pos_b);
  keys_kernel<T><<<grid_for(n), kBlockSize, 0, stream>>>(kin, pa, x.data_ptr<T>(), n, descending);
  FRUGAL_CUDA_CHECK_LAUNCH();
  // Rows as the second sort's keys, in the first's key buffers (no longer needed by then).
  int32_t *row_in = reinterpret_cast<int32_t*>(kin), *row_out = reinterpret_cast<int32_t*>(kout);
  const int row_bits = rows > 1 ? int(std::bit_width(uint64_t(rows - 1))) : 0;
  size_t by_key = 0, by_row = 0;
  FRUGAL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, by_key, kin, kout, pa, pb, n, key_begin_bit<T>(),
                                                    int(8 * sizeof(K)), stream));
  if (rows > 1)
    FRUGAL_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, by_row, row_in, row_out, pb, pa, n, 0, row_bits, stream));
  const Tensor temp = scratch(int64_t(std::max(by_key, by_row)), device);
  FRUGAL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch_ptr<void>(temp), by_key, kin, kout, pa, pb, n,
                                                    key_begin_bit<T>(), int(8 * sizeof(K)), stream));
  const int32_t* sorted = pb;
  if (rows > 1) {
    row_of_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(row_in, pb, L, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
    by_row = size_t(temp.numel()) * 8;
    FRUGAL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch_ptr<void>(temp), by_row, row_in, row_out, pb, pa, n, 0,
                                                      row_bits, stream));
    sorted = pa;
  }
  const int64_t out = rows * k;
  gather_kernel<T><<<grid_for(out), kBlockSize, 0, stream>>>(values_or_null<T>(values), indices.data_ptr<int64_t>(),
                                                             x.data_ptr<T>(), sorted, L, k, out);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

/// Runs the block radix sort over p's segments with the smallest block that holds `segment`.
template <typename T>
void launch_segment_sort(const SegmentSort<T>& p, int64_t blocks, cudaStream_t stream) {
  const auto launch = [&]<int kThreads, int kItems>() {
    block_radix_sort_kernel<T, kThreads, kItems><<<unsigned(blocks), kThreads, 0, stream>>>(p);
    FRUGAL_CUDA_CHECK_LAUNCH();
  };
  if (p.segment > 2048) launch.template operator()<512, 8>();
  else if (p.segment > 1024) launch.template operator()<256, 8>();
  else if (p.segment > 512) launch.template operator()<256, 4>();
  else launch.template operator()<128, 4>();
}

// Note [CUDA topk of long rows]
// topk of k values from a row longer than a block sorts runs in two passes instead of sorting the
// row: each block sorts one of the row's S segments (up to 4096 elements) and keeps its first k;
// a second block sort orders the row's S k candidates and keeps the first k. An element among the
// row's first k (by key, then index) is among its segment's first k, and the candidates stand in
// segment order, each segment's in (key, index) order, so equal keys stay in index order for the
// second, stable sort: the result is the full sort's. It serves while S k fits one block (k <= 512
// for a 32000-token vocabulary).

/// The two passes of the Note, or false (nothing launched) when k is too large for them.
template <typename T>
bool two_pass_topk(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending,
                   cudaStream_t stream) {
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1);
  const int64_t segments = (L + kBlockRow - 1) / kBlockRow, segment = (L + segments - 1) / segments;
  const int64_t shortest = L - (segments - 1) * segment, candidates = segments * k;
  if (!values.defined() || k == 0 || k > shortest || candidates > kBlockRow) return false;
  const Tensor cand_values = empty({rows, candidates}, {x.dtype(), x.device()});
  const Tensor cand_indices = empty({rows, candidates}, {kInt64, x.device()});
  launch_segment_sort<T>({cand_values.data_ptr<T>(), cand_indices.data_ptr<int64_t>(), x.data_ptr<T>(), nullptr, L,
                          int32_t(L), int32_t(segment), int32_t(segments), int32_t(k), descending},
                         rows * segments, stream);
  launch_segment_sort<T>({values.data_ptr<T>(), indices.data_ptr<int64_t>(), cand_values.data_ptr<T>(),
                          cand_indices.data_ptr<int64_t>(), candidates, int32_t(candidates), int32_t(candidates), 1,
                          int32_t(k), descending},
                         rows, stream);
  return true;
}

}  // namespace

void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending) {
  DeviceGuard guard(x.device());
  const cudaStream_t stream = stream_for(x);
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1);
  dispatch_numeric(x.dtype(), "sort", x.device(), [&]<typename T>() {
    if (L > kBlockRow) {
      if (!two_pass_topk<T>(values, indices, x, descending, stream))
        device_radix_sort<T>(values, indices, x, descending, stream);
      return;
    }
    if (L > kBitonicRow)
      return launch_segment_sort<T>({values_or_null<T>(values), indices.data_ptr<int64_t>(), x.data_ptr<T>(), nullptr,
                                     L, int32_t(L), int32_t(L), 1, int32_t(k), descending},
                                    rows, stream);
    int32_t P = 1;
    while (P < L) P <<= 1;
    const size_t shared = size_t(P) * (sizeof(SortKey<T>) + sizeof(int32_t));
    const int threads = P < 32 ? 32 : P;
    bitonic_sort_kernel<T><<<unsigned(rows), threads, shared, stream>>>(
        values_or_null<T>(values), indices.data_ptr<int64_t>(), x.data_ptr<T>(), int32_t(L), P, int32_t(k), descending);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
