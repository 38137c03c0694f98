#pragma once
// CUDA-event timing for the benchmark programs (CUDA builds only): the median GPU time
// of the work a callable queues on the current stream, after untimed warm-up calls; and the
// peak memory a callable adds.
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "core/cuda_check.h"
#include "core/device.h"
#include "core/stream.h"
#include "memory/allocator.h"

namespace frugal::bench {

/// The current stream of `device` as a cudaStream_t.
inline cudaStream_t cuda_stream(Device device) { return static_cast<cudaStream_t>(current_stream(device).handle); }

/// Median GPU milliseconds of the work `fn()` queues on `device`'s current stream; one
/// pair of CUDA events, reused across calls.
class GpuTimer {
 public:
  explicit GpuTimer(Device device = cuda(0)) : device_(device) {
    FRUGAL_CUDA_CHECK(cudaEventCreate(&start_));
    FRUGAL_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~GpuTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  /// After `warmup` untimed calls, the median of `reps` timed ones.
  template <typename F>
  double median_ms(F&& fn, int warmup, int reps) {
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<double> t(static_cast<size_t>(reps));
    for (auto& x : t) {
      FRUGAL_CUDA_CHECK(cudaEventRecord(start_, cuda_stream(device_)));
      fn();
      FRUGAL_CUDA_CHECK(cudaEventRecord(stop_, cuda_stream(device_)));
      FRUGAL_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      FRUGAL_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      x = ms;
    }
    return median(std::move(t));
  }

 private:
  Device device_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

/// GpuTimer::median_ms with a timer of its own, on cuda(0).
template <typename F>
double gpu_median_ms(F&& fn, int warmup, int reps) {
  GpuTimer timer;
  return timer.median_ms(std::forward<F>(fn), warmup, reps);
}

/// Peak bytes allocated on `device` beyond what was live before `fn()` ran.
template <typename F>
int64_t peak_extra_bytes(Device device, F&& fn) {
  synchronize(device);
  const int64_t before = memory::stats(device).allocated_bytes.current;
  memory::reset_peak(device);
  fn();
  synchronize(device);
  return memory::stats(device).allocated_bytes.peak - before;
}

}  // namespace frugal::bench
