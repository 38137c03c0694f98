#pragma once
// The pieces of the Fashion-MNIST examples that tests and the model examples reuse: the
// two models, one training epoch (plain, or mixed precision with a schedule), evaluation
// and checkpoints (model + optimizer + progress in one safetensors file).
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

namespace frugal::examples {

/// "mlp": 784-512-256-10 with ReLU. "cnn": two 3x3 conv + ReLU + 2x2 max-pool blocks
/// (32 and 64 channels), then 3136-128-10.
std::shared_ptr<nn::Sequential> make_model(const std::string& kind);

struct EpochStats {
  double mean_loss = 0;
  int64_t samples = 0;
  double seconds = 0;
};

/// One pass over `loader`: forward, cross-entropy, backward, optimizer step. Calls
/// `progress(step, steps, loss, samples_per_s)` every `report_every` steps (reading
/// the loss then is the only host sync in the loop). Throws if the loader yields no batch,
/// or once a loss is inf or NaN, naming the epoch (loader.epoch() + 1) and the step (see
/// Note [Non-finite loss] in examples/train_checks.h).
EpochStats train_epoch(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader,
                       const std::function<void(int64_t, int64_t, double, double)>& progress = {},
                       int64_t report_every = 50);

/// Where a run of train_amp_epoch calls stands: its settings and its step count so far.
struct AmpRun {
  Device device;
  bool amp = false;  // float16 autocast and loss scaling (CUDA)
  int64_t total = 0, batch = 0, report_every = 50;
  int64_t step = 0;  // steps done, across epochs
  /// Saved tensors of the forward and loss compressed (autograd::CompressSavedTensors) when set.
  std::optional<autograd::CompressOptions> compress_saved = {};
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

/// One epoch (`epoch` counts from 0) as train_resnet and train_vit train: the forward and
/// loss_fn(output, targets) under AutocastGuard(float16) when run.amp (and a
/// CompressSavedTensors scope when run.compress_saved), backward, step and
/// update through `scaler`, then schedule.step(). Every run.report_every steps (and at the
/// last) prints "epoch E step S/T loss L lr X | R img/s, ETA N s"; reading the loss there
/// is the loop's only host sync besides the scaler's. Throws when the run diverges: a loss
/// that is inf or NaN without an enabled scaler, or a collapsed scale with one (Note
/// [Non-finite loss] in examples/train_checks.h).
void train_amp_epoch(nn::UnaryModule& model, const std::function<Tensor(const Tensor&, const Tensor&)>& loss_fn,
                     optim::Optimizer& opt, optim::GradScaler& scaler, optim::LRScheduler& schedule,
                     data::DataLoader& loader, int64_t epoch, AmpRun& run);

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

/// Classification accuracy of `model` on (images, labels), in batches, without grad.
/// Throws if there are no images.
double evaluate(nn::UnaryModule& model, const Tensor& images, const Tensor& labels, int64_t batch_size = 1000);

/// Saves model and optimizer state with `epoch` (epochs finished) and `model_kind` as
/// metadata; atomic (see nn::save_safetensors). Throws, leaving `path` as it was, if a
/// tensor holds inf or NaN.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t epoch,
                     const std::string& model_kind);
/// Restores what save_checkpoint wrote; returns the epochs finished. Throws if the
/// file was written for another model kind or its 'epoch' is not a whole non-negative
/// integer (checked before anything is loaded).
int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                        const std::string& model_kind);

}  // namespace frugal::examples
