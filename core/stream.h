#pragma once
// Streams. A Stream is an opaque cudaStream_t plus its device, so headers that
// CPU-only code includes stay free of CUDA. Every device has a thread-local
// "current stream" (the legacy default stream unless set), as in PyTorch.
#include "core/device.h"

namespace frugal {

struct Stream {
  void* handle = nullptr;  // cudaStream_t; nullptr = the legacy default stream (and the CPU)
  Device device = kCPU;
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle == b.handle && a.device == b.device; }
};

/// The stream work on `device` is issued to from this thread.
Stream current_stream(Device device);
/// Makes `s` current for its device on this thread.
void set_current_stream(Stream s);

/// Sets the current stream for its scope, restores the previous one after.
class StreamGuard {
 public:
  explicit StreamGuard(Stream s) : prev_(current_stream(s.device)) { set_current_stream(s); }
  ~StreamGuard() { set_current_stream(prev_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

/// Blocks the host until all work on `device` is done (no-op on the CPU), then runs
/// the synchronize hook: memory/ resolves its deferred checks there (Note [Deferred
/// index checks] in memory/deferred_checks.h).
void synchronize(Device device);

namespace core {
/// cudaDeviceSynchronize on device `index` (already checked), without the hook: for
/// waits where an unrelated deferred error would be a surprise (a profiler stop).
void cuda_synchronize(int index);

/// What a side stream is for: each purpose has a stream of its own on each device.
enum class SideStream : int { Offload, GraphCapture };
/// The non-blocking stream of `device` for `purpose`, made on first use and never destroyed:
/// the allocator keys blocks by its handle and may free them at any time (Note [Stream-aware
/// reuse]), and a destroyed stream's handle could come back as a new stream's.
Stream side_stream(Device device, SideStream purpose);

/// What synchronize(device) calls once the device is idle. One hook per process;
/// installing another replaces it (nullptr removes it).
using SynchronizeHook = void (*)(Device device);
void set_synchronize_hook(SynchronizeHook hook);
}  // namespace core

}  // namespace frugal
