#pragma once
// The allocator's event trace: a ring buffer of the last N allocations, frees,
// segment allocations/frees and out-of-memory failures of one device, each with
// sizes, the memory totals after it, and a tag naming what the program was doing
// (TraceTag). Off by default; when on, recording an event costs a clock read and
// a copy into a preallocated slot, under the allocator lock it already holds.
// Each event also names the op, module and category that caused it (see
// core/instrument.h); Relabel events (relabel()) change the category of a live block.
// A memory profiler replays it: match Alloc/Free by ptr for live blocks, plot
// allocated_bytes over seq for the timeline (profiler/session.h does).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/instrument.h"

namespace frugal::memory {

enum class TraceAction : uint8_t { Alloc, Free, SegmentAlloc, SegmentFree, Oom, Relabel };

/// "alloc", "free", "segment_alloc", "segment_free", "oom", "relabel".
const char* to_string(TraceAction action);

inline constexpr size_t kTraceTagCapacity = 32;  // bytes, with the terminating NUL

struct TraceEvent {
  uint64_t seq;     ///< position in the device's history; a gap means the ring overwrote events
  int64_t time_ns;  ///< steady clock
  TraceAction action;
  void* ptr;                ///< the block (Alloc, Free, Relabel) or segment base (Segment*); null for Oom
  size_t size;              ///< rounded block size, segment size, or for Oom the segment it needed
  size_t requested;         ///< bytes asked for (Alloc, Free, Oom); 0 for segment events
  void* stream;             ///< stream handle the block or segment belongs to
  int64_t allocated_bytes;  ///< device totals after the event
  int64_t reserved_bytes;
  char tag[kTraceTagCapacity];  ///< the TraceTag active on the thread that caused it ("" if none)
  const char* op;               ///< core::OpScope::current() on that thread ("" outside ops)
  const void* module;           ///< core::ModuleScope::current() on that thread (nullptr outside modules)
  core::Category category;      ///< Alloc: core::effective_category() there; Free: the block's; Relabel: its new one
};

/// Starts recording `device`'s allocator events into a fresh ring of `capacity`
/// events (the oldest are overwritten). capacity 0 stops recording.
void enable_trace(Device device, size_t capacity = 65536);
void disable_trace(Device device);
/// The recorded events, oldest first (empty if tracing is off).
std::vector<TraceEvent> trace_events(Device device);
/// The event with the most allocated bytes since enable_trace (the first of equals), kept
/// after the ring has overwritten it; empty if tracing is off or nothing was recorded.
std::optional<TraceEvent> trace_peak(Device device);

/// One event per line: seq, time (µs since the first event), action, size, ptr, tag, totals.
std::string trace_to_text(const std::vector<TraceEvent>& events);
/// A JSON array of objects with the fields of TraceEvent (ptr and stream as hex strings).
std::string trace_to_json(const std::vector<TraceEvent>& events);

/// Declares that the live block at `data` (the start of an allocation made by
/// `device`'s allocator, e.g. a Storage's DataPtr) now holds `category`: a
/// gradient buffer that began as a backward temporary, a tensor that became a
/// parameter. Recorded in the trace; does nothing when no profiler runs.
void relabel(Device device, const void* data, core::Category category);

/// Tags the allocator events this thread causes while it lives ("forward",
/// "layer3.attention"); nests, restoring the outer tag on destruction. Tags longer
/// than kTraceTagCapacity - 1 bytes are truncated.
class TraceTag {
 public:
  explicit TraceTag(std::string_view tag);
  ~TraceTag();
  TraceTag(const TraceTag&) = delete;
  TraceTag& operator=(const TraceTag&) = delete;

  /// The innermost tag active on this thread ("" if none).
  static const char* current();

 private:
  char outer_[kTraceTagCapacity];
};

namespace detail {

/// The ring itself; owned by a CachingAllocator and used under its lock.
class TraceRing {
 public:
  explicit TraceRing(size_t capacity) : events_(capacity) {}
  /// Fills in seq, time, tag, op, module and category (Alloc: the scope's; Free: the
  /// block's, as allocated or relabelled while tracing; Relabel: the caller's); the caller
  /// fills the rest of `event`.
  void record(TraceEvent event);
  std::vector<TraceEvent> events() const;
  std::optional<TraceEvent> peak() const { return peak_; }

 private:
  std::vector<TraceEvent> events_;
  uint64_t next_seq_ = 0;
  std::optional<TraceEvent> peak_;                        // see Note [The peak outlives the ring] in profiler/session.h
  std::unordered_map<const void*, core::Category> live_;  // each traced live block's category
};

}  // namespace detail
}  // namespace frugal::memory
