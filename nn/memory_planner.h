#pragma once
// A memory-budget planner for checkpointing a Sequential chain: it measures what each
// module keeps alive for backward, predicts the peak allocated bytes of a training step
// for any choice of checkpointed segments, and picks segments that fit a byte budget
// (see Note [Memory plan] in nn/memory_planner.cpp).
//
//   nn::MemoryPlanner planner(model, sample_x, [&](const Tensor& y) { return cross_entropy(y, t); });
//   nn::MemoryPlan plan = planner.plan(budget_bytes);  // throws if no plan fits
//   std::cout << planner.report(plan, planner.measure_step(plan));
//   Tensor loss = loss_fn(planner.forward(plan, x));    // the chain, planned segments checkpointed
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "nn/container.h"

namespace frugal::nn {

/// What one module of the chain costs, measured by MemoryPlanner::profile on the
/// allocator's statistics (bytes are allocated bytes: rounded block sizes).
struct ModuleMemory {
  std::string name;               ///< "3 Linear"
  int64_t activation_bytes;       ///< change in allocated bytes across its forward, output kept, input dropped
                                  ///< (cached_casts included: they live until the forward's autocast ends)
  int64_t input_bytes;            ///< the allocation its input occupies
  int64_t output_bytes;           ///< the allocation its output occupies
  int64_t input_released;         ///< bytes freed when the caller drops the input (0: the graph keeps it)
  int64_t output_released;        ///< bytes freed when the caller drops the output, its graph held (0: kept)
  int64_t forward_extra;          ///< peak during its forward above the state before it (with grad)
  int64_t forward_extra_no_grad;  ///< the same, under NoGradGuard (a checkpointed forward)
  int64_t backward_extra;         ///< peak during its backward above the plain forward's state after it,
                                  ///< less the cached_casts (dropped as the forward's autocast ended)
  int64_t backward_start_extra;   ///< allocated as its backward starts, above that same state
  int64_t grad_bytes;             ///< parameter gradients its backward allocates (0 where .grad already exists)
  int64_t cached_casts;           ///< parameter casts that only autocast's cast cache holds after its forward
  int64_t cached_casts_no_grad;   ///< the same, under NoGradGuard (its graph keeps none of them)
  double forward_seconds;         ///< forward time (the recompute cost of checkpointing it)
};

/// A chain's profile: the modules, the loss and the state the step starts from.
struct MemoryProfile {
  std::vector<ModuleMemory> modules;
  int64_t base_bytes = 0;           ///< allocated when the step starts (weights, data, optimizer state)
  int64_t loss_forward_extra = 0;   ///< peak of the loss's forward above the forward's end state
  int64_t loss_backward_extra = 0;  ///< peak of the loss's backward above the forward's end state
  int64_t measured_plain_peak = 0;  ///< peak allocated of the profiled (plain) training step
};

/// Modules [begin, end) of the chain, run as one block.
struct Segment {
  int64_t begin = 0, end = 0;
  bool checkpointed = false;
};

struct MemoryPlan {
  std::string method;  ///< "none", "sqrt(n)", "greedy", "uniform(k)"
  std::vector<Segment> segments;
  int64_t predicted_peak = 0;    ///< peak allocated bytes of one training step, absolute
  int64_t budget = 0;            ///< 0 when the plan was not made for a budget
  double recompute_seconds = 0;  ///< forward time of the checkpointed modules (run again in backward)
  int64_t checkpointed_count() const;
};

/// Plans checkpointing for `seq` trained on inputs shaped like `sample` with loss `loss`
/// (default: sum of the output). With `autocast` set, the steps it profiles and measures
/// run their forward and loss under AutocastGuard(sample's device, *autocast) and their
/// backward outside it, as a mixed-precision training loop does. The chain, sample and
/// loss must outlive the planner.
class MemoryPlanner {
 public:
  using LossFn = std::function<Tensor(const Tensor&)>;
  MemoryPlanner(Sequential& seq, Tensor sample, LossFn loss = {}, std::optional<DType> autocast = std::nullopt);

  /// Measures every module (runs a few forward passes and one training step on the sample).
  /// Called by the constructor; call again after the resting state changed (an optimizer
  /// created its state). Parameter gradients are left as found: an undefined .grad stays
  /// undefined, a defined one is zeroed - so call it between steps, after zero_grad. The
  /// chain's buffers (batch norm's running statistics) and the default generator's state are
  /// put back as found, here and in measure_step (Note [Memory plan], side effects).
  void profile();
  const MemoryProfile& memory_profile() const { return profile_; }

  /// The predicted peak allocated bytes of one training step (forward, loss, backward) with
  /// `segments` (contiguous, covering the chain) as blocks, the checkpointed ones recomputed.
  int64_t predict_peak(const std::vector<Segment>& segments) const;

  /// Nothing checkpointed.
  MemoryPlan plan_none() const;
  /// k segments as checkpoint_sequential makes them (size() / k modules each, the last one
  /// the rest), all but the last checkpointed.
  MemoryPlan plan_uniform(int64_t k) const;
  /// Chen et al. 2016's baseline: plan_uniform(round(sqrt(n))).
  MemoryPlan plan_sqrt() const;
  /// Greedy fit to `budget` bytes of peak allocated memory: for each segment count k, split
  /// the chain into k segments of about equal activation bytes and checkpoint the segments
  /// that free the most activation bytes per second of recompute until the predicted peak
  /// fits; of the plans that fit, the one with the least recompute time. Throws a
  /// frugal::Error giving the budget and the lowest peak reachable when none fits.
  MemoryPlan plan(int64_t budget) const;

  /// Runs the chain on x with the plan's checkpointed segments under autograd::checkpoint
  /// (under the caller's autocast state, not the planner's).
  Tensor forward(const MemoryPlan& plan, const Tensor& x) const;
  /// Peak allocated bytes of one training step on the sample under the plan (gradients
  /// left as profile() leaves them).
  int64_t measure_step(const MemoryPlan& plan) const;

  /// A table, one row per segment (modules, activation bytes, checkpointed?), then the
  /// predicted peak and, when measured_peak > 0, the measured one.
  std::string report(const MemoryPlan& plan, int64_t measured_peak = 0) const;

 private:
  Tensor loss_of(const Tensor& y) const;
  /// Starts an AutocastGuard in `guard` for a profiled forward when autocast_ is set.
  void enter_autocast(std::optional<AutocastGuard>& guard) const;
  // The passes of profile(), each filling its fields of `prof`.
  /// No-grad passes: forward times (best of three), checkpointed-forward peaks, sizes.
  void profile_forward(MemoryProfile& prof) const;
  /// Grad mode, one module at a time: what dropping each output frees while its graph lives.
  void profile_output_release(MemoryProfile& prof) const;
  /// The parameter gradients each module's backward allocates (shared ones counted once).
  void profile_grad_bytes(MemoryProfile& prof) const;
  /// The instrumented training step (Note [Memory plan]); returns its peak allocated bytes.
  int64_t profile_step(MemoryProfile& prof) const;
  MemoryPlan make_plan(std::string method, std::vector<Segment> segments, int64_t budget) const;

  Sequential& seq_;
  Tensor sample_;
  LossFn loss_;
  std::optional<DType> autocast_;
  MemoryProfile profile_;
};

}  // namespace frugal::nn
