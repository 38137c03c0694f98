// A convolutional autoencoder on Fashion-MNIST: two strided convolutions encode a 28x28 image
// into 8 maps of 7x7 (half its values), two transposed convolutions (conv_transpose2d, with
// output_padding so that each doubles the size exactly) decode it back, and a sigmoid puts the
// pixels in [0, 1]. Trained with Adam (a cosine learning rate per step) on the mean squared
// error against the input itself, with float16 autocast on CUDA; each epoch prints the test
// set's reconstruction error (the mean squared error per pixel; predicting every pixel as the
// training mean scores 0.353^2 = 0.125).
//
//   train_autoencoder [--data-dir /usr/share/datasets/fashion-mnist] [--device cuda] [--epochs 5]
//                     [--batch-size 128] [--lr 0.002] [--no-amp] [--limit N (train samples)]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/data/idx.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "train/checks.h"
#include "train/progress.h"

using namespace frugal;

namespace {

const char* kUsage =
    "usage: train_autoencoder [--data-dir DIR] [--device cpu|cuda[:N]] [--epochs N] [--batch-size N] [--lr X]\n"
    "                         [--no-amp] [--limit N]\n";

/// 1x28x28 -> 16x14x14 -> 8x7x7 (the code) -> 16x14x14 -> 1x28x28.
std::shared_ptr<nn::Sequential> make_autoencoder() {
  using std::make_shared;
  auto model = make_shared<nn::Sequential>();
  const nn::ConvTranspose2dModuleOptions up{.stride = 2, .padding = 1, .output_padding = 1};
  for (auto m : std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
           make_shared<nn::Conv2d>(1, 16, 3, nn::Conv2dModuleOptions{.stride = 2, .padding = 1}),
           make_shared<nn::ReLU>(),
           make_shared<nn::Conv2d>(16, 8, 3, nn::Conv2dModuleOptions{.stride = 2, .padding = 1}),
           make_shared<nn::ReLU>(), make_shared<nn::ConvTranspose2d>(8, 16, 3, up), make_shared<nn::ReLU>(),
           make_shared<nn::ConvTranspose2d>(16, 1, 3, up), make_shared<nn::Sigmoid>()})
    model->push_back(m);
  return model;
}

/// The mean squared error per pixel of `model`'s reconstructions of `images` (N, 1, 28, 28).
double reconstruction_error(nn::Sequential& model, const Tensor& images, Device device) {
  autograd::NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t begin = 0; begin < images.size(0); begin += 1000) {
    const Tensor x = images.narrow(0, begin, std::min<int64_t>(1000, images.size(0) - begin)).to(device);
    total += sum(square(sub(model(x), x))).to(kCPU, kFloat64).item<double>();
  }
  model.train();
  return total / double(images.numel());
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", device_name = "cpu";
  int64_t epochs = 5, batch = 128, limit = 0;
  double lr = 2e-3;
  bool amp = true;
  cli::parse_or_exit("train_autoencoder", kUsage, [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--no-amp")) amp = false;
      else if (flags.is("--data-dir")) data_dir = flags.text();
      else if (flags.is("--device")) device_name = flags.device();
      else if (flags.is("--epochs")) epochs = flags.positive();
      else if (flags.is("--batch-size")) batch = flags.positive();
      else if (flags.is("--lr")) lr = flags.positive_real();
      else if (flags.is("--limit")) limit = flags.positive();
      else flags.unknown();
    }
  });
  try {
    const Device device(device_name);
    amp = amp && device.is_cuda();  // autocast here is CUDA float16
    manual_seed(0);
    data::FashionMnist ds = data::load_fashion_mnist(data_dir);
    examples::require_nonempty(ds, data_dir);
    Tensor train_x = ds.train_images;  // (N, 1, 28, 28) in [0, 1]: the sigmoid's range
    if (limit > 0) train_x = train_x.narrow(0, 0, std::min(limit, train_x.size(0)));
    // The target of every image is the image itself.
    auto train = std::make_shared<data::TensorDataset>(train_x, train_x);
    data::DataLoader loader(train, {.batch_size = batch, .shuffle = true, .drop_last = true, .device = device});
    const int64_t steps_per_epoch = train::require_batches(loader, train->size());

    auto net = make_autoencoder();
    net->to(device);
    optim::Adam opt(net->parameters(), {.lr = lr});
    optim::CosineAnnealingLR schedule(opt, {.T_max = epochs * steps_per_epoch});  // per step, to 0
    optim::GradScaler scaler({.enabled = amp});
    std::printf("train_autoencoder: %lld parameters, %lld samples, %lld steps, %s%s\n",
                (long long)net->num_parameters(), (long long)train_x.size(0), (long long)(epochs * steps_per_epoch),
                device_name.c_str(), amp ? ", amp float16" : "");
    std::printf("before training: test reconstruction error %.4f\n",
                reconstruction_error(*net, ds.test_images, device));

    examples::AmpRun run{.device = device, .amp = amp};
    train::Progress progress(
        {.epochs = epochs, .unit = "img", .log_every = examples::progress_log_every(loader.size(), run.report_every)});
    const auto loss_fn = [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); };
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      examples::train_amp_epoch(*net, loss_fn, opt, scaler, schedule, loader, epoch, run, progress);
      std::printf("epoch %lld: test reconstruction error %.4f\n", (long long)epoch + 1,
                  reconstruction_error(*net, ds.test_images, device));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_autoencoder: %s\n", e.what());
    return 1;
  }
}
