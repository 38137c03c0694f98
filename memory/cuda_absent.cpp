// What a build without CUDA (meson -Dcuda=disabled) answers where cuda_backend.cpp
// would: an error that says so when a CUDA allocator or check transport is asked for
// (core/cuda_absent.cpp answers that there are no CUDA devices).
#if FRUGAL_WITH_CUDA
#error "cuda_absent.cpp is for builds without CUDA; CUDA builds compile cuda_backend.cpp"
#endif

#include "core/error.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/deferred_checks.h"

namespace frugal::memory::detail {

CachingAllocator& cuda_allocator(int index) {
  FRUGAL_FAIL("allocate: frugal was built without CUDA (device cuda:", index, ")");
}

std::unique_ptr<RawBackend> make_pinned_backend(bool* page_locked) {
  *page_locked = false;
  return make_cpu_backend();
}

std::unique_ptr<CheckTransport> make_cuda_check_transport(int index) {
  FRUGAL_FAIL("deferred checks: frugal was built without CUDA (device cuda:", index, ")");
}

}  // namespace frugal::memory::detail
