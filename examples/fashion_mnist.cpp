// Trains a classifier on Fashion-MNIST: the GPU if there is one (a CNN, 10 epochs),
// else the CPU (an MLP, 1 epoch), with Adam and a cosine learning-rate schedule.
// Prints a progress line, the test accuracy and the memory summary, saves a checkpoint
// after every epoch into --checkpoint-dir (the last 2 are kept), the newest intact one of
// which --resume continues, and logs each epoch's loss and accuracy to
// <checkpoint-dir>/metrics.jsonl (a resumed run first drops the rows past its checkpoint).
//
//   build/examples/fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size N] [--lr X]
//       [--device cpu|cuda[:N]] [--seed N] [--checkpoint-dir DIR] [--resume] [--data-dir DIR]
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
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops/loss.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "memory/allocator.h"
#include "nn/data/idx.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "tensor/random.h"
#include "train/checkpoints.h"
#include "train/checks.h"
#include "train/evaluate.h"
#include "train/metrics_log.h"
#include "train/progress.h"

using namespace frugal;

namespace {

struct Args {
  std::string model, device, checkpoint_dir = "fashion_mnist_checkpoints";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::optional<int64_t> epochs;  // default: 10 for the cnn, 1 for the mlp
  std::optional<int64_t> steps;   // a timing run of this many steps
  int64_t batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
  bool resume = false;
};

const char* kUsage =
    "usage: fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size N] [--lr X]\n"
    "       [--device cpu|cuda[:N]] [--seed N] [--checkpoint-dir DIR] [--resume] [--data-dir DIR]\n"
    "       [--steps N]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model")) a.model = flags.choice({"mlp", "cnn"});
    else if (flags.is("--epochs")) a.epochs = flags.positive();
    else if (flags.is("--batch-size")) a.batch_size = flags.positive();
    else if (flags.is("--lr")) a.lr = flags.positive_real();
    else if (flags.is("--device")) a.device = flags.device();
    else if (flags.is("--seed")) a.seed = flags.seed();
    else if (flags.is("--checkpoint-dir")) a.checkpoint_dir = flags.text();
    else if (flags.is("--resume")) a.resume = true;
    else if (flags.is("--data-dir")) a.data_dir = flags.text();
    else if (flags.is("--steps")) a.steps = flags.positive();
    else flags.unknown();
  }
  return a;
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
  Args args = cli::parse_or_exit("fashion_mnist", kUsage, [&] { return parse(argc, argv); });
  std::optional<train::Progress> progress;  // ended before an error is printed
  try {
    const Device device = args.device.empty() ? (cuda_device_count() > 0 ? cuda() : kCPU) : Device(args.device);
    if (args.model.empty()) args.model = device.is_cuda() ? "cnn" : "mlp";
    const int64_t epochs = args.epochs.value_or(args.model == "cnn" ? 10 : 1);
    std::error_code ec;
    // --resume reads the directory: a mistyped one is an error, not a new empty directory.
    FRUGAL_CHECK(!args.resume || std::filesystem::is_directory(args.checkpoint_dir, ec), "--resume: --checkpoint-dir '",
                 args.checkpoint_dir, "' does not exist");
    std::filesystem::create_directories(args.checkpoint_dir, ec);
    FRUGAL_CHECK(!ec, "--checkpoint-dir: cannot create '", args.checkpoint_dir, "' (", ec.message(), ")");
    train::CheckpointManager checkpoints(args.checkpoint_dir, {.keep_last = 2});
    train::require_writable(checkpoints.path_for(0), "--checkpoint-dir");  // now, not after the first epoch
    // A checkpoint for --resume to continue, found before the dataset is read.
    FRUGAL_CHECK(!args.resume || checkpoints.latest(), "--resume: no checkpoint in ", args.checkpoint_dir);
    manual_seed(args.seed);

    data::FashionMnist ds = data::load_fashion_mnist(args.data_dir);
    examples::require_nonempty(ds, args.data_dir);
    examples::standardize(ds);
    auto model = examples::make_model(args.model);
    model->to(device);
    optim::Adam opt(model->parameters(), {.lr = args.lr});
    optim::CosineAnnealingLR schedule(opt, {.T_max = epochs});  // per epoch
    data::TensorDataset train_set(ds.train_images, ds.train_labels);
    data::DataLoader loader(train_set,
                            {.batch_size = args.batch_size, .shuffle = true, .seed = args.seed, .device = device});
    train::require_batches(loader, train_set.size());
    const train::TrainState state{.model = model.get(), .optimizer = &opt, .scheduler = &schedule, .loader = &loader};
    int64_t first_epoch = 0;
    if (args.resume) {
      // The newest intact checkpoint: a damaged newer one (a run killed as the disk filled) is
      // skipped with a warning and renamed aside; one of another model is an error.
      const train::ResumeResult resumed = checkpoints.resume(state, {.expect_metadata = {{"model", args.model}}});
      first_epoch = *resumed.step;  // the epochs finished
      FRUGAL_CHECK(first_epoch <= epochs, "--resume ", resumed.path, ": the checkpoint has finished ", first_epoch,
                   " epochs, more than --epochs ", epochs);
      std::printf("resumed %s after epoch %lld\n", resumed.path.c_str(), (long long)first_epoch);
    }
    std::printf("fashion_mnist: %s with %lld parameters on %s, %lld epochs, batch %lld, Adam lr %g, cosine decay\n",
                args.model.c_str(), (long long)model->num_parameters(), device.str().c_str(), (long long)epochs,
                (long long)args.batch_size, args.lr);

    if (args.steps) {
      std::printf("step_ms: %.3f\n", median_step_ms(*model, opt, loader, *args.steps));
      return 0;
    }
    const auto test = examples::test_loader(ds, device);
    // A resumed run drops the rows of the epochs it trains again (logged after its checkpoint).
    train::MetricsLog metrics(args.checkpoint_dir + "/metrics.jsonl",
                              {.append = args.resume, .truncate_after = {{"epoch", first_epoch}}});
    const int64_t report_every = 50;  // steps between progress updates
    progress.emplace(train::ProgressOptions{.epochs = epochs,
                                            .log_every = examples::progress_log_every(loader.size(), report_every)});
    for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
      loader.set_epoch(epoch);
      progress->start_epoch(epoch, loader.size());
      const examples::EpochStats stats = examples::train_epoch(*model, opt, loader, &*progress, report_every);
      progress->end_epoch(stats.mean_loss);
      schedule.step();
      const std::string path = checkpoints.save(epoch + 1, state, {{"model", args.model}});
      const train::EvalResult eval = train::evaluate(*model, *test);
      metrics.write({{"epoch", epoch + 1},
                     {"train_loss", stats.mean_loss},
                     {"test_loss", eval.loss},
                     {"test_accuracy", eval.accuracy},
                     {"seconds", stats.seconds},
                     {"checkpoint", path}});
    }
    progress.reset();
    const double accuracy = train::evaluate(*model, *test).accuracy;
    std::printf("%s", memory::memory_summary(device).c_str());
    if (const auto last = checkpoints.latest()) std::printf("checkpoint: %s\n", last->path.c_str());
    std::printf("test_accuracy: %.4f\n", accuracy);
    return 0;
  } catch (const std::exception& e) {
    progress.reset();  // ends a half-drawn line
    std::fflush(stdout);
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
