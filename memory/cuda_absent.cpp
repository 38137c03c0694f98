// What a build without CUDA (meson -Dcuda=disabled) answers where cuda_backend.cpp
// would: no CUDA devices, and an error that says so when one is asked for.
#if FRUGAL_WITH_CUDA
#error "cuda_absent.cpp is for builds without CUDA; CUDA builds compile cuda_backend.cpp"
#endif

#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/deferred_checks.h"
#include "memory/error.h"
#include "memory/profile_recorder.h"

namespace frugal {

int cuda_device_count() { return 0; }

namespace memory::detail {

void check_cuda_device(Device device, const char* op) {
  FRUGAL_FAIL(op, ": frugal was built without CUDA (device ", device.str(), ")");
}

CachingAllocator& cuda_allocator(int index) {
  FRUGAL_FAIL("allocate: frugal was built without CUDA (device cuda:", index, ")");
}

std::unique_ptr<RawBackend> make_pinned_backend(bool* page_locked) {
  *page_locked = false;
  return make_cpu_backend();
}

void cuda_synchronize(int index) {
  FRUGAL_FAIL("synchronize: frugal was built without CUDA (device cuda:", index, ")");
}

std::unique_ptr<CheckTransport> make_cuda_check_transport(int index) {
  FRUGAL_FAIL("deferred checks: frugal was built without CUDA (device cuda:", index, ")");
}

void* record_timing_event(Device device) {
  FRUGAL_FAIL("profiler: frugal was built without CUDA (device ", device.str(), ")");
}
double timing_event_elapsed_ms(void*, void*) { FRUGAL_FAIL("profiler: frugal was built without CUDA"); }
void release_timing_event(void*) {}

}  // namespace memory::detail
}  // namespace frugal
