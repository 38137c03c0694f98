#pragma once
// Who caused an allocation, for the memory profiler: the op running on the
// thread (memory::OpScope), the module whose forward is running (ModuleScope,
// opened by nn::Module's call operator) and what the bytes are for (Category:
// CategoryScope in the few places that know, or relabel() after the fact).
// The allocator copies all three into each trace event it records.
//
// Note [Zero-cost attribution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The scopes run on every op and module call whether or not a profiler runs, so
// they only save and restore a thread-local pointer or byte. Everything else
// (naming backward nodes, timing ops, relabelling blocks, remembering which
// module created a backward node) first reads profiling(), one relaxed atomic
// load, and does nothing when no profiler session is recording.
#include <cstdint>

#include "memory/device.h"

namespace frugal::memory {

/// What a block of memory is for. Unset means "decide from context": Activations
/// inside an op or a module's forward (forward and backward temporaries), Other
/// outside both (inputs, user tensors).
enum class Category : uint8_t { Unset, Parameters, Gradients, OptimizerState, Activations, Workspace, Other };
inline constexpr int kNumCategories = 7;  // including Unset, so a Category indexes arrays

/// "parameters", "gradients", "optimizer_state", "activations", "workspace", "other"
/// ("unset" for Unset).
const char* to_string(Category category);

/// Sets the category of the allocations this thread makes while it lives; nests.
class CategoryScope {
 public:
  explicit CategoryScope(Category category) noexcept;
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

  /// The innermost scope's category, or Unset outside every scope.
  static Category current() noexcept;

 private:
  Category outer_;
};

/// The category an allocation made now on this thread gets: the innermost
/// CategoryScope, else Activations inside an op or a module's forward, else Other.
Category effective_category() noexcept;

/// Marks the module (an opaque pointer: memory/ knows nothing of nn::Module)
/// whose forward runs on this thread while it lives; nests.
class ModuleScope {
 public:
  explicit ModuleScope(const void* module) noexcept;
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

  /// The innermost module, or nullptr outside every module.
  static const void* current() noexcept;

 private:
  const void* outer_;
};

/// True while a profiler session records (see Note [Zero-cost attribution]).
bool profiling() noexcept;

/// Declares that the live block at `data` (the start of an allocation made by
/// `device`'s allocator, e.g. a Storage's DataPtr) now holds `category`: a
/// gradient buffer that began as a backward temporary, a tensor that became a
/// parameter. Recorded in the trace; does nothing when no profiler runs.
void relabel(Device device, const void* data, Category category);

}  // namespace frugal::memory
