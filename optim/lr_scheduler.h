#pragma once
// Learning-rate schedules, as torch.optim.lr_scheduler, in closed form.
//
// Note [LR schedulers]
// A scheduler sets every group's lr from the group's base lr and its epoch counter t.
// Making one does PyTorch's initial step: the base lr is the group's initial_lr
// (set to its current lr by the first scheduler made on the optimizer, so later ones
// start from the same value), t = 0 and the lr is set for epoch 0. Each step()
// increments t and sets the lr for epoch t. Every schedule here has a closed form of t,
// lr_at(base, t) (PyTorch's _get_closed_form_lr), which equals what PyTorch's recursive
// form gives when nothing else touches the lr, without its accumulated rounding: a step
// uses it when the group's lr is still lr_at(base, t - 1) (base at t = 0).
//
// Note [Chained schedulers]
// PyTorch's schedulers compose: two stepped on one optimizer (a StepLR decay under a
// LinearLR warmup), or one stepped after the user set the lr, each move the lr the group
// has by their own step. So when the group's lr is not this schedule's previous value, a
// step applies the schedule's move to it instead of overwriting it, as PyTorch's recursive
// forms do: with before = lr_at(base, t - 1), after = lr_at(base, t) and the schedule's
// anchor a (0; eta_min for the cosines), lr = a + (lr - a) (after - a) / (before - a):
// StepLR's and LinearLR's ratios, CosineAnnealingLR's recursion around eta_min. Where
// before == a (a cosine at its minimum) the step adds after - before, as PyTorch's; where
// after == before the lr stays. Loading a state dict sets the closed form of the loaded
// epoch: a resumed chain is the last loaded scheduler's lr until the others step.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

/// Base of the schedulers. Holds a reference to the optimizer, which must outlive it.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// t += 1, then every group's lr = lr_at(base_lr, t).
  void step();
  /// The lr of each group as last set by this scheduler (PyTorch's get_last_lr()).
  const std::vector<double>& last_lr() const { return last_lr_; }
  /// t: the number of step() calls since construction (PyTorch's last_epoch).
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }

  /// The schedule in closed form: the lr at epoch `t` >= 0 for a group whose base lr is `base_lr`.
  virtual double lr_at(double base_lr, int64_t t) const = 0;
  /// The value the schedule's step from epoch t - 1 to t scales around when it moves an lr
  /// set by something else (Note [Chained schedulers]): 0 for the multiplicative schedules.
  virtual double chain_anchor(int64_t /*t*/) const { return 0.0; }

  /// The schedule and its settings as text, "StepLR(step_size=30, gamma=0.1)"; "" for a
  /// scheduler that does not describe itself (a user's subclass), which is then not checked
  /// on load. See Note [A checkpoint names its schedule].
  virtual std::string schedule() const { return ""; }

  /// {"last_epoch": 0-d int64, "base_lrs": float64 [groups], "schedule": int32 [chars] (the
  /// text of schedule(), where not empty)}: what resuming needs.
  StateDict state_dict() const;
  /// Restores last_epoch and base_lrs (checking the group count) and sets the lrs for that
  /// epoch. Refuses, changing nothing, a dict saved by another schedule or other settings.
  void load_state_dict(const StateDict& dict);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  /// Sets base lrs and the epoch-0 lr: call at the end of every concrete constructor
  /// (lr_at is virtual, so the base constructor cannot).
  void initial_step();
  /// Sets every group's lr for the current epoch: its closed form, or (chain) the step from
  /// the previous epoch applied to an lr something else set (Note [Chained schedulers]).
  void apply(bool chain);

  Optimizer& optimizer_;

 private:
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

struct StepLROptions {
  int64_t step_size = 1;  // epochs between decays (> 0)
  double gamma = 0.1;     // decay factor
};

/// lr = base * gamma^floor(t / step_size) (torch StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, StepLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  std::string schedule() const override;

 private:
  StepLROptions options_;
};

struct CosineAnnealingLROptions {
  int64_t T_max = 1;     // half period in epochs (> 0)
  double eta_min = 0.0;  // the lowest lr
};

/// lr = eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2 (torch CosineAnnealingLR;
/// past T_max the cosine goes on, as PyTorch's does).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, CosineAnnealingLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  double chain_anchor(int64_t) const override { return options_.eta_min; }
  std::string schedule() const override;

 private:
  CosineAnnealingLROptions options_;
};

struct LinearLROptions {
  double start_factor = 1.0 / 3.0;  // in (0, 1]
  double end_factor = 1.0;          // in [0, 1]
  int64_t total_iters = 5;          // epochs to go from start to end (> 0)
};

/// lr = base * (start + (end - start) * min(t, total_iters) / total_iters) (torch LinearLR):
/// with the default end_factor 1, a linear warmup from start_factor * base to base.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, LinearLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  std::string schedule() const override;

 private:
  LinearLROptions options_;
};

/// The linear warmup of the brief's vocabulary is torch's LinearLR.
using LinearWarmup = LinearLR;
using LinearWarmupOptions = LinearLROptions;

/// Runs schedulers one after another (torch SequentialLR): schedulers[k] is in charge
/// from milestones[k-1] (0 for k = 0) and sees t - milestones[k-1] as its epoch. The
/// sub-schedulers must be made on the same optimizer; only their lr_at is used.
///
///   auto warm = std::make_shared<LinearLR>(opt, LinearLROptions{.start_factor = 0.01, .total_iters = 100});
///   auto cos = std::make_shared<CosineAnnealingLR>(opt, CosineAnnealingLROptions{.T_max = 900});
///   SequentialLR sched(opt, {warm, cos}, {100});
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(double base_lr, int64_t t) const override;
  double chain_anchor(int64_t t) const override;
  std::string schedule() const override;

 private:
  /// The part in charge at epoch t, and the epoch it sees.
  std::pair<const LRScheduler*, int64_t> part_at(int64_t t) const;

  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

struct WarmupCosineLROptions {
  int64_t warmup_steps = 0;    // linear warmup length (>= 0)
  int64_t total_steps = 1;     // warmup + cosine decay (> warmup_steps)
  double start_factor = 1e-3;  // the warmup starts at start_factor * base (in (0, 1])
  double eta_min = 0.0;        // the lr the cosine decays to
};

/// The usual transformer schedule: SequentialLR of LinearLR(start_factor -> 1 over
/// warmup_steps) and CosineAnnealingLR(T_max = total_steps - warmup_steps, eta_min), in
/// closed form:
///   t < W:  base * (start_factor + (1 - start_factor) * t / W)
///   t >= W: eta_min + (base - eta_min) * (1 + cos(pi * (t - W) / (total - W))) / 2
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  double chain_anchor(int64_t t) const override { return t <= options_.warmup_steps ? 0.0 : options_.eta_min; }
  std::string schedule() const override;

 private:
  WarmupCosineLROptions options_;
};

}  // namespace frugal::optim
