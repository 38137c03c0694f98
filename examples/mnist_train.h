#pragma once
// The pieces of the Fashion-MNIST examples that tests and the model examples reuse: the
// two models and one training epoch (plain, or mixed precision with a schedule). The
// progress line, evaluation and checkpoints are the library's (train/).
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "autograd/compress.h"
#include "nn/container.h"
#include "nn/data/dataloader.h"
#include "nn/data/idx.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/progress.h"

namespace frugal::examples {

/// "mlp": 784-512-256-10 with ReLU. "cnn": two 3x3 conv + ReLU + 2x2 max-pool blocks
/// (32 and 64 channels), then 3136-128-10.
std::shared_ptr<nn::Sequential> make_model(const std::string& kind);

struct EpochStats {
  double mean_loss = 0;
  int64_t samples = 0;
  double seconds = 0;
};

/// One pass over `loader`: forward, cross-entropy, backward, optimizer step. Updates
/// `progress` (when given; its epoch started by the caller) every `report_every` steps and
/// at the last (reading the loss then is the only host sync in the loop). Throws if the
/// loader yields no batch, or once a loss is inf or NaN, naming the epoch (loader.epoch() +
/// 1) and the step (see Note [Non-finite loss] in train/checks.h).
EpochStats train_epoch(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader,
                       train::Progress* progress = nullptr, int64_t report_every = 50);

// Note [Progress in a log]
// Written to a file or a pipe (`nohup ... > log`, CI), train::Progress prints only each
// epoch's summary unless given log_every: a CPU run of the CNN then showed nothing for
// minutes and never an ETA, which is exactly when one reads a log to see how long is left.
// So the examples print about ten lines an epoch there, each with the step, the rate and the
// epoch's ETA. The training loops update the progress every report_every steps, so the
// period is a multiple of that; on a terminal the line is redrawn in place as before.

/// The log_every of a run of `steps_per_epoch` steps updated every `report_every`: about
/// ten lines an epoch, a multiple of report_every (Note [Progress in a log]).
int64_t progress_log_every(int64_t steps_per_epoch, int64_t report_every);

/// Where a run of train_amp_epoch calls stands: its settings and its step count so far.
struct AmpRun {
  Device device;
  bool amp = false;  // float16 autocast and loss scaling (CUDA)
  int64_t report_every = 50;
  int64_t step = 0;  // steps done, across epochs
  /// Saved tensors of the forward and loss compressed (autograd::CompressSavedTensors) when set.
  std::optional<autograd::CompressOptions> compress_saved = {};
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

/// One epoch (`epoch` counts from 0) as train_resnet and train_vit train: the forward and
/// loss_fn(output, targets) under AutocastGuard(float16) when run.amp (and a
/// CompressSavedTensors scope when run.compress_saved), backward, step and
/// update through `scaler`, then schedule.step(). Every run.report_every steps (and at the
/// last) updates `progress` with the loss and the lr, and ends with its epoch line (the mean
/// loss); reading the loss there is the loop's only host sync besides the scaler's. Throws
/// when the run diverges: a loss that is inf or NaN without an enabled scaler, or a
/// collapsed scale with one (Note [Non-finite loss] in train/checks.h).
void train_amp_epoch(nn::UnaryModule& model, const std::function<Tensor(const Tensor&, const Tensor&)>& loss_fn,
                     optim::Optimizer& opt, optim::GradScaler& scaler, optim::LRScheduler& schedule,
                     data::DataLoader& loader, int64_t epoch, AmpRun& run, train::Progress& progress);

/// The options of `--compress-saved fp8|int8` (every saved activation in that format, Note
/// [Compressed saved tensors] in autograd/compress.h); throws cli::UsageError naming the flag
/// for any other text.
autograd::CompressOptions compress_saved_option(const std::string& text);

/// Throws unless both splits of `ds` hold images, naming `dir` (where it was loaded from):
/// an empty training set would train no step, an empty test set score 0 of 0.
void require_nonempty(const data::FashionMnist& ds, const std::string& dir);

/// The mean and standard deviation of Fashion-MNIST's training pixels (in [0, 1]).
inline constexpr double kFashionMnistMean = 0.2860, kFashionMnistStd = 0.3530;

/// Standardises both image sets of `ds` in place with the training set's pixel mean and
/// std (0.2860, 0.3530), as the usual recipes do.
void standardize(data::FashionMnist& ds);

/// A loader over the test split of `ds` (in order, batches of `batch_size`, on `device`),
/// for train::evaluate.
std::unique_ptr<data::DataLoader> test_loader(const data::FashionMnist& ds, Device device, int64_t batch_size = 1000);

}  // namespace frugal::examples
