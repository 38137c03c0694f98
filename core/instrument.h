#pragma once
// Instrumentation: the hooks the profiler and the allocator's trace read, below
// every layer that runs ops. Three parts:
//   - attribution: who caused an allocation: the op running on the thread
//     (OpScope), the module whose forward is running (ModuleScope, opened by
//     nn::Module's call operator) and what the bytes are for (Category:
//     CategoryScope in the few places that know, or memory::relabel after the
//     fact). The allocator copies all three into each trace event it records.
//   - op recording: while a profiler session records, every OpScope leaves an
//     OpRecord (host times and, on CUDA, a pair of pooled events), backward nodes
//     remember the module that created them, and profiling() is true so the
//     allocator's trace gets relabel events. One recording at a time per process;
//     profiler::Session (profiler/session.h) drives it and turns the records into
//     reports.
//   - device timing events: pooled CUDA events that keep timestamps, for the
//     recorder and for anything else that times work on a stream (the pipeline's
//     busy time, cuDNN autotuning, bench/train_step.cpp).
//
// Note [Zero-cost attribution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The scopes run on every op and module call whether or not a profiler runs, so
// they only save and restore a thread-local pointer or byte. Everything else
// (naming backward nodes, timing ops, relabelling blocks, remembering which
// module created a backward node) first reads profiling(), one relaxed atomic
// load, and does nothing when no profiler session is recording.
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/device.h"

namespace frugal::core {

// ---- Attribution ----------------------------------------------------------------------

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

/// Marks the module (an opaque pointer: core/ knows nothing of nn::Module)
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

/// The op running on this thread: every public differentiable op opens an OpScope
/// ("matmul"), and the autograd engine opens one per backward node
/// ("MatmulBackward"), so allocator events and timings can name the op that caused
/// them. When no profiler is active an OpScope costs two thread-local pointer writes
/// and one relaxed atomic load (Note [Zero-cost attribution]); while one records, it
/// also leaves an OpRecord with its times.
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

/// True while a profiler session records (see Note [Zero-cost attribution]).
bool profiling() noexcept;

// ---- Op recording (driven by profiler::Session) ------------------------------------------

/// One op call seen by an OpScope while recording.
struct OpRecord {
  const char* op;          ///< the OpScope's name
  const void* module;      ///< ModuleScope::current() when the op began (nullptr: none)
  Category category;       ///< CategoryScope::current() then (OptimizerState in an optimizer step)
  uint32_t thread;         ///< small per-process thread number, in order of first use
  int32_t depth;           ///< OpScopes open around this one on its thread
  int64_t start_ns;        ///< steady clock
  int64_t end_ns;          ///< steady clock
  double device_start_ms;  ///< CUDA: start on the device, from the recording's first event; -1 on the CPU
  double device_ms;        ///< CUDA: time between the op's events on its stream; -1 on the CPU
};

/// Starts recording. `device` is where CUDA events time ops (none for the CPU);
/// `time_ops` false keeps only attribution. Throws if a recording is on.
void begin_recording(Device device, bool time_ops);
/// Ends the recording: synchronizes the device, turns event pairs into times and
/// returns the records in order of their start. A scope still open then is
/// taken to end there (without a device time).
std::vector<OpRecord> end_recording();

/// Remembers ModuleScope::current() as the module of backward node `sequence_nr`
/// (called as the node is created; nothing when not recording).
void note_node_module(uint64_t sequence_nr);
/// The module noted for node `sequence_nr`, or nullptr.
const void* node_module(uint64_t sequence_nr);

/// A pointer to a copy of `name` that lives as long as the process (one copy per
/// distinct name), for OpScope names computed at run time (backward node names).
const char* intern(std::string_view name);

// ---- Device timing events (core/cuda_timing.cpp; core/cuda_absent.cpp fails without CUDA) --

/// A timing-capable event from a pool, recorded now on `device`'s current stream.
void* record_timing_event(Device device);
/// Milliseconds between two recorded events (both must have completed).
double timing_event_elapsed_ms(void* start, void* end);
/// Returns an event to the pool.
void release_timing_event(void* event);

}  // namespace frugal::core
