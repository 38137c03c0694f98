// Timing events for the profiler's op records (core/instrument.h): unlike
// the allocator's events (cudaEventDisableTiming, cheaper to record) these keep
// timestamps. Pooled per device, since a training step records two per op.
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "core/cuda_check.h"
#include "core/instrument.h"
#include "core/stream.h"

namespace frugal::core {
namespace {

struct TimingEvent {
  cudaEvent_t event;
  int device;
};

class TimingEventPool {
 public:
  TimingEvent* acquire(int device) {
    {
      std::lock_guard lock(mutex_);
      if (free_.size() <= static_cast<size_t>(device)) free_.resize(device + 1);
      if (!free_[device].empty()) {
        TimingEvent* e = free_[device].back();
        free_[device].pop_back();
        return e;
      }
    }
    auto* e = new TimingEvent{nullptr, device};
    FRUGAL_CUDA_CHECK(cudaEventCreate(&e->event));  // on the current device, which the caller set
    return e;
  }

  void release(TimingEvent* e) {
    std::lock_guard lock(mutex_);
    free_[e->device].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<TimingEvent*>> free_;  // by device
};

TimingEventPool& pool() {
  static auto* p = new TimingEventPool;  // leaked: events may be released during static destruction
  return *p;
}

}  // namespace

void* record_timing_event(Device device) {
  int previous = 0;
  FRUGAL_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device.index) FRUGAL_CUDA_CHECK(cudaSetDevice(device.index));
  TimingEvent* e = pool().acquire(device.index);
  const cudaError_t err = cudaEventRecord(e->event, static_cast<cudaStream_t>(current_stream(device).handle));
  if (previous != device.index) (void)cudaSetDevice(previous);
  if (err != cudaSuccess) {
    pool().release(e);
    FRUGAL_CUDA_CHECK(err);
  }
  return e;
}

double timing_event_elapsed_ms(void* start, void* end) {
  float ms = 0.0f;
  FRUGAL_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<TimingEvent*>(start)->event, static_cast<TimingEvent*>(end)->event));
  return ms;
}

void release_timing_event(void* event) { pool().release(static_cast<TimingEvent*>(event)); }

}  // namespace frugal::core
