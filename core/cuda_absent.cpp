// What a build without CUDA (meson -Dcuda=disabled) answers where cuda_device.cpp and
// cuda_timing.cpp would: no CUDA devices, and an error that says so when one is asked for.
#if FRUGAL_WITH_CUDA
#error "cuda_absent.cpp is for builds without CUDA; CUDA builds compile cuda_device.cpp and cuda_timing.cpp"
#endif

#include "core/device.h"
#include "core/error.h"
#include "core/instrument.h"
#include "core/stream.h"

namespace frugal {

int cuda_device_count() { return 0; }

namespace core {

void check_cuda_device(Device device, const char* op) {
  FRUGAL_FAIL(op, ": frugal was built without CUDA (device ", device.str(), ")");
}

Stream side_stream(Device device, SideStream) {
  FRUGAL_FAIL("side_stream: frugal was built without CUDA (device ", device.str(), ")");
}

void cuda_synchronize(int index) {
  FRUGAL_FAIL("synchronize: frugal was built without CUDA (device cuda:", index, ")");
}

void* record_timing_event(Device device) {
  FRUGAL_FAIL("profiler: frugal was built without CUDA (device ", device.str(), ")");
}
double timing_event_elapsed_ms(void*, void*) { FRUGAL_FAIL("profiler: frugal was built without CUDA"); }
void release_timing_event(void*) {}

}  // namespace core
}  // namespace frugal
