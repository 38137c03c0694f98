// cuBLAS and cuBLASLt handles and workspaces, one set per device and thread.
//
// Note [cuBLAS handles]
// A cuBLAS handle is costly to make (milliseconds, and device memory) and must not
// be used by two threads at once; the stream and workspace it is bound to are state
// of the handle. So each thread leases one cuBLAS and one cuBLASLt handle per
// device on first use, from a process-wide pool, and gives them back to the pool
// when it exits: a thread pool reuses handles instead of creating new ones. The
// pool is never destroyed, so handles are never destroyed during process teardown,
// when the CUDA runtime may already be unloading (PyTorch leaks them for the same
// reason).
//
// cublas_handle(device) binds the handle to the device's current stream on every
// call, since the caller may have changed streams (cublasSetStream also resets the
// workspace, so the workspace is set after it). Each (thread, device, stream) gets
// its own workspace, a tensor from the arena on that stream: work queued on one
// stream never shares scratch memory with work on another. cuBLAS recommends 32 MiB
// on Hopper and 4 MiB before it.
//
// Math mode: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION keeps split-K partial
// sums of float16/bfloat16 products in float32, so the products accumulate in
// float32 from end to end (see Note [Half types compute in f32]). TF32 is chosen per
// call through the compute type (see tensor/cuda/matmul.cu), not through the handle.
#include <array>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/instrument.h"
#include "tensor/cuda/cublas_handle.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/factory.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kMaxDevices = 64;

/// Idle handles of one kind, per device; lives for the whole process.
template <typename Handle>
class HandlePool {
 public:
  Handle acquire(int device, cublasStatus_t (*create)(Handle*)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& idle = idle_[size_t(device)];
      if (!idle.empty()) {
        Handle h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    Handle h = nullptr;
    FRUGAL_CUBLAS_CHECK(create(&h));  // on the current device, which the caller's DeviceGuard set
    return h;
  }
  void release(int device, Handle h) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_[size_t(device)].push_back(h);
  }

 private:
  std::mutex mu_;
  std::array<std::vector<Handle>, kMaxDevices> idle_;
};

HandlePool<cublasHandle_t>& blas_pool() {
  static auto* pool = new HandlePool<cublasHandle_t>();  // never destroyed, see Note [cuBLAS handles]
  return *pool;
}
HandlePool<cublasLtHandle_t>& lt_pool() {
  static auto* pool = new HandlePool<cublasLtHandle_t>();
  return *pool;
}

size_t workspace_bytes(int device) {
  int major = 0;
  FRUGAL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9 ? size_t(32) << 20 : size_t(4) << 20;
}

/// This thread's leases; given back when the thread exits.
struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> blas{};
  std::array<cublasLtHandle_t, kMaxDevices> lt{};
  std::map<std::pair<int, void*>, Tensor> workspaces;  // (device, stream) -> bytes

  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (blas[size_t(d)]) blas_pool().release(d, blas[size_t(d)]);
      if (lt[size_t(d)]) lt_pool().release(d, lt[size_t(d)]);
    }
  }
};

ThreadHandles& thread_handles() {
  thread_local ThreadHandles handles;
  return handles;
}

int checked_index(Device device) {
  FRUGAL_CHECK(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
               "cuBLAS: expected a CUDA device with index below ", kMaxDevices, ", got ", device.str());
  return device.index;
}

}  // namespace

const char* cublas_status_name(cublasStatus_t status) { return cublasGetStatusName(status); }

namespace detail {
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  ::frugal::detail::throw_error(file, line,
                                ::frugal::detail::str_cat("cuBLAS error ", cublas_status_name(status), " (",
                                                          cublasGetStatusString(status), ") in ", expr));
}
}  // namespace detail

CublasWorkspace cublas_workspace(Device device) {
  const int index = checked_index(device);
  const Stream stream = current_stream(device);
  Tensor& ws = thread_handles().workspaces[{index, stream.handle}];
  if (!ws.defined()) {
    core::CategoryScope category(core::Category::Workspace);         // for the memory profiler
    ws = empty({int64_t(workspace_bytes(index))}, {kBool, device});  // bytes; see factory.h
  }
  return {ws.data(), size_t(ws.numel())};
}

cublasHandle_t cublas_handle(Device device) {
  const int index = checked_index(device);
  cublasHandle_t& h = thread_handles().blas[size_t(index)];
  if (!h) {
    h = blas_pool().acquire(index, &cublasCreate);
    FRUGAL_CUBLAS_CHECK(
        cublasSetMathMode(h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  FRUGAL_CUBLAS_CHECK(cublasSetStream(h, stream_for(device)));
  const CublasWorkspace ws = cublas_workspace(device);
  FRUGAL_CUBLAS_CHECK(cublasSetWorkspace(h, ws.ptr, ws.size));
  return h;
}

cublasLtHandle_t cublaslt_handle(Device device) {
  const int index = checked_index(device);
  cublasLtHandle_t& h = thread_handles().lt[size_t(index)];
  if (!h) h = lt_pool().acquire(index, &cublasLtCreate);
  return h;
}

}  // namespace frugal::ops::cuda
