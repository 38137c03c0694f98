#pragma once
// The device side of Note [Multi-tensor launch] (optim/multi_tensor.h): uploading
// an entry table, finding a block's entry, and 4-wide vector access. Include only
// from .cu files.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cuda_check.h"
#include "memory/allocator.h"
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

/// The entry holding global chunk `chunk`: the last one whose chunk_begin <= chunk. An empty
/// entry (no chunk: an empty parameter with a device step count) shares its chunk_begin with
/// the entry after it, or is past the last chunk, so it is never the last such entry.
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

/// Grid-strides over the table's chunks: f(e, chunk, begin, n) for each chunk of this
/// block, e the chunk's entry and [begin, begin + n) the elements of e it covers.
template <typename Entry, typename F>
__device__ __forceinline__ void for_each_chunk(const Entry* entries, int count, int64_t chunks, F&& f) {
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const Entry e = entries[find_entry(entries, count, chunk)];  // a copy: stores below cannot alias it
    const int64_t begin = (chunk - e.chunk_begin) * detail::kChunk;
    const int64_t n = e.numel - begin < detail::kChunk ? e.numel - begin : detail::kChunk;
    f(e, chunk, begin, n);
  }
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

/// Sets each NormEntry's flags to kVec4 when its data may be accessed as Vec4<T>.
template <typename T>
void mark_vec4(std::vector<detail::NormEntry>& entries) {
  for (detail::NormEntry& e : entries) e.flags = vec4_aligned<T>(e.data) ? detail::kVec4 : 0u;
}

template <typename T>
__device__ __forceinline__ Vec4<T> load4(const void* base, int64_t i) {
  return reinterpret_cast<const Vec4<T>*>(static_cast<const T*>(base) + i)[0];
}
template <typename T>
__device__ __forceinline__ void store4(void* base, int64_t i, const Vec4<T>& v) {
  reinterpret_cast<Vec4<T>*>(static_cast<T*>(base) + i)[0] = v;
}

/// Uploads `entries` and launches kernel(entries, count, chunks, args...) over them on
/// the current stream: blocks_for(table) blocks of kThreads, one fused launch. Returns the
/// table, for a kernel queued after it on the same stream to read too.
template <typename Entry, typename... Params>
DeviceTable<Entry> launch_fused(Device device, std::vector<Entry>& entries,
                                void (*kernel)(const Entry*, int, int64_t, Params...),
                                std::type_identity_t<Params>... args) {
  DeviceTable<Entry> table = upload(device, entries);  // (not const: returned by move)
  kernel<<<blocks_for(table), kThreads, 0, stream_for(device)>>>(table.entries, table.count, table.chunks, args...);
  FRUGAL_CUDA_CHECK_LAUNCH();
  detail::count_fused_launch();
  return table;
}

}  // namespace frugal::optim::cuda
