#include "examples/mnist_train.h"

#include <chrono>
#include <cstdio>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/loss.h"
#include "examples/flags.h"
#include "examples/train_checks.h"
#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

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

EpochStats train_epoch(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader,
                       const std::function<void(int64_t, int64_t, double, double)>& progress, int64_t report_every) {
  model.train();
  EpochStats stats;
  const auto start = std::chrono::steady_clock::now();
  const int64_t epoch = loader.epoch() + 1;  // the pass about to start, counted from 1 as printed
  const int64_t steps = loader.size();
  FRUGAL_CHECK(steps > 0, "train_epoch: the loader yields no batch (is the training set empty?)");
  LossWatch watch(opt);  // sums the losses on the device: no host sync per step (Note [Non-finite loss])
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
      loss_sum += watch.check();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      progress(step, steps, loss.item<double>(), double(stats.samples) / secs);
    }
  }
  loss_sum += watch.check();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.mean_loss = loss_sum / double(step);
  return stats;
}

void train_amp_epoch(nn::UnaryModule& model, const std::function<Tensor(const Tensor&, const Tensor&)>& loss_fn,
                     optim::Optimizer& opt, optim::GradScaler& scaler, optim::LRScheduler& schedule,
                     data::DataLoader& loader, int64_t epoch, AmpRun& run) {
  model.train();
  LossWatch watch(opt, &scaler);  // Note [Non-finite loss]
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
    if (run.step % run.report_every == 0 || run.step == run.total) {
      watch.check();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start).count();
      const double rate = double(run.step * run.batch) / secs;
      std::printf("epoch %lld step %lld/%lld loss %.4f lr %.2e | %.0f img/s, ETA %.0f s\n", (long long)epoch + 1,
                  (long long)run.step, (long long)run.total, loss.to(kFloat64).item<double>(), schedule.last_lr()[0],
                  rate, double(run.total - run.step) * double(run.batch) / rate);
      std::fflush(stdout);
    }
  }
  watch.check();
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

double evaluate(nn::UnaryModule& model, const Tensor& images, const Tensor& labels, int64_t batch_size) {
  autograd::NoGradGuard no_grad;
  model.eval();
  const Device device = model.parameters().at(0).device();
  Tensor correct = zeros({}, {kInt64, device});
  const int64_t n = images.size(0);
  FRUGAL_CHECK(n > 0, "evaluate: the test set is empty (0 images)");
  for (int64_t i = 0; i < n; i += batch_size) {
    const int64_t len = std::min(batch_size, n - i);
    Tensor x = images.narrow(0, i, len).to(device);
    Tensor y = labels.narrow(0, i, len).to(device);
    Tensor predicted = ops::argmax(model.forward(x), 1);
    correct = ops::add(correct, ops::sum(ops::eq(predicted, y)));
  }
  model.train();
  return double(correct.item<int64_t>()) / double(n);
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t epoch,
                     const std::string& model_kind) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model.state_dict()) tensors.emplace_back("model." + name, t);
  for (auto& [name, t] : opt.state_dict()) tensors.emplace_back("optim." + name, t);
  require_finite(tensors, path);  // a diverged run must not replace a good checkpoint
  nn::save_safetensors(path, tensors, {{"epoch", std::to_string(epoch)}, {"model", model_kind}});
}

int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                        const std::string& model_kind) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  auto meta = [&](const std::string& key) {
    auto it = file.metadata.find(key);
    FRUGAL_CHECK(it != file.metadata.end(), "load_checkpoint: ", path, " has no '", key, "' metadata");
    return it->second;
  };
  FRUGAL_CHECK(meta("model") == model_kind, "load_checkpoint: ", path, " holds a '", meta("model"), "' model, not '",
               model_kind, "'");
  const std::string epoch_text = meta("epoch");
  const std::optional<int64_t> epoch = cli::parse_int(epoch_text, 0);
  FRUGAL_CHECK(epoch, "load_checkpoint: ", path, ": metadata 'epoch' must be a non-negative integer, got \"",
               epoch_text, "\"");
  std::map<std::string, Tensor> model_state;
  optim::StateDict optim_state;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) model_state[name.substr(6)] = t;
    else if (name.rfind("optim.", 0) == 0) optim_state.emplace_back(name.substr(6), t);
  }
  model.load_state_dict(model_state);
  opt.load_state_dict(optim_state);
  return *epoch;
}

}  // namespace frugal::examples
