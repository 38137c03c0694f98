#pragma once
// Internal: where the caching allocator gets its segments. A RawBackend is the
// thin, slow, system-facing layer (mmap, cudaMalloc, cudaHostAlloc, CUDA events);
// the caching allocator above it owns all policy. Also declares the few entry
// points that cuda_backend.cpp provides in CUDA builds and cuda_absent.cpp
// otherwise, so no file compiled without CUDA sees a CUDA header.
#include <cstddef>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/stream.h"

namespace frugal::memory::detail {

class CachingAllocator;

class RawBackend {
 public:
  virtual ~RawBackend() = default;

  /// A fresh segment of `nbytes`, or nullptr when the system has no memory for it
  /// (not an error: the allocator frees its cache and retries). Other failures throw.
  virtual void* allocate_segment(size_t nbytes) = 0;
  virtual void free_segment(void* base, size_t nbytes) = 0;

  /// Total memory of the device (physical RAM for host backends): the base of set_memory_fraction.
  virtual size_t total_memory() const = 0;
  /// "device free 3.10 GiB / total 139.80 GiB" or "n/a", for out-of-memory messages.
  virtual std::string memory_info() const = 0;

  // Events, for blocks used on several streams (see Note [Stream-aware reuse]).
  // Host backends without CUDA never see a second stream, so these are not reached
  // there; they answer as for work that has already completed.

  /// An event recorded now on `stream`: complete once all work queued there so far is.
  virtual void* record_event(Stream stream) = 0;
  virtual bool event_completed(void* event) = 0;
  virtual void wait_event(void* event) = 0;
  /// Returns the event to the backend (it may be pooled for reuse).
  virtual void release_event(void* event) = 0;
};

/// Page-aligned host segments from mmap (see Note [Host segments from mmap] in cpu_backend.cpp).
std::unique_ptr<RawBackend> make_cpu_backend();
/// Physical RAM in bytes, and "host free X / total Y" for messages.
size_t host_physical_memory();
std::string host_memory_info();

// ---- Provided by cuda_backend.cpp (CUDA builds) or cuda_absent.cpp -------------------

/// The caching allocator of CUDA device `index` (already checked), created on first use.
CachingAllocator& cuda_allocator(int index);
/// The pinned pool's backend: cudaHostAlloc with a GPU present, else host memory.
std::unique_ptr<RawBackend> make_pinned_backend(bool* page_locked);
/// cudaMalloc'd segments and pooled events on device `index` (CUDA builds only:
/// for tests that want a private allocator over a real device).
std::unique_ptr<RawBackend> make_cuda_device_backend(int index);

}  // namespace frugal::memory::detail
