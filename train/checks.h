#pragma once
// Checks that make a training run stop early and say why, instead of finishing
// "successfully" with garbage: a loss that is no longer finite, a checkpoint that would
// hold NaNs, a path that cannot be written, a data split with nothing in it.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "nn/data/dataloader.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace frugal::train {

// Note [Non-finite loss]
// A loss that is inf or NaN means the run has diverged (most often too high a learning
// rate): from then on the weights are NaN, and so is every checkpoint and prediction. So
// every step's loss is checked, without a host sync per step: LossWatch sums the losses
// on their device, and the sum - not finite exactly when some loss was not - is read in
// check(), which callers make where they read a loss anyway (the progress line, the
// epoch's mean), so the sync is one they already pay. On the CPU reading is free, so each
// loss is checked as it is added and the error names its exact step; on a GPU it names
// the steps since the last check. Callers check before they save a checkpoint; the update
// of the last step is seen by no loss, so save_checkpoint also runs require_finite.
//
// Under an enabled GradScaler a non-finite loss is not an error: its gradients are not
// finite either, so the scaler skips that step and lowers its scale, which is how mixed
// precision recovers from an overflow (Note [Dynamic loss scaling]). A run that cannot
// recover skips every step and halves the scale each time; once the scale falls below
// kMinLossScale (DeepSpeed's min_loss_scale, 1) that is reported as divergence too - or
// below the scaler's init_scale, for a run that chose to start under 1 (its first backoff
// then ends it: the scale it started from was already the floor it accepted). Such losses
// are left out of the window's sum and counted apart (LossSum::nonfinite), so the mean loss
// a progress line shows is that of the steps that trained, not inf for the whole window
// because one step overflowed. A NaN loss whose gradients are finite (every target of the
// batch ignored: the mean over no targets) is not skipped by the scaler, and is counted
// apart the same way; without a scaler it stops the run like any other NaN.

/// The smallest GradScaler scale a recovering run reaches (Note [Non-finite loss]).
constexpr double kMinLossScale = 1.0;

/// What LossWatch::check() read: the window's losses that went into its mean.
struct LossSum {
  double sum = 0;         ///< of the finite losses (without an enabled GradScaler: all, or check() threw)
  int64_t count = 0;      ///< how many losses `sum` holds
  int64_t nonfinite = 0;  ///< inf/NaN losses an enabled GradScaler's run left out of `sum`
  /// sum / count: NaN for a window without a finite loss.
  double mean() const { return count > 0 ? sum / double(count) : std::numeric_limits<double>::quiet_NaN(); }
};

/// Watches a run's losses for inf and NaN (Note [Non-finite loss]).
class LossWatch {
 public:
  /// `opt`'s learning rate goes into the error's hint. With an enabled `scaler`, a
  /// non-finite loss is the scaler's to skip, and only a collapsed scale is an error.
  explicit LossWatch(const optim::Optimizer& opt, const optim::GradScaler* scaler = nullptr)
      : opt_(opt), scaler_(scaler) {}

  /// Records the (0-d) loss of `step` of `epoch` (1-based; epoch 0: the run has none).
  /// On the CPU throws at once if it is not finite; elsewhere only queues a device add.
  void add(const Tensor& loss, int64_t epoch, int64_t step);

  /// The sum of the losses added since the last check (one read when they are on a GPU);
  /// throws naming the epoch and steps if one of them was not finite. Under an enabled
  /// GradScaler inf/NaN losses are counted apart instead, so the mean shown is the mean of
  /// the steps that trained (Note [Non-finite loss]).
  LossSum check();

  /// Losses added since the last check.
  int64_t pending() const { return count_; }

 private:
  bool scaler_skips() const { return scaler_ && scaler_->is_enabled(); }
  /// The scale below which the run counts as diverged (Note [Non-finite loss]).
  double min_scale() const { return std::min(kMinLossScale, scaler_->options().init_scale); }
  [[noreturn]] void diverged(const std::string& what) const;
  [[noreturn]] void scale_collapsed() const;

  const optim::Optimizer& opt_;
  const optim::GradScaler* scaler_;
  // Since the last check: the losses added on the CPU and elsewhere (float64, on that
  // device), how many, and the epoch and step of the first and the last.
  LossSum host_;
  Tensor device_sum_;    // float64 on the losses' device
  Tensor device_count_;  // under an enabled scaler: how many of device_sum_'s losses were finite
  int64_t count_ = 0, epoch_ = 0, first_step_ = 0, last_step_ = 0;
};

/// Throws if a floating tensor of `tensors` holds inf or NaN, naming it and `path` (the
/// file it was about to be saved to, which is then left as it is).
void require_finite(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path);

/// Throws unless a file can be written at `path` now: its directory exists and is
/// writable, and `path` is not a directory. The error names `flag` and `path`. Creates
/// and removes nothing (an atomic save writes a temporary file beside `path` and renames
/// it, so the directory is what must be writable).
void require_writable(const std::string& path, const std::string& flag);

/// Creates directory `dir` (and its parents) if it is missing, then throws unless files can
/// be written into it; the error names `flag` and `dir`. For output directories that a run
/// fills at its end (a profile's trace), so that a bad path fails before the run, not after.
void require_writable_dir(const std::string& dir, const std::string& flag);

/// loader.size(), or throws when that is 0, naming `samples` (the dataset's size), the
/// batch size and drop_last: an empty split would "train" without a single step.
int64_t require_batches(const data::DataLoader& loader, int64_t samples);

}  // namespace frugal::train
