#pragma once
// The memory planner for models made of blocks (ResNet's bottlenecks, a transformer's
// layers): for a byte budget, the fastest BlockMemoryPlan whose predicted peak fits
// (Note [Block planner] in nn/block_planner.cpp).
//
//   nn::BlockPlanner planner(kGpu, net->num_blocks(), [&](const nn::BlockMemoryPlan& p) {
//     net->memory_plan = p;
//     train_step();  // forward, loss, backward, optimizer step, zero_grad
//   });
//   planner.profile();                          // a few steps per choice
//   nn::BlockMemoryPlan plan = planner.plan(3ull << 30);  // throws if nothing fits
//   std::cout << planner.report(plan);
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "nn/block_memory.h"
#include "nn/module.h"

namespace frugal::nn {

/// What one uniform run (every block the same choice) measured.
struct ChoiceProfile {
  BlockMemory choice = BlockMemory::Keep;
  std::vector<int64_t> kept;           ///< per block: allocated bytes it adds across its forward (what it saves,
                                       ///< its output, less its input if nothing keeps that)
  std::vector<int64_t> forward_peak;   ///< per block: peak allocated during its forward (absolute)
  std::vector<int64_t> backward_peak;  ///< per block: peak allocated during its backward (absolute)
  int64_t before_blocks_peak = 0;      ///< peak before the first block (the stem's forward)
  int64_t head_peak = 0;               ///< peak between the last block's forward and its backward (head, loss)
  int64_t after_blocks_peak = 0;       ///< peak after the first block's backward (stem backward, optimizer)
  int64_t measured_peak = 0;           ///< the step's peak allocated bytes
  double step_ms = 0;                  ///< median step time
};

class BlockPlanner {
 public:
  /// Runs one whole training step with the blocks run as the plan says.
  using Step = std::function<void(const BlockMemoryPlan&)>;

  /// `choices`: what the planner may pick from (Keep is always among them). Lossy choices
  /// must be listed to be considered. `timing_steps`: timed steps per choice (median).
  BlockPlanner(Device device, int64_t num_blocks, Step step, std::vector<BlockMemory> choices = lossless(),
               int timing_steps = 3);
  /// Every choice that is not lossy (nn::is_lossy): what the planner picks from by default.
  static std::vector<BlockMemory> lossless();

  /// One warm-up, one probed and `timing_steps` timed steps per choice, every block that
  /// choice (run it after the training loop's own warm-up: optimizer state and algorithm
  /// searches must not land in the profile). Empties the device's and the pinned pool's
  /// caches at the end, so the plan that runs next starts from nothing reserved. Puts the
  /// default generator, and every generator the steps drew from on this thread, back as it
  /// found them (Note [Profiling side effects]); parameters and optimizer state move as the
  /// step moves them (a step that updates them trains on the profile's batches).
  void profile();
  /// profile(), and `model`'s buffers (batch norm's running statistics and counts) put back
  /// as found too.
  void profile(const Module& model);
  const std::vector<ChoiceProfile>& profiles() const { return profiles_; }

  /// The predicted peak allocated bytes of one step under `plan` (never below what the
  /// profiled runs imply; see Note [Block planner]).
  int64_t predict_peak(const BlockMemoryPlan& plan) const;
  /// The predicted step time in ms.
  double predict_ms(const BlockMemoryPlan& plan) const;
  /// The plan with every block Keep, as measured.
  int64_t default_peak() const;

  /// The fastest plan found whose predicted peak is <= budget. Throws a frugal::Error that
  /// names the budget and the lowest peak any plan reaches when none fits.
  BlockMemoryPlan plan(int64_t budget) const;
  /// The lowest predicted peak over the plans plan() searches (its greedy path to the end).
  int64_t lowest_peak() const;

  /// One line per block (choice, bytes kept and saved against Keep, time added), then the
  /// predicted peak and step time and, when given (> 0), the measured ones.
  std::string report(const BlockMemoryPlan& plan, int64_t measured_peak = 0, double measured_ms = 0) const;

 private:
  void profile(const Module* model);
  const ChoiceProfile& profile_of(BlockMemory choice) const;
  std::vector<BlockMemory> choices_of(const BlockMemoryPlan& plan) const;
  int64_t predict_peak(const std::vector<BlockMemory>& choices) const;
  double predict_ms(const std::vector<BlockMemory>& choices) const;
  /// What block b adds to the Keep step under `choice`: the choice's extra step time in its
  /// uniform run, shared among the blocks by their forward time (Note [Block planner]).
  double added_ms(int64_t b, BlockMemory choice) const;
  /// Greedy: from all Keep, the move with the most peak bytes freed per ms added until the
  /// peak is <= budget (or no move frees anything); then moves back to faster choices that
  /// keep it under. Returns the choices and whether they fit.
  std::pair<std::vector<BlockMemory>, bool> search(int64_t budget) const;

  Device device_;
  int64_t num_blocks_;
  Step step_;
  std::vector<BlockMemory> choices_;
  int timing_steps_;
  std::vector<ChoiceProfile> profiles_;  // one per choice, in choices_' order
  std::vector<int64_t> output_bytes_;    // per block, from the Keep run
  std::vector<double> forward_ms_;       // per block, from the Keep run
  double total_forward_ms_ = 0;          // their sum
};

/// Reads a memory budget: "3GiB", "512MiB", "2.5GB", "1e9" (bytes), or "0.5x" (that
/// fraction of `default_peak`). Throws naming the flag text for anything else.
int64_t parse_memory_budget(const std::string& text, int64_t default_peak);

}  // namespace frugal::nn
