#include "examples/mnist_train.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/loss.h"
#include "examples/flags.h"
#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "train/checks.h"

namespace frugal::examples {

std::shared_ptr<nn::Sequential> make_model(const std::string& kind) {
  using std::make_shared;
  auto model = make_shared<nn::Sequential>();
  if (kind == "mlp") {
    for (auto m : std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
             make_shared<nn::Flatten>(), make_shared<nn::Linear>(784, 512), make_shared<nn::ReLU>(),
             make_shared<nn::Linear>(512, 256), make_shared<nn::ReLU>(), make_shared<nn::Linear>(256, 10)})
      model->push_back(m);
  } else if (kind == "cnn") {
    for (auto m : std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
             make_shared<nn::Conv2d>(1, 32, 3, nn::Conv2dModuleOptions{.padding = 1}), make_shared<nn::ReLU>(),
             make_shared<nn::MaxPool2d>(2), make_shared<nn::Conv2d>(32, 64, 3, nn::Conv2dModuleOptions{.padding = 1}),
             make_shared<nn::ReLU>(), make_shared<nn::MaxPool2d>(2), make_shared<nn::Flatten>(),
             make_shared<nn::Linear>(64 * 7 * 7, 128), make_shared<nn::ReLU>(), make_shared<nn::Linear>(128, 10)})
      model->push_back(m);
  } else {
    FRUGAL_FAIL("make_model: unknown model '", kind, "' (expected mlp or cnn)");
  }
  return model;
}

int64_t progress_log_every(int64_t steps_per_epoch, int64_t report_every) {
  const int64_t tenth = (steps_per_epoch + 9) / 10;
  return std::max<int64_t>(1, (tenth + report_every - 1) / report_every) * report_every;
}

EpochStats train_epoch(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader,
                       train::Progress* progress, int64_t report_every) {
  model.train();
  EpochStats stats;
  const auto start = std::chrono::steady_clock::now();
  const int64_t epoch = loader.epoch() + 1;  // the pass about to start, counted from 1 as printed
  const int64_t steps = loader.size();
  FRUGAL_CHECK(steps > 0, "train_epoch: the loader yields no batch (is the training set empty?)");
  train::LossWatch watch(opt);  // sums the losses on the device: no host sync per step (Note [Non-finite loss])
  double loss_sum = 0;
  int64_t step = 0;
  data::Batch batch;
  while (loader.next(batch)) {
    Tensor loss = cross_entropy(model.forward(batch.inputs), batch.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    watch.add(loss, epoch, ++step);
    stats.samples += batch.inputs.size(0);
    if (progress && (step % report_every == 0 || step == steps)) {
      loss_sum += watch.check().sum;
      progress->update(step, stats.samples, loss.item<double>());
    }
  }
  loss_sum += watch.check().sum;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.mean_loss = loss_sum / double(step);
  return stats;
}

void train_amp_epoch(nn::UnaryModule& model, const std::function<Tensor(const Tensor&, const Tensor&)>& loss_fn,
                     optim::Optimizer& opt, optim::GradScaler& scaler, optim::LRScheduler& schedule,
                     data::DataLoader& loader, int64_t epoch, AmpRun& run, train::Progress& progress) {
  model.train();
  train::LossWatch watch(opt, &scaler);  // Note [Non-finite loss]
  const int64_t steps = loader.size();
  progress.start_epoch(epoch, steps);
  int64_t step = 0, samples = 0;
  train::LossSum losses;  // the epoch's: steps the scaler skipped for inf/NaN are counted apart
  auto take = [&](const train::LossSum& window) {
    losses.sum += window.sum, losses.count += window.count, losses.nonfinite += window.nonfinite;
  };
  for (data::Batch& b : loader) {
    Tensor loss;
    {
      AutocastGuard autocast(run.device, kFloat16, run.amp);
      std::optional<autograd::CompressSavedTensors> compress;
      if (run.compress_saved) compress.emplace(*run.compress_saved);
      loss = loss_fn(model.forward(b.inputs), b.targets);
    }
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    schedule.step();
    watch.add(loss, epoch + 1, ++run.step);
    ++step, samples += b.inputs.size(0);
    if (step % run.report_every == 0 || step == steps) {
      take(watch.check());
      char lr[32];
      std::snprintf(lr, sizeof lr, "lr %.2e", schedule.last_lr()[0]);
      progress.update(step, samples, loss.to(kFloat64).item<double>(), lr);
    }
  }
  take(watch.check());
  progress.end_epoch(
      losses.mean(),
      losses.nonfinite > 0 ? std::to_string(losses.nonfinite) + " steps skipped (inf/NaN loss), not in the mean" : "");
}

autograd::CompressOptions compress_saved_option(const std::string& text) {
  if (text == "fp8") return {.format = autograd::CompressFormat::Fp8E4M3};
  if (text == "int8") return {.format = autograd::CompressFormat::Int8};
  throw cli::UsageError("--compress-saved: expected fp8 or int8, got \"" + text + "\"");
}

void require_nonempty(const data::FashionMnist& ds, const std::string& dir) {
  const int64_t train = ds.train_images.size(0), test = ds.test_images.size(0);
  FRUGAL_CHECK(train > 0 && test > 0, dir, ": the training set has ", train, " images and the test set ", test,
               "; both need some");
}

void standardize(data::FashionMnist& ds) {
  const double mean = kFashionMnistMean, std = kFashionMnistStd;
  for (Tensor* images : {&ds.train_images, &ds.test_images}) *images = ops::affine(*images, 1.0 / std, -mean / std);
}

std::unique_ptr<data::DataLoader> test_loader(const data::FashionMnist& ds, Device device, int64_t batch_size) {
  return std::make_unique<data::DataLoader>(data::TensorDataset(ds.test_images, ds.test_labels),
                                            data::DataLoaderOptions{.batch_size = batch_size, .device = device});
}

}  // namespace frugal::examples
