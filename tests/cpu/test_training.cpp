// End to end on the CPU: the example's MLP learns Fashion-MNIST (or a synthetic
// stand-in when the dataset is not installed), and the checks of train/checks.h stop a
// diverged run and refuse empty data (the checkpoints' resume: test_train_checkpoints.cpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "autograd/ops/all.h"
#include "examples/mnist_train.h"
#include "nn/data/idx.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/test_util.h"
#include "train/checks.h"
#include "train/evaluate.h"
#include "train/progress.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
const char* kDataDir = "/usr/share/datasets/fashion-mnist";

// n images (n, 1, 28, 28) and labels: the first n of Fashion-MNIST when installed,
// else 10 noisy class prototypes (learnable, but not trivially).
std::pair<Tensor, Tensor> images(int64_t n, int64_t offset, bool test_split) {
  if (std::filesystem::exists(std::string(kDataDir) + "/train-images-idx3-ubyte.gz")) {
    static const data::FashionMnist ds = data::load_fashion_mnist(kDataDir);
    const Tensor& x = test_split ? ds.test_images : ds.train_images;
    const Tensor& y = test_split ? ds.test_labels : ds.train_labels;
    return {x.narrow(0, offset, n).contiguous(), y.narrow(0, offset, n).contiguous()};
  }
  const std::vector<double> protos = random_values(10 * 784, 77, 0.0, 1.0);
  const std::vector<double> noise = random_values(n * 784, 1000 + uint64_t(offset) + (test_split ? 7 : 0), -0.6, 0.6);
  std::vector<double> x(static_cast<size_t>(n * 784));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[i] = (i * 7 + offset) % 10;
    for (int64_t k = 0; k < 784; ++k) x[i * 784 + k] = protos[y[i] * 784 + k] + noise[i * 784 + k];
  }
  return {from_vector(x, {n, 1, 28, 28}, kFloat32), from_vector(y, {n})};
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The accuracy of `model` on (x, y), through train::evaluate.
double accuracy(nn::UnaryModule& model, const Tensor& x, const Tensor& y) {
  data::TensorDataset ds(x, y);
  data::DataLoader loader(ds, {.batch_size = 1000});
  return train::evaluate(model, loader).accuracy;
}

}  // namespace

TEST_CASE("training: the MLP's loss falls and it classifies held-out images") {
  manual_seed(0);
  auto [x, y] = images(4096, 0, false);
  auto [tx, ty] = images(1000, 0, true);
  auto model = examples::make_model("mlp");
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  data::TensorDataset ds(x, y);
  data::DataLoader loader(ds, {.batch_size = 64, .shuffle = true, .seed = 1});
  const double before = accuracy(*model, tx, ty);
  std::vector<double> losses;
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    losses.push_back(examples::train_epoch(*model, opt, loader).mean_loss);
  }
  const double after = accuracy(*model, tx, ty);
  CHECK(losses[1] < losses[0]);
  CHECK(losses[1] < 0.8);
  CHECK(before < 0.3);
  CHECK(after > 0.75);  // 2 epochs on 4096 images: Fashion-MNIST MLPs reach ~0.8
  MESSAGE("mean loss per epoch ", losses[0], " -> ", losses[1], ", accuracy ", before, " -> ", after);
}

TEST_CASE("training: a diverging run stops at the first non-finite loss, naming epoch, step, loss and lr") {
  auto [x, y] = images(512, 0, false);
  data::TensorDataset ds(x, y);
  const double lr = 1e38;  // the reported run: --lr 1e38

  // The reference: the same run by hand, reading every loss, up to the first inf or NaN.
  manual_seed(4);
  auto by_hand = examples::make_model("mlp");
  optim::Adam opt_a(by_hand->parameters(), {.lr = lr});
  data::DataLoader loader_a(ds, {.batch_size = 64, .shuffle = true, .seed = 2});
  loader_a.set_epoch(2);
  int64_t first_bad = 0;
  double bad_loss = 0;
  int64_t step = 0;
  for (data::Batch& b : loader_a) {
    Tensor loss = cross_entropy(by_hand->forward(b.inputs), b.targets);
    opt_a.zero_grad();
    loss.backward();
    opt_a.step();
    ++step;
    if (!std::isfinite(loss.item<double>())) {
      first_bad = step, bad_loss = loss.item<double>();
      break;
    }
  }
  REQUIRE(first_bad > 0);  // lr 1e38 overflows the weights within an epoch

  manual_seed(4);
  auto model = examples::make_model("mlp");
  optim::Adam opt(model->parameters(), {.lr = lr});
  data::DataLoader loader(ds, {.batch_size = 64, .shuffle = true, .seed = 2});
  loader.set_epoch(2);
  std::FILE* log = std::tmpfile();  // one progress line per step, as in a log file
  REQUIRE(log != nullptr);
  train::Progress progress({.out = log, .terminal = false, .log_every = 1});
  progress.start_epoch(2, loader.size());
  check_error([&] { examples::train_epoch(*model, opt, loader, &progress, 1); },
              {"training diverged at epoch 3, step " + std::to_string(first_bad) + ":",
               std::string("the loss is ") + (std::isnan(bad_loss) ? "nan"
                                              : bad_loss > 0       ? "inf"
                                                                   : "-inf"),
               "the base learning rate is 1e+38", "try a lower learning rate"});
  std::rewind(log);
  int64_t progress_lines = 0;
  for (int c; (c = std::fgetc(log)) != EOF;) progress_lines += c == '\n';
  std::fclose(log);
  CHECK(progress_lines == first_bad - 1);  // no progress line shows the bad loss
}

