// Trains a small Vision Transformer (models::VisionTransformer: 28x28 images cut into 4x4
// patches, 49 tokens + the class token) on Fashion-MNIST: AdamW (weight decay 0.05), a
// linear warm-up then cosine learning rate per step, label smoothing 0.1, and mixed
// precision (float16 autocast + GradScaler) on CUDA. Prints the test accuracy at the end
// as "test_accuracy: <value>"; --save writes the trained weights as safetensors
// (torchvision's key names, loadable with load_state_dict or run_model --model vit).
//
//   train_vit [--data-dir /usr/share/datasets/fashion-mnist] [--device cpu|cuda] [--epochs 10]
//             [--batch 128] [--lr 1e-3] [--warmup 0.05 (fraction of the steps)] [--no-amp] [--save W.safetensors]
//             [--layers 6] [--hidden 192] [--heads 6] [--mlp 768]
//             [--limit N (train samples)] [--test-limit N (test samples)]
//             [--compress-saved fp8|int8 (saved activations in 8 bits: autograd/compress.h)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "models/vit.h"
#include "nn/data/idx.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "train/checks.h"
#include "train/evaluate.h"
#include "train/progress.h"

using namespace frugal;

namespace {
const char* kUsage =
    "usage: train_vit [--data-dir DIR] [--device cpu|cuda[:N]] [--epochs N] [--batch N] [--lr X]\n"
    "                 [--warmup F (fraction of the steps, in [0, 1])] [--no-amp] [--save W.safetensors]\n"
    "                 [--layers N] [--hidden N] [--heads N] [--mlp N] [--limit N] [--test-limit N]\n"
    "                 [--compress-saved fp8|int8]\n";
}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", device_name = "cpu", save_path;
  int64_t epochs = 10, batch = 128, limit = 0, test_limit = 0;  // limits 0: every sample
  double lr = 1e-3, warmup = 0.05;
  bool amp = true;
  std::optional<autograd::CompressOptions> compress_saved;  // --compress-saved fp8|int8
  models::ViTConfig config{.image_size = 28,
                           .patch_size = 4,
                           .in_channels = 1,
                           .num_layers = 6,
                           .num_heads = 6,
                           .hidden_dim = 192,
                           .mlp_dim = 768,
                           .num_classes = 10};
  cli::parse_or_exit("train_vit", kUsage, [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--no-amp")) amp = false;
      else if (flags.is("--compress-saved")) compress_saved = examples::compress_saved_option(flags.text());
      else if (flags.is("--data-dir")) data_dir = flags.text();
      else if (flags.is("--device")) device_name = flags.device();
      else if (flags.is("--epochs")) epochs = flags.positive();
      else if (flags.is("--batch")) batch = flags.positive();
      else if (flags.is("--lr")) lr = flags.positive_real();
      else if (flags.is("--warmup")) warmup = flags.real(0, 1);
      else if (flags.is("--limit")) limit = flags.positive();
      else if (flags.is("--test-limit")) test_limit = flags.positive();
      else if (flags.is("--save")) save_path = flags.text();
      else if (flags.is("--layers")) config.num_layers = flags.positive();
      else if (flags.is("--hidden")) config.hidden_dim = flags.positive();
      else if (flags.is("--heads")) config.num_heads = flags.positive();
      else if (flags.is("--mlp")) config.mlp_dim = flags.positive();
      else flags.unknown();
    }
  });
  try {
    if (!save_path.empty()) train::require_writable(save_path, "--save");  // now, not after training
    const Device device(device_name);
    amp = amp && device.is_cuda();  // autocast here is CUDA float16
    manual_seed(0);
    data::FashionMnist ds = data::load_fashion_mnist(data_dir);
    examples::require_nonempty(ds, data_dir);
    examples::standardize(ds);
    Tensor train_x = ds.train_images, train_y = ds.train_labels;
    Tensor test_x = ds.test_images, test_y = ds.test_labels;
    if (limit > 0) {
      limit = std::min(limit, train_x.size(0));
      train_x = train_x.narrow(0, 0, limit), train_y = train_y.narrow(0, 0, limit);
    }
    if (test_limit > 0) {
      test_limit = std::min(test_limit, test_x.size(0));
      test_x = test_x.narrow(0, 0, test_limit), test_y = test_y.narrow(0, 0, test_limit);
    }
    data::TensorDataset train(train_x, train_y);
    data::DataLoader loader(train, {.batch_size = batch, .shuffle = true, .drop_last = true, .device = device});

    auto net = std::make_shared<models::VisionTransformer>(config);
    net->to(device);
    optim::AdamW opt(net->parameters(), {.lr = lr, .weight_decay = 0.05});
    const int64_t total = epochs * train::require_batches(loader, train.size());
    const int64_t warmup_steps = std::min<int64_t>(int64_t(warmup * double(total)), total - 1);
    optim::WarmupCosineLR schedule(opt, {.warmup_steps = warmup_steps, .total_steps = total, .start_factor = 0.01});
    optim::GradScaler scaler({.enabled = amp});
    std::printf(
        "train_vit: ViT %lld layers, hidden %lld, %lld heads, mlp %lld (%lld parameters), %lld samples, "
        "%lld steps (%lld warm-up), %s%s%s%s\n",
        (long long)config.num_layers, (long long)config.hidden_dim, (long long)config.num_heads,
        (long long)config.mlp_dim, (long long)net->num_parameters(), (long long)train_x.size(0), (long long)total,
        (long long)warmup_steps, device_name.c_str(), amp ? ", amp float16" : "",
        compress_saved ? ", saved tensors in " : "", compress_saved ? autograd::to_string(compress_saved->format) : "");

    examples::AmpRun run{.device = device,
                         .amp = amp,
                         .report_every = std::max<int64_t>(1, std::min<int64_t>(50, total / 10)),
                         .compress_saved = compress_saved};
    train::Progress progress(
        {.epochs = epochs, .unit = "img", .log_every = examples::progress_log_every(loader.size(), run.report_every)});
    data::TensorDataset test(test_x, test_y);
    data::DataLoader test_loader(test, {.batch_size = 500, .device = device});
    const auto loss_fn = [](const Tensor& logits, const Tensor& targets) {
      return cross_entropy(logits, targets, {.label_smoothing = 0.1});
    };
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      examples::train_amp_epoch(*net, loss_fn, opt, scaler, schedule, loader, epoch, run, progress);
      if (epoch + 1 < epochs) {
        const double acc = train::evaluate(*net, test_loader).accuracy;
        std::printf("epoch %lld: test accuracy %.4f\n", (long long)epoch + 1, acc);
      }
    }
    const double acc = train::evaluate(*net, test_loader).accuracy;
    std::printf("train: %.1f s\ntest_accuracy: %.4f\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start).count(), acc);
    if (!save_path.empty()) {
      const nn::NamedTensors state = net->state_dict();
      train::require_finite(state, save_path);
      nn::save_safetensors(save_path, state, {{"format", "pt"}});
      std::printf("saved %s\n", save_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_vit: %s\n", e.what());
    return 1;
  }
}
