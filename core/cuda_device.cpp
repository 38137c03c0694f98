// CUDA devices in CUDA builds: how many there are, the check that one exists, the side
// streams, and a raw device synchronize. cuda_absent.cpp answers for them in builds without CUDA.
#include <cuda_runtime.h>

#include <mutex>

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

Stream side_stream(Device device, SideStream purpose) {
  constexpr int kPurposes = 2, kMaxDevices = 64;
  static std::once_flag created[kPurposes][kMaxDevices];
  static cudaStream_t streams[kPurposes][kMaxDevices] = {};
  check_cuda_device(device, "side_stream");
  FRUGAL_CHECK(device.index < kMaxDevices, "side_stream: ", device.str(), " is past the ", kMaxDevices,
               " devices frugal keeps side streams for");
  const int p = static_cast<int>(purpose);
  std::call_once(created[p][device.index], [&] {
    CudaDeviceGuard guard(device.index);
    FRUGAL_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[p][device.index], cudaStreamNonBlocking));
  });
  return Stream{streams[p][device.index], device};
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