TEST_CASE("training: LossWatch sums each window of losses and checks every one of them") {
  Tensor w = zeros({1});
  optim::SGD opt({w}, {.lr = 0.25});
  train::LossWatch watch(opt);
  const std::vector<double> losses = {2.5, 1.25, 0.75, 1e30, 3.0};
  for (int i = 0; i < 3; ++i) watch.add(from_vector<double>({losses[i]}, {}), 1, i + 1);
  CHECK(watch.pending() == 3);
  CHECK(watch.check().sum == 2.5 + 1.25 + 0.75);
  CHECK(watch.pending() == 0);
  watch.add(from_vector<float>({1e30f}, {}), 1, 4);  // large but finite
  watch.add(from_vector<double>({losses[4]}, {}), 1, 5);
  CHECK(watch.check().sum == doctest::Approx(double(1e30f) + 3.0));
  CHECK(watch.check().sum == 0.0);  // an empty window

  check_error([&] { watch.add(from_vector<float>({INFINITY}, {}), 2, 6); },
              {"training diverged at epoch 2, step 6: the loss is inf", "the base learning rate is 0.25"});
  train::LossWatch no_epochs(opt);
  check_error([&] { no_epochs.add(from_vector<double>({NAN}, {}), 0, 9); },
              {"training diverged at step 9: the loss is nan"});

  // A schedule that has decayed the lr to 0 by then: the hint names the lr --lr set.
  optim::CosineAnnealingLR schedule(opt, {.T_max = 1});
  schedule.step();
  REQUIRE(opt.param_groups()[0].lr < 1e-12);
  check_error([&] { no_epochs.add(from_vector<double>({NAN}, {}), 0, 10); }, {"the base learning rate is 0.25"});

  // Two finite float64 losses whose sum overflows: said so, not "a loss was not finite".
  train::LossWatch huge(opt);
  huge.add(from_vector<double>({1e308}, {}), 1, 11);
  huge.add(from_vector<double>({1e308}, {}), 1, 12);
  check_error([&] { (void)huge.check(); }, {"steps 11-12", "each finite, summed past the largest double"});
}

TEST_CASE("training: under an enabled GradScaler non-finite losses are skipped steps, until the scale collapses") {
  // Every gradient is inf, so every step is skipped and the scale halves: 8, 4, 2, 1, 0.5.
  // The run counts as diverged at the step that takes it below kMinLossScale = 1: step 4.
  Tensor w = from_vector<float>({1.0f, 2.0f}, {2}).requires_grad_();
  const Tensor x = from_vector<float>({INFINITY, 1.0f}, {2});
  const std::vector<double> before = values_of(w);
  optim::SGD opt({w}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 8.0});
  train::LossWatch watch(opt, &scaler);
  int64_t steps_taken = 0;
  check_error(
      [&] {
        for (int64_t step = 1; step <= 10; ++step) {
          Tensor loss = sum(w * x);  // inf
          opt.zero_grad();
          scaler.scale(loss).backward();
          scaler.step(opt);
          scaler.update();
          watch.add(loss, 1, step);
          steps_taken = step;
        }
      },
      {"training diverged at epoch 1, step 4", "GradScaler", "scale fell to 0.5"});
  CHECK(steps_taken == 3);
  CHECK(scaler.get_scale() == 0.5);
  CHECK(values_of(w) == before);  // every step was skipped
}

TEST_CASE("training: under an enabled GradScaler a window's inf/NaN losses are counted apart from its mean") {
  // A skipped step's inf loss (or a NaN loss over a batch whose targets are all ignored)
  // would make the window's mean inf/NaN and hide what the other steps did.
  Tensor w = zeros({1});
  optim::SGD opt({w}, {.lr = 0.25});
  optim::GradScaler scaler({.init_scale = 1024.0});
  train::LossWatch watch(opt, &scaler);
  const std::vector<float> losses = {2.0f, INFINITY, 4.0f, NAN, -INFINITY, 0.5f};
  for (size_t i = 0; i < losses.size(); ++i) watch.add(from_vector<float>({losses[i]}, {}), 1, int64_t(i) + 1);
  const train::LossSum window = watch.check();
  CHECK(window.sum == 6.5);
  CHECK(window.count == 3);
  CHECK(window.nonfinite == 3);
  CHECK(window.mean() == doctest::Approx(6.5 / 3));
  for (float v : {INFINITY, NAN}) watch.add(from_vector<float>({v}, {}), 1, 7);
  const train::LossSum skipped = watch.check();
  CHECK(skipped.count == 0);
  CHECK(skipped.nonfinite == 2);
  CHECK(std::isnan(skipped.mean()));  // no step trained: no mean to show
  // Without a scaler the same inf stops the run (the previous test case's rule).
  train::LossWatch plain(opt);
  plain.add(from_vector<float>({2.0f}, {}), 1, 1);
  const train::LossSum one = plain.check();
  CHECK(one.sum == 2.0);
  CHECK(one.count == 1);
  CHECK(one.nonfinite == 0);
}

