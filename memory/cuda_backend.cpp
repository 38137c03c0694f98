// CUDA memory for the caching allocator: cudaMalloc'd device segments, the pinned
// host pool's cudaHostAlloc'd segments, and the events that make cross-stream
// reuse safe (Note [Stream-aware reuse] in memory/caching_allocator.h); and the
// copies and events that bring deferred checks' records to the host (Note
// [Deferred index checks] in memory/deferred_checks.h). Compiled
// only in CUDA builds; cuda_absent.cpp stands in for it otherwise.
#include <cuda_runtime.h>

#include <vector>

#include "core/cuda_check.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/deferred_checks.h"

namespace frugal::memory::detail {

namespace {

// cudaMalloc and cudaHostAlloc report a full device as cudaErrorMemoryAllocation,
// which the allocator answers by freeing its cache; anything else is a real error.
void* null_if_out_of_memory(cudaError_t err, void* ptr, const char* expr) {
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess) ::frugal::detail::throw_cuda_error(err, expr, __FILE__, __LINE__);
  return ptr;
}

// Events are created once and reused: cudaEventCreate costs microseconds, and a
// multi-stream program records one for every cross-stream block it frees. An
// event must be recorded on a stream of the device it was created on, so the pool
// keeps one free list per device. Used under the owning allocator's lock.
class EventPool {
 public:
  struct Event {
    cudaEvent_t event;
    int device;
  };

  void* record(Stream stream) {
    const int device = stream.device.index;
    CudaDeviceGuard guard(device);
    if (free_.size() <= static_cast<size_t>(device)) free_.resize(device + 1);
    Event* e;
    if (free_[device].empty()) {
      e = new Event{nullptr, device};
      FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
    } else {
      e = free_[device].back();
      free_[device].pop_back();
    }
    FRUGAL_CUDA_CHECK(cudaEventRecord(e->event, static_cast<cudaStream_t>(stream.handle)));
    return e;
  }

  static bool completed(void* event) { return cuda_event_done(static_cast<Event*>(event)->event); }

  static void wait(void* event) { FRUGAL_CUDA_CHECK(cudaEventSynchronize(static_cast<Event*>(event)->event)); }

  void release(void* event) {
    auto* e = static_cast<Event*>(event);
    free_[e->device].push_back(e);
  }

 private:
  std::vector<std::vector<Event*>> free_;  // by device
};

class CudaDeviceBackend final : public RawBackend {
 public:
  explicit CudaDeviceBackend(int index) : index_(index) {}

  void* allocate_segment(size_t nbytes) override {
    CudaDeviceGuard guard(index_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);  // before reading p: argument order is unspecified
    return null_if_out_of_memory(err, p, "cudaMalloc(&p, nbytes)");
  }

  void free_segment(void* base, size_t) override {
    CudaDeviceGuard guard(index_);
    FRUGAL_CUDA_CHECK(cudaFree(base));
  }

  size_t total_memory() const override {
    CudaDeviceGuard guard(index_);
    size_t free = 0, total = 0;
    FRUGAL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total;
  }

  std::string memory_info() const override {
    CudaDeviceGuard guard(index_);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return "device free/total n/a";
    }
    return "device free " + format_bytes(static_cast<int64_t>(free)) + " / total " +
           format_bytes(static_cast<int64_t>(total));
  }

  void* record_event(Stream stream) override { return events_.record(stream); }
  bool event_completed(void* event) override { return EventPool::completed(event); }
  void wait_event(void* event) override { EventPool::wait(event); }
  void release_event(void* event) override { events_.release(event); }

 private:
  int index_;
  EventPool events_;
};

// Page-locked host memory, portable so that every device's copies run async from it.
class PinnedHostBackend final : public RawBackend {
 public:
  void* allocate_segment(size_t nbytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);  // before reading p
    return null_if_out_of_memory(err, p, "cudaHostAlloc(&p, nbytes, cudaHostAllocPortable)");
  }

  void free_segment(void* base, size_t) override { FRUGAL_CUDA_CHECK(cudaFreeHost(base)); }

  size_t total_memory() const override { return host_physical_memory(); }
  std::string memory_info() const override { return host_memory_info(); }

  void* record_event(Stream stream) override { return events_.record(stream); }
  bool event_completed(void* event) override { return EventPool::completed(event); }
  void wait_event(void* event) override { EventPool::wait(event); }
  void release_event(void* event) override { events_.release(event); }

 private:
  EventPool events_;
};

// A deferred check's record: an asynchronous copy into its pinned slot, then an event.
// Events belong to a device, and a null stream handle means the current device's legacy
// stream: both calls run with the check's device current.
class CudaCheckTransport final : public CheckTransport {
 public:
  explicit CudaCheckTransport(int index) : index_(index) {}

  void* create_event() override {
    CudaDeviceGuard guard(index_);
    cudaEvent_t e = nullptr;
    FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void copy_record(Stream stream, const void* record, int64_t* slot, void* event) override {
    CudaDeviceGuard guard(index_);
    auto s = static_cast<cudaStream_t>(stream.handle);
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(slot, record, 3 * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    FRUGAL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), s));
  }

  bool completed(void* event) override { return cuda_event_done(static_cast<cudaEvent_t>(event)); }

  void copy_record_on_device(Stream stream, const void* record, void* copy) override {
    CudaDeviceGuard guard(index_);
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(copy, record, 3 * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                                      static_cast<cudaStream_t>(stream.handle)));
  }

 private:
  int index_;
};

}  // namespace

CachingAllocator& cuda_allocator(int index) {
  // One per device, created together on first use (creating one touches no GPU)
  // and never destroyed: DataPtrs in static objects may be freed during exit.
  static const std::vector<CachingAllocator*> allocators = [] {
    std::vector<CachingAllocator*> v;
    for (int i = 0; i < cuda_device_count(); ++i)
      v.push_back(new CachingAllocator(cuda(i).str(), cuda(i), make_cuda_device_backend(i)));
    return v;
  }();
  return *allocators.at(static_cast<size_t>(index));
}

std::unique_ptr<RawBackend> make_cuda_device_backend(int index) { return std::make_unique<CudaDeviceBackend>(index); }

std::unique_ptr<RawBackend> make_pinned_backend(bool* page_locked) {
  *page_locked = cuda_device_count() > 0;
  if (!*page_locked) return make_cpu_backend();  // CUDA build on a machine without a GPU
  return std::make_unique<PinnedHostBackend>();
}

std::unique_ptr<CheckTransport> make_cuda_check_transport(int index) {
  return std::make_unique<CudaCheckTransport>(index);
}

}  // namespace frugal::memory::detail
