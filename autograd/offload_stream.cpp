// The side streams and events of offloaded saved tensors (Note [Offloaded saved tensors] in
// autograd/offload.cpp). CUDA builds only: autograd/offload.cpp calls these for CUDA tensors.
#include "autograd/offload_stream.h"

#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_check.h"

namespace frugal::autograd::detail {

namespace {

constexpr int kMaxDevices = 64;

// An event of one device; `timing` ones keep timestamps (the stall probes), the others are
// cheaper to record (the copies' completion).
struct Event {
  cudaEvent_t event;
  int device;
  bool timing;
};

// Created once and reused (cudaEventCreate costs microseconds; a block records a few per
// saved tensor). Each free list holds events of one device and kind.
class EventPool {
 public:
  // An event recorded now on `stream` (of the current device, which is `device`).
  Event* record(int device, bool timing, cudaStream_t stream) {
    Event* e = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[device][timing];
      if (!free.empty()) {
        e = free.back();
        free.pop_back();
      }
    }
    if (!e) {
      e = new Event{nullptr, device, timing};
      FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&e->event, timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    FRUGAL_CUDA_CHECK(cudaEventRecord(e->event, stream));
    return e;
  }

  void release(Event* e) {
    std::lock_guard lock(mutex_);
    free_[e->device][e->timing].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<Event*> free_[kMaxDevices][2];
};

EventPool& events() {
  static auto* pool = new EventPool;  // leaked: events may come back during static destruction
  return *pool;
}

// Stall probes recorded around waits and not read yet: (before the wait, after it).
std::mutex probes_mutex;
std::vector<std::pair<Event*, Event*>> pending_probes;

cudaStream_t current(Device device) { return static_cast<cudaStream_t>(current_stream(device).handle); }

}  // namespace

Stream offload_stream(Device device) { return core::side_stream(device, core::SideStream::Offload); }

void* copy_on_offload_stream(void* dst, const void* src, size_t nbytes, Device device) {
  const auto side = static_cast<cudaStream_t>(offload_stream(device).handle);
  CudaDeviceGuard guard(device.index);
  // The side stream starts after what the compute stream has queued so far.
  Event* queued = events().record(device.index, /*timing=*/false, current(device));
  FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(side, queued->event, 0));
  events().release(queued);  // the wait took its state; the event may be recorded again
  FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, side));
  return events().record(device.index, /*timing=*/false, side);
}

void wait_on_current_stream(void* event, Device device) {
  auto* copied = static_cast<Event*>(event);
  CudaDeviceGuard guard(device.index);
  if (cuda_event_done(copied->event)) return;  // nothing left to wait for
  const cudaStream_t compute = current(device);
  Event* before = events().record(device.index, /*timing=*/true, compute);
  FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(compute, copied->event, 0));
  Event* after = events().record(device.index, /*timing=*/true, compute);
  std::lock_guard lock(probes_mutex);
  pending_probes.emplace_back(before, after);
}

void wait_on_current_stream_untimed(void* event, Device device) {
  CudaDeviceGuard guard(device.index);
  FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(current(device), static_cast<Event*>(event)->event, 0));
}

void wait_on_host(void* event) {
  auto* copied = static_cast<Event*>(event);
  CudaDeviceGuard guard(copied->device);
  FRUGAL_CUDA_CHECK(cudaEventSynchronize(copied->event));
}

double take_stall_ms() {
  std::vector<std::pair<Event*, Event*>> probes;
  {
    std::lock_guard lock(probes_mutex);
    probes.swap(pending_probes);
  }
  double total = 0;
  for (auto [before, after] : probes) {
    CudaDeviceGuard guard(before->device);
    FRUGAL_CUDA_CHECK(cudaEventSynchronize(after->event));
    float ms = 0;
    FRUGAL_CUDA_CHECK(cudaEventElapsedTime(&ms, before->event, after->event));
    total += ms;
    events().release(before);
    events().release(after);
  }
  return total;
}

void release_event(void* event) { events().release(static_cast<Event*>(event)); }

}  // namespace frugal::autograd::detail
