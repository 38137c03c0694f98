#pragma once
// The op running on this thread, for the memory profiler: every public
// differentiable op opens an OpScope ("matmul"), and the autograd engine opens
// one per backward node ("MatmulBackward"), so allocator events and timings can
// name the op that caused them. When no profiler is active an OpScope costs two
// thread-local pointer writes and one relaxed atomic load (Note [Zero-cost
// attribution] in memory/attribution.h); while one records, it also leaves an
// OpRecord with its times (memory/profile_recorder.h).
#include <cstdint>

namespace frugal::memory {

class OpScope {
 public:
  /// `name` must outlive the scope (a string literal or a Node's cached name) and,
  /// while a profiler records, last until its stop(), which copies the names.
  explicit OpScope(const char* name) noexcept;
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  /// The innermost op on this thread, or "" outside every op.
  static const char* current() noexcept;

 private:
  const char* outer_;
  int64_t record_ = -1;     // this call's OpRecord while recording, else -1
  uint64_t recording_ = 0;  // which recording record_ belongs to
};

}  // namespace frugal::memory
