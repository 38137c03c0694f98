#pragma once
// The CUDA graph capture running on this thread, as the layers below the graph itself see
// it (the graph is CudaGraph in tensor/cuda_graph.h; Note [CUDA graphs] there). Nothing
// here touches CUDA: the allocator keys the capture's memory by `pool_key`, and code whose
// work a replay would get wrong - a host read of a device value, a random offset or an
// optimizer's step count frozen into the graph - asks refuse_in_graph_capture to throw.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/device.h"
#include "core/stream.h"

namespace frugal::core {

struct GraphCapture {
  const void* pool_key = nullptr;  ///< the graph's private pools (memory/caching_allocator.h, Note [Graph pools])
  Device device = kCPU;            ///< the device whose stream is captured
  void* stream = nullptr;          ///< the captured stream (a cudaStream_t)
  /// Run before every replay; each throws if what the capture froze has changed since
  /// (an optimizer's learning rate, say), so that a replay never silently uses the old value.
  std::vector<std::function<void()>> replay_checks{};
  /// Graph-safe random numbers (Note [Graph-safe random numbers] in tensor/random.h): the
  /// generator whose draws are captured, the device word that receives its offset before
  /// each replay, and the counters drawn so far in the capture, relative to that word.
  const void* rng_generator = nullptr;
  const void* rng_base = nullptr;
  uint64_t rng_offset = 0;
  /// Run after every replay's launch, on the stream it was launched on: each re-files a
  /// deferred index check of the captured work (Note [Index checks in a CUDA graph] in
  /// memory/deferred_checks.h).
  std::vector<std::function<void(Stream)>> after_replay{};
};

/// The capture running on this thread, or nullptr.
GraphCapture* current_graph_capture();
/// Set by CudaGraph around its capture (nullptr after).
void set_current_graph_capture(GraphCapture* capture);

/// Throws a frugal::Error when a graph capture runs on this thread: `what` cannot be
/// captured, because `why` (both end up in the message, with what to do instead).
void refuse_in_graph_capture(const char* what, const char* why);

}  // namespace frugal::core
