#pragma once
// The seeded generator behind rand/randn/randint/dropout (see Note [Counter-based RNG]).
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/graph_capture.h"

namespace frugal {

// Note [Graph-safe random numbers]
// A CUDA graph replays its kernels with the arguments they had at capture, so a kernel
// given (seed, counter) would draw the same numbers at every replay. Inside a capture the
// default generator hands out counters relative to a device word instead (Range::base),
// starting from 0, and does not advance; before each replay CudaGraph reserves the
// capture's total from the generator and copies the first counter into that word, so
// replay k draws exactly the counters the same step run eagerly at that point would have
// (Note [Counter-based RNG]). A checkpoint's saved offset is relative in the same way, and
// the autograd nodes keep the Range, base included, so backward regenerates the replay's
// own masks. Only device kernels read the base: a draw on the CPU inside a capture refuses.

// Note [Draws under a record]
// A checkpoint's recompute must draw what its forward drew, from every generator the
// forward drew from: the default one, a TensorParallelRng's, one a caller handed to
// dropout. A DrawRecord, while it lives, notes each generator drawn from on its thread and
// the state that generator had just before its first draw there: Generator::reserve, the one
// way to draw, reports every draw. Records nest (a selective checkpoint's kept op inside a
// checkpoint's forward) and each draw is noted by every record alive on the thread; outside
// any record a draw costs one thread-local read. A draw on another thread is not noted (a
// rank thread's checkpoint sees its own rank's draws). A noted state holds its generator
// weakly: one destroyed before the state is used reads as null there, and the user says so
// instead of restoring freed memory.

class Generator;

/// A generator's (seed, offset) at one point, and the generator while it exists.
struct GeneratorState {
  std::weak_ptr<Generator* const> handle;  ///< expires with the generator
  uint64_t seed = 0, offset = 0;
  /// The generator, or nullptr once it was destroyed.
  Generator* generator() const {
    const std::shared_ptr<Generator* const> g = handle.lock();
    return g ? *g : nullptr;
  }
};

/// Notes the generators drawn from on this thread while alive (Note [Draws under a record]).
class DrawRecord {
 public:
  DrawRecord();
  ~DrawRecord();
  DrawRecord(const DrawRecord&) = delete;
  DrawRecord& operator=(const DrawRecord&) = delete;
  /// Each generator drawn from so far, once, with its state before its first draw, in the
  /// order of those first draws.
  const std::vector<GeneratorState>& first_states() const { return first_; }

 private:
  friend class Generator;
  /// Called by Generator::reserve for every draw, before it advances: notes `generator` in
  /// (seed, offset) in each record alive on this thread that has not seen it yet.
  static void note(const std::shared_ptr<Generator* const>& generator, uint64_t seed, uint64_t offset);

  DrawRecord* outer_;
  std::vector<GeneratorState> first_;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = 0;
  }
  /// Reserves `n` Philox counters; returns (seed, first counter) for the caller's kernel.
  struct Range {
    uint64_t seed;
    uint64_t counter;
    /// Inside a CUDA graph: device memory holding the generator's offset for the replay
    /// running; kernels add it to `counter` (philox_first_counter). Null otherwise.
    const uint64_t* base = nullptr;
    /// Who turns these counters into numbers: 0 for frugal's kernels (Note [Counter-based
    /// RNG]), otherwise a fused engine with its own Philox stream from the same seed and
    /// counter, whose numbers only that engine can draw again (kCudnnRng).
    uint64_t drawn_by = 0;
  };
  /// Range::drawn_by of a mask drawn by cuDNN attention's RNG node (Note [cuDNN attention]).
  static constexpr uint64_t kCudnnRng = 1;
  Range reserve(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    core::GraphCapture* capture = captured_here();  // Note [Graph-safe random numbers]
    uint64_t& offset = capture ? capture->rng_offset : offset_;
    DrawRecord::note(self_, seed_, offset);  // Note [Draws under a record]
    Range r{seed_, offset, capture ? static_cast<const uint64_t*>(capture->rng_base) : nullptr};
    offset += n;
    return r;
  }
  // Read under the lock too: rank threads draw (reserve) while a checkpoint reads or
  // replays the state (TSan: a data race otherwise; Note [Checkpoint recompute]).
  uint64_t seed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seed_;
  }
  /// Inside a capture: the capture's offset, relative to each replay's (what a checkpoint saves).
  uint64_t offset() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (const core::GraphCapture* capture = captured_here()) return capture->rng_offset;
    return offset_;
  }
  /// seed() and offset() together, with a handle that expires with this generator.
  GeneratorState state() const {
    std::lock_guard<std::mutex> lock(mu_);
    const core::GraphCapture* capture = captured_here();
    return {self_, seed_, capture ? capture->rng_offset : offset_};
  }
  /// Restores a state saved with seed()/offset() (checkpoint recompute, resumed training).
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    if (core::GraphCapture* capture = captured_here()) capture->rng_offset = offset;
    else offset_ = offset;
  }

 private:
  /// The capture running on this thread when it captures this generator's draws; nullptr
  /// outside a capture. Throws inside one that does not (another generator, or a capture
  /// without graph-safe random numbers).
  core::GraphCapture* captured_here() const {
    core::GraphCapture* capture = core::current_graph_capture();
    if (!capture) return nullptr;
    if (capture->rng_generator != this || !capture->rng_base)
      // (Note [Graph-safe random numbers])
      core::refuse_in_graph_capture("Drawing random numbers from this Generator",
                                    "only the default generator's draws advance with each replay; another one's "
                                    "Philox offset would be frozen into the graph");
    return capture;
  }

  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  // What GeneratorState::handle watches (a Generator never moves: its mutex pins it).
  const std::shared_ptr<Generator* const> self_ = std::make_shared<Generator* const>(this);
};

/// For CPU kernels: throws when `range` is a CUDA graph's (its base is device memory that
/// only device kernels read; Note [Graph-safe random numbers]). `op` names the caller.
inline void require_host_range(const Generator::Range& range, const char* op) {
  if (range.base)
    core::refuse_in_graph_capture(op,
                                  "it draws its random numbers on the CPU, and only device kernels follow a "
                                  "graph's replays (Note [Graph-safe random numbers])");
}

/// The process-wide generator used when an op is not given one: the only one, for the CPU and every CUDA device.
Generator& default_generator();
/// Seeds every generator (the CPU and all CUDA devices share the default one) and rewinds it: same numbers on each.
void manual_seed(uint64_t seed);

}  // namespace frugal
