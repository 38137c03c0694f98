// Current streams. Each thread keeps one current stream per CUDA device, as an
// opaque handle, so this file needs no CUDA header; a null handle means the legacy
// default stream. The host has a single stream, {nullptr, kCPU}.
#include "core/stream.h"

#include <atomic>

#include "core/error.h"
#include "core/graph_capture.h"

namespace frugal {

namespace {
constexpr int kMaxCudaDevices = 64;
thread_local void* current_handles[kMaxCudaDevices] = {};
std::atomic<core::SynchronizeHook> synchronize_hook{nullptr};

void check_stream_device(Device device, const char* op) {
  core::check_cuda_device(device, op);
  FRUGAL_CHECK(device.index < kMaxCudaDevices, op, ": ", device.str(), " is beyond the ", kMaxCudaDevices,
               " CUDA devices frugal supports");
}
}  // namespace

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream{nullptr, kCPU};
  check_stream_device(device, "current_stream");
  return Stream{current_handles[device.index], device};
}

void set_current_stream(Stream s) {
  if (s.device.is_cpu()) {
    FRUGAL_CHECK(s.handle == nullptr, "set_current_stream: the CPU has one stream; got a non-null handle for it");
    return;
  }
  check_stream_device(s.device, "set_current_stream");
  current_handles[s.device.index] = s.handle;
}

void synchronize(Device device) {
  if (device.is_cpu()) return;  // host work is done when the call that issued it returns
  core::refuse_in_graph_capture("synchronize (or a host read of a device value: item(), tolist(), cpu())",
                                "the host would wait for work that is only being recorded");
  check_stream_device(device, "synchronize");
  core::cuda_synchronize(device.index);
  // memory/ resolves its deferred checks here: all of them have completed now
  // (Note [Deferred index checks] in memory/deferred_checks.h).
  if (const core::SynchronizeHook hook = synchronize_hook.load(std::memory_order_acquire)) hook(device);
}

void core::set_synchronize_hook(SynchronizeHook hook) { synchronize_hook.store(hook, std::memory_order_release); }

}  // namespace frugal
