// The public allocator API: find the device's CachingAllocator and forward.
#include "memory/allocator.h"

#include "core/error.h"
#include "core/graph_capture.h"
#include "memory/caching_allocator.h"

namespace frugal::memory {

namespace detail {

CachingAllocator& allocator_for(Device device, const char* op) {
  if (device.is_cpu()) {
    // Never destroyed: DataPtrs in static objects may be freed during exit.
    static auto* cpu = new CachingAllocator("cpu", kCPU, make_cpu_backend());
    return *cpu;
  }
  core::check_cuda_device(device, op);
  return cuda_allocator(device.index);
}

}  // namespace detail

namespace {

/// The stream an allocation is keyed by: the graph's pool while this thread captures
/// `stream` (Note [Graph pools]), else the stream itself.
Stream pool_stream(Stream stream) {
  const core::GraphCapture* capture = core::current_graph_capture();
  if (capture && capture->device == stream.device && capture->stream == stream.handle)
    return Stream{const_cast<void*>(capture->pool_key), stream.device};
  return stream;
}

}  // namespace

DataPtr allocate(Device device, size_t nbytes) {
  auto& allocator = detail::allocator_for(device, "allocate");
  return allocator.allocate(nbytes, pool_stream(current_stream(device)));
}

DataPtr allocate(Device device, size_t nbytes, Stream stream) {
  auto& allocator = detail::allocator_for(device, "allocate");
  FRUGAL_CHECK(stream.device == device, "allocate: stream of ", stream.device.str(), " given for memory on ",
               device.str());
  FRUGAL_CHECK(device.is_cuda() || stream.handle == nullptr,
               "allocate: the CPU has one stream, got a non-null handle for it");
  return allocator.allocate(nbytes, pool_stream(stream));
}

void begin_graph_pool(Device device, const void* key) {
  detail::allocator_for(device, "begin_graph_pool").begin_graph_pool(key, /*reuse=*/true);
  detail::pinned_allocator().begin_graph_pool(key, /*reuse=*/false);  // staging is read again at every replay
}

void release_graph_pool(Device device, const void* key, Stream owner) {
  detail::allocator_for(device, "release_graph_pool").release_graph_pool(key, owner);
  detail::pinned_allocator().release_graph_pool(key, Stream{nullptr, kCPU});
}

void record_stream(const DataPtr& p, Stream stream) {
  if (!p) return;  // empty (zero-byte) allocations own no memory
  FRUGAL_CHECK(stream.device.is_cuda() || stream.handle == nullptr,
               "record_stream: the CPU has one stream, got a non-null handle for it");
  if (stream.device.is_cuda()) core::check_cuda_device(stream.device, "record_stream");

  const Device device = p.device();
  if (device.is_cpu() && stream.device.is_cuda()) {
    // Host memory used by a device stream: only pinned buffers take part in async copies.
    if (detail::pinned_allocator().record_stream(p, stream)) return;
  } else {
    FRUGAL_CHECK(stream.device == device, "record_stream: stream of ", stream.device.str(), " given for memory on ",
                 device.str());
    if (detail::allocator_for(device, "record_stream").record_stream(p, stream)) return;
    if (device.is_cpu() && detail::pinned_allocator().record_stream(p, stream)) return;
  }
  FRUGAL_FAIL("record_stream: ", p.get(), " on ", device.str(), " was not allocated by frugal's caching allocator",
              device.is_cpu() && stream.device.is_cuda() ? " as pinned memory" : "");
}

MemoryStats stats(Device device) { return detail::allocator_for(device, "stats").stats(); }

void reset_peak(Device device) { detail::allocator_for(device, "reset_peak").reset_peak(); }

void reset_stats(Device device) { detail::allocator_for(device, "reset_stats").reset_stats(); }

void empty_cache(Device device) { detail::allocator_for(device, "empty_cache").empty_cache(); }

void set_memory_fraction(double fraction, Device device) {
  auto& allocator = detail::allocator_for(device, "set_memory_fraction");
  FRUGAL_CHECK(fraction > 0.0 && fraction <= 1.0, "set_memory_fraction: fraction must be in (0, 1], got ", fraction,
               " for ", device.str());
  allocator.set_limit(static_cast<size_t>(fraction * static_cast<double>(allocator.total_memory())));
}

void set_memory_limit(size_t bytes, Device device) {
  detail::allocator_for(device, "set_memory_limit").set_limit(bytes);
}

size_t memory_limit(Device device) { return detail::allocator_for(device, "memory_limit").limit(); }

std::vector<SegmentInfo> snapshot(Device device) { return detail::allocator_for(device, "snapshot").snapshot(); }

}  // namespace frugal::memory
