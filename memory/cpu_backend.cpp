// Host memory for the CPU allocator (and the pinned pool when there is no GPU).
//
// Note [Host segments from mmap]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Segments are at least 2 MiB, so we take them straight from the kernel with
// mmap rather than malloc: they are page-aligned (well past the 64 bytes that
// aligned AVX-512 loads want), pages are committed only when first touched, and
// munmap really returns them, so empty_cache shrinks the process as it does on a
// GPU (glibc's malloc may keep freed large chunks in its heap).
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "memory/backend.h"
#include "memory/stats.h"

namespace frugal::memory::detail {

namespace {

int64_t pages_in_bytes(int name) {
  long pages = sysconf(name);
  long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

class CpuBackend final : public RawBackend {
 public:
  void* allocate_segment(size_t nbytes) override {
    void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  void free_segment(void* base, size_t nbytes) override {
    FRUGAL_CHECK(munmap(base, nbytes) == 0, "cpu allocator: munmap of a ", format_bytes(static_cast<int64_t>(nbytes)),
                 " segment failed");
  }

  size_t total_memory() const override { return host_physical_memory(); }
  std::string memory_info() const override { return host_memory_info(); }

  // The host runs work in program order on its one stream, so an event recorded
  // "on" it has completed by the time anyone asks.
  void* record_event(Stream) override { return nullptr; }
  bool event_completed(void*) override { return true; }
  void wait_event(void*) override {}
  void release_event(void*) override {}
};

}  // namespace

std::unique_ptr<RawBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

size_t host_physical_memory() { return static_cast<size_t>(pages_in_bytes(_SC_PHYS_PAGES)); }

std::string host_memory_info() {
  return "host free " + format_bytes(pages_in_bytes(_SC_AVPHYS_PAGES)) + " / total " +
         format_bytes(pages_in_bytes(_SC_PHYS_PAGES));
}

}  // namespace frugal::memory::detail
