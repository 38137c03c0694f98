#pragma once
// ReduceLROnPlateau: lowers the lr when a metric stops improving, as
// torch.optim.lr_scheduler.ReduceLROnPlateau.
//
// Note [ReduceLROnPlateau state]
// Unlike the schedules of optim/lr_scheduler.h this one has no closed form: its lrs follow
// from the metrics it was given, so it is not an LRScheduler (nor is it in PyTorch, where it
// takes step(metric)). It multiplies each group's current lr (whatever set it) by factor,
// floored at the group's min_lr, after more than `patience` epochs without improvement, then
// waits `cooldown` epochs. Its state dict holds everything a resumed run needs: the counters,
// the best metric and the lrs it last saw; loading it also sets the groups' lrs to those
// where nothing else set them since this scheduler did (Note [Loading a schedule leaves a
// loaded lr] in optim/lr_scheduler.h), so a resumed run gives the lrs of an uninterrupted one
// whether or not the optimizer's own state dict is loaded too, and a loaded optimizer's lr,
// which holds another scheduler's moves as well, stays (PyTorch's leaves every lr to the
// optimizer's state dict).
#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

enum class PlateauMode { Min, Max };  // whether a lower or a higher metric is better
enum class ThresholdMode { Rel, Abs };

struct ReduceLROnPlateauOptions {
  PlateauMode mode = PlateauMode::Min;
  double factor = 0.1;      // new lr = lr * factor, in [0, 1)
  int64_t patience = 10;    // epochs without improvement tolerated before a reduction (>= 0)
  double threshold = 1e-4;  // what counts as an improvement (>= 0), see threshold_mode
  /// Rel: better than best * (1 - threshold) (Min) or best * (1 + threshold) (Max);
  /// Abs: better than best - threshold (Min) or best + threshold (Max).
  ThresholdMode threshold_mode = ThresholdMode::Rel;
  int64_t cooldown = 0;                // epochs after a reduction in which bad epochs are not counted (>= 0)
  std::vector<double> min_lr = {0.0};  // the lowest lr (>= 0): one value for every group, or one per group
  double eps = 1e-8;                   // a reduction smaller than eps is not made (>= 0)
};

/// Holds a reference to the optimizer, which must outlive it.
///
///   ReduceLROnPlateau sched(opt, {.mode = PlateauMode::Min, .patience = 5});
///   for (...) { train(); sched.step(validation_loss); }
class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  ReduceLROnPlateau(const ReduceLROnPlateau&) = delete;
  ReduceLROnPlateau& operator=(const ReduceLROnPlateau&) = delete;

  /// One epoch's metric: updates best and the counters and, after more than patience bad
  /// epochs, lowers every group's lr to max(lr * factor, min_lr) (unless that moves it by no
  /// more than eps). A NaN metric is a bad epoch, as in PyTorch.
  void step(double metric);

  /// Every group's lr after the last step (at construction: the lrs then).
  const std::vector<double>& last_lr() const { return last_lr_; }
  /// The number of step() calls since construction.
  int64_t last_epoch() const { return last_epoch_; }
  /// The best metric so far (+inf for Min, -inf for Max before the first step).
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }
  Optimizer& optimizer() const { return optimizer_; }

  /// The settings as text, "ReduceLROnPlateau(mode=min, factor=0.1, ...)", saved in the state
  /// dict and checked on load (Note [A checkpoint names its schedule]).
  std::string schedule() const;

  /// {"last_epoch", "num_bad_epochs", "cooldown_counter": 0-d int64, "best": 0-d float64,
  /// "last_lr": float64 [groups], "schedule": int32 [chars]} (Note [ReduceLROnPlateau state]).
  StateDict state_dict() const;
  /// Restores the state and sets every group's lr to the saved last_lr, unless something else
  /// set it since this scheduler last did (an optimizer load: Note [Loading a schedule leaves
  /// a loaded lr] in optim/lr_scheduler.h). Refuses, changing
  /// nothing, a dict with a missing or unexpected key, another group count, or other settings.
  void load_state_dict(const StateDict& dict);

 private:
  bool is_better(double metric) const;

  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

}  // namespace frugal::optim
