#pragma once
// The op running on this thread, for the memory profiler: every public
// differentiable op opens an OpScope ("matmul"), and the autograd engine opens
// one per backward node ("MatmulBackward"), so allocator events and timings can
// name the op that caused them. When no profiler is active an OpScope costs two
// thread-local pointer writes.
namespace frugal::memory {

class OpScope {
 public:
  /// `name` must outlive the scope (a string literal or a Node's cached name).
  explicit OpScope(const char* name) noexcept;
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  /// The innermost op on this thread, or "" outside every op.
  static const char* current() noexcept;

 private:
  const char* outer_;
};

}  // namespace frugal::memory
