// End to end on the CPU: the example's MLP learns Fashion-MNIST (or a synthetic
// stand-in when the dataset is not installed), and a run interrupted by a
// checkpoint resumes to bit-identical weights.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>

#include "examples/mnist_train.h"
#include "nn/data/idx.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "tests/test_util.h"

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

std::vector<double> weights_of(const nn::Module& m) {
  std::vector<double> all;
  for (const Tensor& p : m.parameters()) {
    const std::vector<double> v = values_of(p);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// What save_checkpoint writes, with the metadata given instead of its own.
void write_checkpoint_with(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                           const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model.state_dict()) tensors.emplace_back("model." + name, t);
  for (auto& [name, t] : opt.state_dict()) tensors.emplace_back("optim." + name, t);
  nn::save_safetensors(path, tensors, metadata);
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
  const double before = examples::evaluate(*model, tx, ty);
  std::vector<double> losses;
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    losses.push_back(examples::train_epoch(*model, opt, loader).mean_loss);
  }
  const double after = examples::evaluate(*model, tx, ty);
  CHECK(losses[1] < losses[0]);
  CHECK(losses[1] < 0.8);
  CHECK(before < 0.3);
  CHECK(after > 0.75);  // 2 epochs on 4096 images: Fashion-MNIST MLPs reach ~0.8
  MESSAGE("mean loss per epoch ", losses[0], " -> ", losses[1], ", accuracy ", before, " -> ", after);
}

TEST_CASE("training: 1 epoch + checkpoint + resume + 1 epoch == 2 epochs, bit for bit") {
  auto [x, y] = images(1024, 0, false);
  data::TensorDataset ds(x, y);
  const std::string path = temp_path("frugal_resume_test");

  manual_seed(3);
  auto straight = examples::make_model("mlp");
  optim::Adam opt_a(straight->parameters(), {.lr = 1e-3});
  data::DataLoader loader_a(ds, {.batch_size = 128, .shuffle = true, .seed = 5});
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader_a.set_epoch(epoch);
    examples::train_epoch(*straight, opt_a, loader_a);
  }

  manual_seed(3);
  auto first = examples::make_model("mlp");
  optim::Adam opt_b(first->parameters(), {.lr = 1e-3});
  data::DataLoader loader_b(ds, {.batch_size = 128, .shuffle = true, .seed = 5});
  loader_b.set_epoch(0);
  examples::train_epoch(*first, opt_b, loader_b);
  examples::save_checkpoint(path, *first, opt_b, 1, "mlp");

  manual_seed(99);  // a different initialisation, overwritten by the checkpoint
  auto resumed = examples::make_model("mlp");
  optim::Adam opt_c(resumed->parameters(), {.lr = 1e-3});
  CHECK(examples::load_checkpoint(path, *resumed, opt_c, "mlp") == 1);
  data::DataLoader loader_c(ds, {.batch_size = 128, .shuffle = true, .seed = 5});
  loader_c.set_epoch(1);
  examples::train_epoch(*resumed, opt_c, loader_c);

  CHECK(weights_of(*resumed) == weights_of(*straight));
  check_error([&] { examples::load_checkpoint(path, *resumed, opt_c, "cnn"); }, {"load_checkpoint", "'mlp'"});
  std::remove(path.c_str());
}

TEST_CASE("training: load_checkpoint reads 'epoch' strictly and names the file and the key") {
  const std::string path = temp_path("frugal_bad_epoch");
  manual_seed(6);
  auto model = examples::make_model("mlp");
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  manual_seed(7);
  auto other = examples::make_model("mlp");
  optim::Adam other_opt(other->parameters(), {.lr = 1e-3});
  const std::vector<double> other_weights = weights_of(*other);
  // std::stoll threw std::invalid_argument / std::out_of_range on the first and third, read "1x" as 1.
  for (const char* bad : {"abc", "1x", "99999999999999999999", "-1", "", " 1"}) {
    write_checkpoint_with(path, *model, opt, {{"epoch", bad}, {"model", "mlp"}});
    check_error([&] { examples::load_checkpoint(path, *other, other_opt, "mlp"); },
                {"load_checkpoint: " + path + ": metadata 'epoch' must be a non-negative integer",
                 "got \"" + std::string(bad) + "\""});
    CHECK(weights_of(*other) == other_weights);  // checked before anything was loaded
  }
  write_checkpoint_with(path, *model, opt, {{"epoch", "12"}, {"model", "mlp"}});
  CHECK(examples::load_checkpoint(path, *other, other_opt, "mlp") == 12);
  CHECK(weights_of(*other) == weights_of(*model));
  std::remove(path.c_str());
}
