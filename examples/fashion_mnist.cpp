// Trains a classifier on Fashion-MNIST: the GPU if there is one (a CNN, 10 epochs),
// else the CPU (an MLP, 1 epoch), with Adam and a cosine learning-rate schedule.
// Prints a progress line, the test accuracy and the memory summary, and saves a
// safetensors checkpoint that --resume continues.
//
//   build/examples/fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size N] [--lr X]
//       [--device cpu|cuda[:N]] [--seed N] [--resume PATH] [--save PATH] [--data-dir DIR]
//       [--steps N]
//
// --steps N is a timing run: N training steps (the loader's epochs repeat as needed), no
// schedule, evaluation or checkpoint; it prints `step_ms: X`, the median time of one step
// (next batch, forward, loss, backward, Adam step), which tools/cpu_vs_torch.py compares
// with PyTorch's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops/loss.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "examples/train_checks.h"
#include "memory/allocator.h"
#include "nn/data/idx.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "tensor/random.h"

using namespace frugal;

namespace {

struct Args {
  std::string model, device, resume, save = "fashion_mnist.safetensors";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::optional<int64_t> epochs;  // default: 10 for the cnn, 1 for the mlp
  std::optional<int64_t> steps;   // a timing run of this many steps
  int64_t batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
};

const char* kUsage =
    "usage: fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size N] [--lr X]\n"
    "       [--device cpu|cuda[:N]] [--seed N] [--resume PATH] [--save PATH] [--data-dir DIR]\n"
    "       [--steps N]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model")) a.model = flags.text();
    else if (flags.is("--epochs")) a.epochs = flags.positive();
    else if (flags.is("--batch-size")) a.batch_size = flags.positive();
    else if (flags.is("--lr")) a.lr = flags.positive_real();
    else if (flags.is("--device")) a.device = flags.text();
    else if (flags.is("--seed")) a.seed = flags.seed();
    else if (flags.is("--resume")) a.resume = flags.text();
    else if (flags.is("--save")) a.save = flags.text();
    else if (flags.is("--data-dir")) a.data_dir = flags.text();
    else if (flags.is("--steps")) a.steps = flags.positive();
    else flags.unknown();
  }
  return a;
}

std::string clock(double secs) {
  char buf[32];
  const int s = int(secs + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

/// The median over `steps` training steps of one step's milliseconds, the loader's epochs
/// repeating as needed. The loss is read once at the end (each step's ops run synchronously
/// on the CPU; a CUDA step is timed as the host queues it, so time CUDA with bench/train_step).
double median_step_ms(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader, int64_t steps) {
  std::vector<double> ms;
  data::Batch batch;
  Tensor loss;
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    if (!loader.next(batch)) FRUGAL_CHECK(loader.next(batch), "fashion_mnist: the loader yields no batch");
    loss = cross_entropy(model.forward(batch.inputs), batch.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  const double last = loss.to(kCPU).item<double>();
  FRUGAL_CHECK(std::isfinite(last), "fashion_mnist: the loss after ", steps, " steps is ", last);
  std::printf("final_loss: %.4f\n", last);
  std::nth_element(ms.begin(), ms.begin() + ptrdiff_t(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool mid_line = false;  // a progress line without its newline is on stdout
  Args args = cli::parse_or_exit("fashion_mnist", kUsage, [&] { return parse(argc, argv); });
  try {
    const Device device = args.device.empty() ? (cuda_device_count() > 0 ? cuda() : kCPU) : Device(args.device);
    if (args.model.empty()) args.model = device.is_cuda() ? "cnn" : "mlp";
    const int64_t epochs = args.epochs.value_or(args.model == "cnn" ? 10 : 1);
    examples::require_writable(args.save, "--save");  // now, not after the first epoch
    manual_seed(args.seed);

    data::FashionMnist ds = data::load_fashion_mnist(args.data_dir);
    examples::require_nonempty(ds, args.data_dir);
    examples::standardize(ds);
    auto model = examples::make_model(args.model);
    model->to(device);
    optim::Adam opt(model->parameters(), {.lr = args.lr});
    int64_t first_epoch = 0;
    if (!args.resume.empty()) {
      first_epoch = examples::load_checkpoint(args.resume, *model, opt, args.model);
      FRUGAL_CHECK(first_epoch <= epochs, "--resume ", args.resume, ": the checkpoint has finished ", first_epoch,
                   " epochs, more than --epochs ", epochs);
      std::printf("resumed %s after epoch %lld\n", args.resume.c_str(), (long long)first_epoch);
    }
    // Per-epoch cosine decay; its position follows from the epoch, so resuming needs no extra state.
    optim::CosineAnnealingLR schedule(opt, {.T_max = epochs});
    for (int64_t e = 0; e < first_epoch; ++e) schedule.step();
    std::printf("fashion_mnist: %s with %lld parameters on %s, %lld epochs, batch %lld, Adam lr %g, cosine decay\n",
                args.model.c_str(), (long long)model->num_parameters(), device.str().c_str(), (long long)epochs,
                (long long)args.batch_size, args.lr);

    data::TensorDataset train(ds.train_images, ds.train_labels);
    data::DataLoader loader(train,
                            {.batch_size = args.batch_size, .shuffle = true, .seed = args.seed, .device = device});
    examples::require_batches(loader, train.size());
    if (args.steps) {
      std::printf("step_ms: %.3f\n", median_step_ms(*model, opt, loader, *args.steps));
      return 0;
    }
    for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
      loader.set_epoch(epoch);
      auto progress = [&](int64_t step, int64_t steps, double loss, double rate) {
        const double eta = double(steps - step) * double(args.batch_size) / rate;
        std::printf("\repoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s   ", (long long)epoch + 1,
                    (long long)epochs, (long long)step, (long long)steps, loss, rate, clock(eta).c_str());
        std::fflush(stdout);
        mid_line = true;
      };
      const examples::EpochStats stats = examples::train_epoch(*model, opt, loader, progress);
      std::printf("\repoch %lld/%lld  mean loss %.4f  %.0f samples/s  %s%20s\n", (long long)epoch + 1,
                  (long long)epochs, stats.mean_loss, double(stats.samples) / stats.seconds,
                  clock(stats.seconds).c_str(), "");
      mid_line = false;
      schedule.step();
      examples::save_checkpoint(args.save, *model, opt, epoch + 1, args.model);
    }
    const double accuracy = examples::evaluate(*model, ds.test_images, ds.test_labels);
    std::printf("%s", memory::memory_summary(device).c_str());
    std::printf("checkpoint: %s\n", args.save.c_str());
    std::printf("test_accuracy: %.4f\n", accuracy);
    return 0;
  } catch (const Error& e) {
    if (mid_line) std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
