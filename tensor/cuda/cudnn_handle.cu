// cuDNN handles, one per device and thread.
//
// Note [cuDNN handles]
// As with cuBLAS (Note [cuBLAS handles]): a cuDNN handle is costly to create and must
// not be used by two threads at once, so each thread leases one handle per device on
// first use from a process-wide pool and gives it back when the thread exits. The pool
// is never destroyed (handles outlive the CUDA runtime's teardown otherwise). The
// handle is bound to the device's current stream on every call, since the caller may
// have switched streams. cuDNN takes its workspace per call, so the handle holds none:
// callers take workspaces from the arena (see tensor/cuda/conv.cu).
#include <array>
#include <mutex>
#include <vector>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_handle.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kMaxDevices = 64;

/// Idle handles per device; lives for the whole process.
class HandlePool {
 public:
  cudnnHandle_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& idle = idle_[size_t(device)];
      if (!idle.empty()) {
        cudnnHandle_t h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    FRUGAL_CUDNN_CHECK(cudnnCreate(&h));  // on the current device, which the caller's DeviceGuard set
    return h;
  }
  void release(int device, cudnnHandle_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_[size_t(device)].push_back(h);
  }

 private:
  std::mutex mu_;
  std::array<std::vector<cudnnHandle_t>, kMaxDevices> idle_;
};

HandlePool& pool() {
  static auto* p = new HandlePool();  // never destroyed, see Note [cuDNN handles]
  return *p;
}

/// This thread's leases; given back when the thread exits.
struct ThreadHandles {
  std::array<cudnnHandle_t, kMaxDevices> handles{};
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d)
      if (handles[size_t(d)]) pool().release(d, handles[size_t(d)]);
  }
};

}  // namespace

namespace detail {
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof(last));  // cuDNN's detail on the failure, possibly empty
  ::frugal::detail::throw_error(
      file, line,
      ::frugal::detail::str_cat("cuDNN error ", cudnnGetErrorString(status), " in ", expr, last[0] ? ": " : "", last));
}
}  // namespace detail

cudnnHandle_t cudnn_handle(Device device) {
  FRUGAL_CHECK(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
               "cuDNN: expected a CUDA device with index below ", kMaxDevices, ", got ", device.str());
  thread_local ThreadHandles leases;
  cudnnHandle_t& h = leases.handles[size_t(device.index)];
  if (!h) h = pool().acquire(device.index);
  FRUGAL_CUDNN_CHECK(cudnnSetStream(h, stream_for(device)));
  return h;
}

}  // namespace frugal::ops::cuda
