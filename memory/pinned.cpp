// The pinned host pool: a CachingAllocator over cudaHostAlloc (or plain host
// memory without a GPU). All its blocks belong to the host "stream"; blocks that
// asynchronous copies touched are reused only after those copies complete, through
// record_stream and events (see Note [Stream-aware reuse]).
#include "memory/pinned.h"

#include "core/graph_capture.h"
#include "memory/caching_allocator.h"

namespace frugal::memory {

namespace {
struct PinnedPool {
  bool page_locked = false;
  detail::CachingAllocator* allocator = nullptr;
};

const PinnedPool& pinned_pool() {
  // Never destroyed, like the device allocators.
  static const PinnedPool pool = [] {
    PinnedPool p;
    auto backend = detail::make_pinned_backend(&p.page_locked);
    p.allocator = new detail::CachingAllocator("pinned host", kCPU, std::move(backend));
    return p;
  }();
  return pool;
}
}  // namespace

detail::CachingAllocator& detail::pinned_allocator() { return *pinned_pool().allocator; }

DataPtr allocate_pinned(size_t nbytes) {
  // While this thread captures a graph, from the graph's pool (Note [Graph pools]).
  const core::GraphCapture* capture = core::current_graph_capture();
  return detail::pinned_allocator().allocate(nbytes,
                                             Stream{capture ? const_cast<void*>(capture->pool_key) : nullptr, kCPU});
}

MemoryStats pinned_stats() { return detail::pinned_allocator().stats(); }

void reset_pinned_peak() { detail::pinned_allocator().reset_peak(); }

void empty_pinned_cache() { detail::pinned_allocator().empty_cache(); }

void set_pinned_memory_limit(size_t bytes) { detail::pinned_allocator().set_limit(bytes); }

std::string pinned_memory_summary() {
  auto& allocator = detail::pinned_allocator();
  return detail::format_summary(
      pinned_is_page_locked() ? "pinned host memory" : "pinned host memory (not page-locked: no GPU)",
      allocator.stats(), allocator.limit());
}

bool pinned_is_page_locked() { return pinned_pool().page_locked; }

}  // namespace frugal::memory
