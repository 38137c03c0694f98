#pragma once
// The pieces of the Fashion-MNIST example that tests reuse: the two models, one
// training epoch, evaluation and checkpoints (model + optimizer + progress in one
// safetensors file).
#include <functional>
#include <memory>
#include <string>

#include "nn/container.h"
#include "nn/data/dataloader.h"
#include "nn/data/idx.h"
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
/// the loss then is the only host sync in the loop).
EpochStats train_epoch(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader,
                       const std::function<void(int64_t, int64_t, double, double)>& progress = {},
                       int64_t report_every = 50);

/// Standardises both image sets of `ds` in place with the training set's pixel mean and
/// std (0.2860, 0.3530), as the usual recipes do.
void standardize(data::FashionMnist& ds);

/// Classification accuracy of `model` on (images, labels), in batches, without grad.
double evaluate(nn::UnaryModule& model, const Tensor& images, const Tensor& labels, int64_t batch_size = 1000);

/// Saves model and optimizer state with `epoch` (epochs finished) and `model_kind` as
/// metadata; atomic (see nn::save_safetensors).
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t epoch,
                     const std::string& model_kind);
/// Restores what save_checkpoint wrote; returns the epochs finished. Throws if the
/// file was written for another model kind.
int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                        const std::string& model_kind);

}  // namespace frugal::examples
