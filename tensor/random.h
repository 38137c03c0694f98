#pragma once
// The seeded generator behind rand/randn/randint/dropout (see Note [Counter-based RNG]).
#include <cstdint>
#include <mutex>

#include "core/graph_capture.h"

namespace frugal {

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
  };
  Range reserve(uint64_t n) {
    core::refuse_in_graph_capture("Drawing random numbers (dropout, rand, randn)",
                                  "the Philox offset would be frozen into the graph, so every replay would draw the "
                                  "same numbers (use dropout 0 in captured steps)");
    std::lock_guard<std::mutex> lock(mu_);
    Range r{seed_, offset_};
    offset_ += n;
    return r;
  }
  // Read under the lock too: rank threads draw (reserve) while a checkpoint reads or
  // replays the state (TSan: a data race otherwise; Note [Checkpoint recompute]).
  uint64_t seed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seed_;
  }
  uint64_t offset() const {
    std::lock_guard<std::mutex> lock(mu_);
    return offset_;
  }
  /// Restores a state saved with seed()/offset() (checkpoint recompute, resumed training).
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = offset;
  }

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide generator used when an op is not given one: the only one, for the CPU and every CUDA device.
Generator& default_generator();
/// Seeds every generator (the CPU and all CUDA devices share the default one) and rewinds it: same numbers on each.
void manual_seed(uint64_t seed);

}  // namespace frugal
