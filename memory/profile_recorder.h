#pragma once
// The recording half of the profiler, below tensor/: while a recording is on,
// every OpScope leaves an OpRecord (host times and, on CUDA, a pair of pooled
// events), backward nodes remember the module that created them, and
// profiling() is true so the allocator's trace gets relabel events. One
// recording at a time per process; profiler::Session (profiler/session.h) drives
// it and turns the records into reports.
#include <cstdint>
#include <string_view>
#include <vector>

#include "memory/attribution.h"
#include "memory/device.h"

namespace frugal::memory {

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

namespace detail {

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

// ---- CUDA timing events (cuda_timing.cpp; cuda_absent.cpp fails without CUDA) ----
/// A timing-capable event from a pool, recorded now on `device`'s current stream.
void* record_timing_event(Device device);
/// Milliseconds between two recorded events (both must have completed).
double timing_event_elapsed_ms(void* start, void* end);
/// Returns an event to the pool.
void release_timing_event(void* event);

}  // namespace detail
}  // namespace frugal::memory
