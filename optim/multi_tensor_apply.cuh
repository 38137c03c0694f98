#pragma once
// The device side of Note [Multi-tensor launch] (optim/multi_tensor.h): uploading
// an entry table, finding a block's entry, and 4-wide vector access. Include only
// from .cu files.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memory/allocator.h"
#include "memory/cuda_check.h"
#include "optim/multi_tensor.h"
#include "tensor/cuda/cuda_utils.h"

namespace frugal::optim::cuda {

using ops::cuda::DeviceGuard;
using ops::cuda::stream_for;

constexpr int kThreads = 256;
/// Blocks per launch at most: 132 SMs (H100/H200) x 8 resident blocks of 256 threads.
constexpr int64_t kMaxBlocks = 132 * 8;

/// An entry table in device memory, alive until the kernels queued on the current
/// stream that read it have run (the arena reuses it only on this stream).
template <typename Entry>
struct DeviceTable {
  DataPtr memory;
  const Entry* entries = nullptr;
  int count = 0;
  int64_t chunks = 0;  // total chunks over every entry
};

/// Numbers the chunks (sets chunk_begin) and copies the table to `device` with one
/// cudaMemcpyAsync from pinned host memory, on the current stream.
template <typename Entry>
DeviceTable<Entry> upload(Device device, std::vector<Entry>& entries) {
  DeviceTable<Entry> t;
  for (Entry& e : entries) {
    e.chunk_begin = t.chunks;
    t.chunks += (e.numel + detail::kChunk - 1) / detail::kChunk;
  }
  t.count = int(entries.size());
  const size_t bytes = entries.size() * sizeof(Entry);
  const Stream stream = current_stream(device);
  DataPtr staging = memory::allocate_pinned(bytes);
  std::memcpy(staging.get(), entries.data(), bytes);
  t.memory = memory::allocate(device, bytes, stream);
  FRUGAL_CUDA_CHECK(cudaMemcpyAsync(t.memory.get(), staging.get(), bytes, cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(stream.handle)));
  memory::record_stream(staging, stream);  // the pinned block is reused only after the copy
  t.entries = static_cast<const Entry*>(t.memory.get());
  return t;
}

/// Blocks for a table: one per chunk, at most kMaxBlocks (then grid-stride).
template <typename Entry>
unsigned blocks_for(const DeviceTable<Entry>& t) {
  return unsigned(std::clamp<int64_t>(t.chunks, 1, kMaxBlocks));
}

/// The entry holding global chunk `chunk`: the last one whose chunk_begin <= chunk
/// (every entry has at least one chunk, so chunk_begin strictly increases).
template <typename Entry>
__device__ __forceinline__ int find_entry(const Entry* entries, int count, int64_t chunk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (entries[mid].chunk_begin <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/// Four consecutive elements, loaded and stored as one vector access.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

/// True when `p` may be accessed as Vec4<T> (every chunk starts at a multiple of 4).
template <typename T>
inline bool vec4_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

template <typename T>
__device__ __forceinline__ Vec4<T> load4(const void* base, int64_t i) {
  return reinterpret_cast<const Vec4<T>*>(static_cast<const T*>(base) + i)[0];
}
template <typename T>
__device__ __forceinline__ void store4(void* base, int64_t i, const Vec4<T>& v) {
  reinterpret_cast<Vec4<T>*>(static_cast<T*>(base) + i)[0] = v;
}

}  // namespace frugal::optim::cuda
