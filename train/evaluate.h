#pragma once
// evaluate(model, loader): a classifier's accuracy and mean loss over one pass of a loader.
#include <cstdint>
#include <functional>

#include "nn/data/dataloader.h"
#include "nn/module.h"

namespace frugal::train {

/// What evaluate() measured.
struct EvalResult {
  double loss = 0;      ///< the mean of the per-sample loss
  double accuracy = 0;  ///< the share of samples whose argmax over dim 1 is the target (NaN: not a classifier)
  int64_t samples = 0;
};

struct EvaluateOptions {
  /// The batch's mean loss from (outputs, targets); default: cross_entropy.
  std::function<Tensor(const Tensor& outputs, const Tensor& targets)> loss_fn = {};
  /// Whether outputs are (B, C) scores of targets (B) class indices; false: accuracy is NaN.
  bool accuracy = true;
};

/// One pass over `loader` (which starts a pass and so advances loader.epoch()): `model`
/// runs in eval mode and without grad; every module's mode is restored afterwards, also
/// when it throws. The loss and the correct count are summed on the model's device and read
/// once at the end. Throws naming `evaluate` when the loader yields no batch, or when the
/// outputs are not (B, C) with targets (B) and options.accuracy is on.
EvalResult evaluate(nn::UnaryModule& model, data::DataLoader& loader, const EvaluateOptions& options = {});

/// Puts a module tree in eval mode and, when it goes, each module back in the mode it had
/// (a partly frozen model keeps its frozen parts in eval).
class EvalModeGuard {
 public:
  explicit EvalModeGuard(nn::Module& model);
  ~EvalModeGuard();
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  nn::Module& model_;
  std::vector<std::pair<nn::Module*, bool>> modes_;  // depth first, parents before children
};

}  // namespace frugal::train
