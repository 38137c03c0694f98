#pragma once
// What the allocator reports: statistics per pool and a snapshot of its segments.
// Plain data, shared by the device allocators (memory/allocator.h) and the pinned
// host pool (memory/pinned.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace frugal::memory {

/// One statistic over time: its value now, the highest it has been since the last
/// reset_peak, and the cumulative increases and decreases since the last reset_stats.
struct StatCounter {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  ///< cumulative increase
  int64_t freed = 0;      ///< cumulative decrease
};

/// The statistics of one pool (or of both together).
struct PoolStats {
  StatCounter allocated_bytes;       ///< bytes in blocks handed out (rounded sizes)
  StatCounter reserved_bytes;        ///< bytes in segments obtained from the system
  StatCounter requested_bytes;       ///< bytes callers asked for (unrounded)
  StatCounter inactive_split_bytes;  ///< free bytes in partly used segments: cached, but not releasable
  StatCounter active_blocks;  ///< blocks handed out and not yet back in the pool (includes blocks waiting on events)
  StatCounter segments;       ///< segments obtained from the system

  /// Share of reserved bytes that are trapped in partly used segments:
  /// inactive_split_bytes / reserved_bytes (0 when nothing is reserved).
  double fragmentation() const;
};

/// A device's statistics: the members inherited from PoolStats cover both pools;
/// small_pool (requests <= 1 MiB) and large_pool break them down.
struct MemoryStats : PoolStats {
  PoolStats small_pool;
  PoolStats large_pool;
  int64_t num_allocs = 0;          ///< allocate calls that returned memory (nbytes > 0)
  int64_t num_frees = 0;           ///< blocks returned by their owners
  int64_t cache_hits = 0;          ///< allocations served from a cached block, no new segment
  int64_t num_alloc_retries = 0;   ///< times the cache was freed to retry a failed segment allocation
  int64_t num_ooms = 0;            ///< OutOfMemoryErrors thrown
  int64_t num_segment_allocs = 0;  ///< segments obtained from the system (cudaMalloc, mmap, ...)
  int64_t num_segment_frees = 0;   ///< segments given back to the system
};

// ---- Snapshot (for memory profilers) ----------------------------------------------

enum class BlockState : uint8_t {
  Allocated,       ///< held by a DataPtr
  AwaitingEvents,  ///< freed, but still in use on another stream (see record_stream)
  Free,            ///< cached, ready for reuse
};

struct BlockInfo {
  void* ptr;
  size_t size;       ///< rounded size
  size_t requested;  ///< bytes asked for (0 unless Allocated)
  BlockState state;
};

/// One segment obtained from the system and the blocks it is split into, in address order.
struct SegmentInfo {
  void* base;
  size_t size;
  bool small_pool;
  void* stream;  ///< handle of the stream whose allocations it serves
  std::vector<BlockInfo> blocks;
};

/// "0 B", "512 B", "1.50 KiB", "1.50 MiB", "2.00 GiB" (binary units, two decimals).
std::string format_bytes(int64_t bytes);

}  // namespace frugal::memory