TEST_CASE("training: a GradScaler started below 1 with finite losses is not divergence; its first backoff is") {
  // init_scale 0.25 < kMinLossScale: finite steps leave the scale there and LossWatch quiet;
  // an inf gradient halves it to 0.125, below where the run chose to start.
  Tensor w = from_vector<float>({1.0f, 2.0f}, {2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 0.25});
  train::LossWatch watch(opt, &scaler);
  auto step = [&](const Tensor& x, int64_t i) {
    Tensor loss = sum(w * x);
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    watch.add(loss, 1, i);
  };
  const Tensor finite = from_vector<float>({0.5f, 1.0f}, {2});
  for (int64_t i = 1; i <= 3; ++i) step(finite, i);
  // w = (1, 2), then each SGD step subtracts 0.1 x = (0.05, 0.1): losses 2.5, 2.375, 2.25.
  CHECK(watch.check().sum == doctest::Approx(2.5 + 2.375 + 2.25).epsilon(1e-6));
  CHECK(scaler.get_scale() == 0.25);
  check_error(
      [&] {
        step(from_vector<float>({INFINITY, 1.0f}, {2}), 4);
      },
      {"training diverged at epoch 1, step 4", "scale fell to 0.125", "below 0.25"});
}

TEST_CASE("training: empty training and test sets are errors, not 0 samples and accuracy nan") {
  auto model = examples::make_model("mlp");
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  const Tensor no_images = zeros({0, 1, 28, 28}), no_labels = zeros({0}, {kInt64});
  data::TensorDataset empty(no_images, no_labels);
  data::DataLoader empty_loader(empty, {.batch_size = 64});
  check_error([&] { train::evaluate(*model, empty_loader); }, {"evaluate: the loader yielded no batch"});
  check_error([&] { examples::train_epoch(*model, opt, empty_loader); }, {"train_epoch", "no batch"});
  check_error([&] { train::require_batches(empty_loader, empty.size()); },
              {"the training set yields no batch: 0 samples, batch size 64"});

  auto [x, y] = images(100, 0, false);
  data::TensorDataset small(x, y);
  data::DataLoader dropping(small, {.batch_size = 128, .drop_last = true});
  check_error([&] { train::require_batches(dropping, small.size()); },
              {"100 samples, batch size 128 (a last partial batch is dropped)"});
  data::DataLoader keeping(small, {.batch_size = 128});
  CHECK(train::require_batches(keeping, small.size()) == 1);

  data::FashionMnist ds{x, y, no_images, no_labels};
  check_error([&] { examples::require_nonempty(ds, "/some/dir"); },
              {"/some/dir: the training set has 100 images and the test set 0"});
  ds = {no_images, no_labels, x, y};
  check_error([&] { examples::require_nonempty(ds, "/some/dir"); }, {"the training set has 0 images"});
}

TEST_CASE("training: require_writable finds an unwritable --save path before training, and touches nothing") {
  namespace fs = std::filesystem;
  const fs::path dir = temp_path("frugal_save_dir", "");
  fs::create_directories(dir);
  const std::string target = (dir / "model.safetensors").string();

  train::require_writable(target, "--save");  // a new file in a writable directory
  CHECK(fs::is_empty(dir));                   // nothing created
  std::ofstream(target) << "old";
  train::require_writable(target, "--save");  // replacing a file
  CHECK(bytes_of(target) == "old");           // nothing changed

  check_error([&] { train::require_writable((dir / "missing" / "m.safetensors").string(), "--save"); },
              {"--save: cannot write", "directory '" + (dir / "missing").string() + "' does not exist"});
  check_error([&] { train::require_writable(dir.string(), "--save"); }, {"--save: '", "' is a directory"});
  check_error([&] { train::require_writable(target + "/m.safetensors", "--save"); },
              {"directory '" + target + "' is not a directory"});
  check_error([&] { train::require_writable("", "--save"); }, {"--save: the path is empty"});
  if (::geteuid() != 0) {  // root writes anywhere, so this part means something only for other users
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
    check_error([&] { train::require_writable(target, "--save"); }, {"is not writable"});
    fs::permissions(dir, fs::perms::owner_all);
  }
  fs::remove_all(dir);
}
