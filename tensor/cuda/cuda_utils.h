#pragma once
// Helpers shared by every CUDA kernel file: the device guard, the current stream
// and launch sizes. Include only from .cu files.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/stream.h"
#include "tensor/tensor.h"

namespace frugal::ops::cuda {

/// Makes `device` current for its scope (ops may run on any GPU of the process); a CPU
/// device leaves the current one as it is.
class DeviceGuard : public CudaDeviceGuard {
 public:
  explicit DeviceGuard(Device d) : CudaDeviceGuard(d.is_cuda() ? d.index : -1) {}
};

inline cudaStream_t stream_for(Device d) { return static_cast<cudaStream_t>(current_stream(d).handle); }
inline cudaStream_t stream_for(const Tensor& t) { return stream_for(t.device()); }

/// t's data as T, or nullptr for an undefined tensor (an optional kernel operand).
template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mut_ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

/// The largest power of two, at most `cap`, dividing the address: the alignment a library
/// (cuBLASLt, cuDNN) may assume of an operand, and so part of a cached plan's identity.
inline int64_t pointer_alignment(const void* p, int64_t cap) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t align = 1;
  while (align < cap && a % uintptr_t(align * 2) == 0) align *= 2;
  return align;
}

/// The current device's SM count (132 on an H200), asked once per device.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0;
  FRUGAL_CUDA_CHECK(cudaGetDevice(&device));
  int n = device < kMaxDevices ? counts[device].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    FRUGAL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    if (device < kMaxDevices) counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

/// The most blocks worth launching for a grid-stride loop: `per_sm` on every SM of the
/// current device (more only queue behind those).
inline int64_t max_blocks(int per_sm) { return int64_t(sm_count()) * per_sm; }

constexpr int kBlockSize = 256;

/// Blocks for a grid-stride loop over `n` work items: enough to fill the GPU, no more.
inline unsigned grid_for(int64_t n, int block = kBlockSize) {
  const int64_t blocks = (n + block - 1) / block;
  return unsigned(std::clamp<int64_t>(blocks, 1, max_blocks(32)));  // 32 resident blocks per SM
}

}  // namespace frugal::ops::cuda
