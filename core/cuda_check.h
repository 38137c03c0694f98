#pragma once
// Checked CUDA runtime calls. Include only from CUDA translation units
// (files built when FRUGAL_WITH_CUDA is defined).
#include <cuda_runtime.h>

#include "core/error.h"

namespace frugal::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
}

#define FRUGAL_CUDA_CHECK(expr)                                                   \
  do {                                                                            \
    cudaError_t frugal_err_ = (expr);                                             \
    if (frugal_err_ != cudaSuccess) [[unlikely]]                                  \
      ::frugal::detail::throw_cuda_error(frugal_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// After every kernel launch: a bad launch configuration surfaces here, at its line.
#define FRUGAL_CUDA_CHECK_LAUNCH() FRUGAL_CUDA_CHECK(cudaGetLastError())

namespace frugal {

/// Whether all work recorded before event `e` is done; never waits (cudaEventQuery, with
/// its "not ready" answer taken off the error state).
inline bool cuda_event_done(cudaEvent_t e) {
  const cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  FRUGAL_CUDA_CHECK(err);
  return true;
}

/// Makes CUDA device `index` current for its scope and restores the previous one after:
/// runtime, cuBLAS, NCCL and event calls act on the calling thread's current device.
/// A negative index leaves the current device as it is.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index) {
    FRUGAL_CUDA_CHECK(cudaGetDevice(&previous_));
    target_ = index < 0 ? previous_ : index;
    if (previous_ != target_) FRUGAL_CUDA_CHECK(cudaSetDevice(target_));
  }
  ~CudaDeviceGuard() {
    if (previous_ != target_) (void)cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int target_ = 0;
};

}  // namespace frugal
