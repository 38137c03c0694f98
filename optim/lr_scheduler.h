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
// after == before the lr stays.
//
// Note [Loading a schedule leaves a loaded lr]
// PyTorch's load_state_dict copies the scheduler's counters and leaves every lr to the
// optimizer's state dict, which holds the lr a chain of schedulers made: StepLR and
// ExponentialLR stepped together, a warmup beside ReduceLROnPlateau. Setting the loaded
// scheduler's closed form instead (as frugal once did) dropped the others' moves for good,
// since their later steps scale the lr they find (a resumed StepLR x ExponentialLR ran at 2x
// the uninterrupted lr ever after). Yet a scheduler loaded without the optimizer's state (a
// fresh optimizer's lr) must still get its loaded epoch's lr. So a load sets the closed form
// only on a group whose lr is still the one this scheduler last set, the lr nothing else has
// touched since (a fresh scheduler: its epoch 0); an lr something else set, an optimizer load
// or another scheduler, stays. ReduceLROnPlateau's load follows the same rule with its saved
// last_lr. last_lr() then reports the lr in effect.
// OneCycleLR and CosineAnnealingWarmRestarts do not chain (chains() is false), as in
// PyTorch, whose versions compute every step's lr from the base alone; nor does SequentialLR
// at a milestone, where PyTorch's step(0) sets the next part's closed form.
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

  /// t += 1, then every group's lr = lr_at(base_lr, t). When lr_at throws (OneCycleLR past
  /// its end), nothing changes: neither t nor any lr.
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
  /// Whether the step to epoch t moves an lr set by something else (Note [Chained
  /// schedulers]); false for the schedules PyTorch does not chain (OneCycleLR,
  /// CosineAnnealingWarmRestarts), whose every step sets the closed form.
  virtual bool chains(int64_t /*t*/) const { return true; }

  /// The schedule and its settings as text, "StepLR(step_size=30, gamma=0.1)"; "" for a
  /// scheduler that does not describe itself (a user's subclass), which is then not checked
  /// on load. See Note [A checkpoint names its schedule].
  virtual std::string schedule() const { return ""; }

  /// {"last_epoch": 0-d int64, "base_lrs": float64 [groups], "schedule": int32 [chars] (the
  /// text of schedule(), where not empty)}: what resuming needs.
  StateDict state_dict() const;
  /// Restores last_epoch and base_lrs (checking the group count) and sets the lrs for that
  /// epoch where nothing else set them since this scheduler did (Note [Loading a schedule
  /// leaves a loaded lr]): load the optimizer's state dict too, before or after. Refuses,
  /// changing nothing, a dict saved by another schedule or other settings, or an epoch the
  /// schedule does not reach (OneCycleLR past its end).
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
  bool chains(int64_t t) const override;
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

struct ExponentialLROptions {
  double gamma = 0.0;  // decay factor per epoch (> 0); no default, as in PyTorch: set it
};

/// lr = base * gamma^t (torch ExponentialLR).
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, ExponentialLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  std::string schedule() const override;

 private:
  ExponentialLROptions options_;
};

struct MultiStepLROptions {
  std::vector<int64_t> milestones;  // epochs at which to decay (>= 0, any order; a repeat decays once more)
  double gamma = 0.1;               // decay factor
};

/// lr = base * gamma^(number of milestones <= t) (torch MultiStepLR): the milestones are kept
/// sorted, and one listed k times multiplies by gamma k times there, as torch's Counter does.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, MultiStepLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  std::string schedule() const override;

 private:
  MultiStepLROptions options_;  // milestones sorted
};

struct CosineAnnealingWarmRestartsOptions {
  int64_t T_0 = 1;       // epochs of the first cycle (> 0)
  int64_t T_mult = 1;    // each cycle is T_mult times longer than the last (>= 1)
  double eta_min = 0.0;  // the lowest lr
};

/// SGDR (torch CosineAnnealingWarmRestarts, stepped without an epoch argument): within a cycle
/// of T_i epochs, at T_cur epochs into it, lr = eta_min + (base - eta_min) * (1 + cos(pi *
/// T_cur / T_i)) / 2; then the lr restarts at base with T_i *= T_mult. Cycle i (from 0) has
/// T_0 * T_mult^i epochs. Not chainable, as in PyTorch: every step sets the closed form.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, CosineAnnealingWarmRestartsOptions options);
  double lr_at(double base_lr, int64_t t) const override;
  bool chains(int64_t) const override { return false; }
  std::string schedule() const override;

 private:
  CosineAnnealingWarmRestartsOptions options_;
};

enum class AnnealStrategy { Cos, Linear };

struct OneCycleLROptions {
  std::vector<double> max_lr;  // the peak lr (> 0): one value for every group, or one per group
  int64_t total_steps = 1;     // steps in the cycle (> 0)
  double pct_start = 0.3;      // the fraction of the cycle spent raising the lr, in [0, 1]
  AnnealStrategy anneal_strategy = AnnealStrategy::Cos;
  double div_factor = 25.0;       // initial lr = max_lr / div_factor (> 0)
  double final_div_factor = 1e4;  // min lr = initial lr / final_div_factor (> 0)
  bool three_phase = false;       // up, down to the initial lr, then down to the min lr
};

/// The 1cycle policy (torch OneCycleLR), lr only. Each group's initial lr (its base, written
/// to the group's initial_lr as PyTorch does) is max_lr / div_factor. The phases, with
/// p = pct_start and T = total_steps, end at steps
///   two-phase:   p*T - 1 (initial -> max),  T - 1 (max -> min)
///   three-phase: p*T - 1 (initial -> max),  2*p*T - 2 (max -> initial),  T - 1 (initial -> min)
/// and within a phase from step s to e, pct = (t - s) / (e - s) anneals by cos (end + (start -
/// end) * (1 + cos(pi * pct)) / 2) or linearly. As in PyTorch, step T is allowed (the last
/// phase's formula goes on one step) and stepping past it throws; the schedule is not chainable.
///
/// PyTorch's momentum cycling (cycle_momentum, base_momentum, max_momentum) is not done:
/// frugal's groups have momentum and beta1, but this scheduler leaves them alone.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);
  double lr_at(double base_lr, int64_t t) const override;
  bool chains(int64_t) const override { return false; }
  std::string schedule() const override;

 private:
  OneCycleLROptions options_;
};

}  // namespace frugal::optim
