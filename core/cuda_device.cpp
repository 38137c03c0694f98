// CUDA devices in CUDA builds: how many there are, the check that one exists, and a
// raw device synchronize. cuda_absent.cpp answers for them in builds without CUDA.
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/device.h"
#include "core/stream.h"

namespace frugal {

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver or no GPU: a CPU-only run
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

namespace core {

void check_cuda_device(Device device, const char* op) {
  const int count = cuda_device_count();
  FRUGAL_CHECK(device.is_cuda() && device.index >= 0 && device.index < count, op, ": ", device.str(),
               " does not exist; this process sees ", count, " CUDA device(s)");
}

void cuda_synchronize(int index) {
  // CUDA runtime calls act on the calling thread's current device.
  int previous = 0;
  FRUGAL_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != index) FRUGAL_CUDA_CHECK(cudaSetDevice(index));
  const cudaError_t err = cudaDeviceSynchronize();
  if (previous != index) (void)cudaSetDevice(previous);
  FRUGAL_CUDA_CHECK(err);
}

}  // namespace core
}  // namespace frugal
