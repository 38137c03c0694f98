#pragma once
// The caching allocator's public face. Every byte a tensor holds, on any device,
// comes from memory::allocate and goes back when its DataPtr dies. The arena
// policy (rounding, pools, split/merge, stream-aware reuse) is the same for CUDA
// and host memory, so its effects can be tested on the CPU; see
// memory/caching_allocator.h for the policy and its Notes. The stats types and
// format_bytes are in memory/stats.h, the pinned host pool in memory/pinned.h.
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "core/data_ptr.h"
#include "core/device.h"
#include "core/stream.h"
#include "memory/pinned.h"
#include "memory/stats.h"

namespace frugal::memory {

// ---- Allocation ---------------------------------------------------------------

/// Allocates `nbytes` on `device` for use on the calling thread's current stream.
/// The memory is uninitialised and aligned to at least 512 bytes (64 on the host
/// for zero-copy SIMD loads, 512 from rounding). `nbytes == 0` yields an empty
/// DataPtr (null pointer, size 0) that owns nothing.
/// Throws OutOfMemoryError when the request cannot be met even after the cache is
/// freed, and frugal::Error for a device this build or process does not have.
DataPtr allocate(Device device, size_t nbytes);

/// As above, for use on `stream` (which must belong to `device`). The block is
/// reused, once freed, only by allocations on the same stream: see
/// Note [Stream-aware reuse] in memory/caching_allocator.h.
DataPtr allocate(Device device, size_t nbytes, Stream stream);

/// Declares that `p` is also used by work queued on `stream`. When `p` is freed,
/// its block is reused only after that work completes (an event recorded on
/// `stream` at free time). On the CPU, which has one stream, this is a no-op.
void record_stream(const DataPtr& p, Stream stream);

// ---- CUDA graph pools (Note [Graph pools] in memory/caching_allocator.h) ---------
/// Makes `key` a private pool of `device`'s allocator and of the pinned pool: while a
/// capture with that pool_key runs on this thread (core/graph_capture.h), its
/// allocations come from the pool and what it frees is not handed to anyone else.
void begin_graph_pool(Device device, const void* key);
/// Ends the pool once the graph's work is done: its segments go to `owner` (the captured
/// stream), and blocks held since the capture are freed.
void release_graph_pool(Device device, const void* key, Stream owner);

// ---- Statistics ---------------------------------------------------------------

/// A copy of `device`'s statistics, taken under its allocator's lock.
MemoryStats stats(Device device);
/// Sets every peak to its current value.
void reset_peak(Device device);
/// Zeroes the cumulative counters and sets peaks to current values (current values are facts and stay).
void reset_stats(Device device);

// ---- Cache and limits -----------------------------------------------------------

/// Gives every cached, wholly free segment back to the system (on CUDA it first
/// waits for the events of blocks freed while used on other streams).
void empty_cache(Device device);

/// Caps reserved bytes at `fraction` (0 < fraction <= 1) of the device's memory
/// (physical RAM for the CPU). Same effect as set_memory_limit(fraction * total).
void set_memory_fraction(double fraction, Device device);
/// Caps the bytes the allocator may reserve on `device`; 0 removes the cap.
/// A segment that would take reserved bytes past the cap is not allocated: the
/// cache is freed and the request retried, then OutOfMemoryError is thrown.
void set_memory_limit(size_t bytes, Device device);
/// The current cap in bytes (0 = none).
size_t memory_limit(Device device);

// ---- Reports --------------------------------------------------------------------

/// A multi-line table in the manner of torch.cuda.memory_summary: rows allocated,
/// requested, reserved, inactive split, active blocks and segments (each with its
/// small and large pool); columns current, peak, total allocated, total freed;
/// then the counters, the cap and the fragmentation.
std::string memory_summary(Device device);

/// One line, e.g. "cuda:0 allocated 1.20 GiB (peak 3.40 GiB) reserved 4.00 GiB, frag 3.1%".
void print_memory_usage(Device device, std::ostream& os = std::cout);

// ---- Snapshot (for memory profilers) ----------------------------------------------

/// Every segment `device`'s allocator holds, ordered by address.
std::vector<SegmentInfo> snapshot(Device device);

}  // namespace frugal::memory
