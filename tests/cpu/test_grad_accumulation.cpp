// Gradient accumulation: k micro-batches, each loss divided by k, give the update of
// one batch k times larger; it works under GradScaler; and it peaks at the
// micro-batch's activation memory, not the big batch's.
#include <doctest/doctest.h>

#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
std::shared_ptr<nn::Sequential> mlp(int64_t width, int layers) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(32, width));
  for (int i = 0; i < layers; ++i) {
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Linear>(width, width));
  }
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(width, 10));
  return m;
}

std::vector<double> weights(const nn::Module& m) {
  std::vector<double> all;
  for (const Tensor& p : m.parameters()) {
    const std::vector<double> v = values_of(p);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

struct Data {
  Tensor x, y;
};
Data batch(int64_t n) {
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 3) % 10;
  return {random_tensor({n, 32}, kFloat32, 11), from_vector(labels)};
}

// One optimizer step over `data`, split into `micro` equal micro-batches.
void accumulated_step(nn::Sequential& model, optim::Optimizer& opt, const Data& data, int64_t micro,
                      optim::GradScaler* scaler = nullptr) {
  const int64_t n = data.x.size(0), m = n / micro;
  opt.zero_grad();
  for (int64_t k = 0; k < micro; ++k) {
    Tensor loss = cross_entropy(model.forward(data.x.narrow(0, k * m, m)), data.y.narrow(0, k * m, m));
    loss = loss / double(micro);  // mean over the big batch = average of the micro means
    (scaler ? scaler->scale(loss) : loss).backward();
  }
  if (scaler) {
    scaler->step(opt);
    scaler->update();
  } else {
    opt.step();
  }
}
}  // namespace

TEST_CASE("grad accumulation: 4 micro-batches give the update of one 4x batch") {
  const Data data = batch(64);
  manual_seed(1);
  auto big = mlp(64, 2);
  manual_seed(1);
  auto small = mlp(64, 2);
  REQUIRE(weights(*big) == weights(*small));
  optim::SGD opt_big(big->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt_small(small->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    accumulated_step(*big, opt_big, data, 1);
    accumulated_step(*small, opt_small, data, 4);
  }
  check_close(weights(*small), weights(*big), 1e-6, 1e-7, "weights after 3 accumulated steps");

  // Under GradScaler (no overflow at this scale), the same.
  manual_seed(1);
  auto scaled = mlp(64, 2);
  optim::SGD opt_scaled(scaled->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler({.init_scale = 1024.0});
  for (int step = 0; step < 3; ++step) accumulated_step(*scaled, opt_scaled, data, 4, &scaler);
  check_close(weights(*scaled), weights(*big), 1e-6, 1e-7, "weights with GradScaler");
}

TEST_CASE("grad accumulation: peak memory follows the micro-batch") {
  // Wide layers and a large batch, so activations dominate what a step allocates.
  const Data data = batch(1024);
  auto peak_of_step = [&](int64_t micro) {
    manual_seed(2);
    auto model = mlp(512, 6);
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    accumulated_step(*model, opt, data, micro);  // warm-up: gradients now exist
    opt.zero_grad(false);                        // and are kept, as in a training loop
    const int64_t before = memory::stats(kCPU).allocated_bytes.current;
    memory::reset_peak(kCPU);
    const int64_t n = data.x.size(0), m = n / micro;
    for (int64_t k = 0; k < micro; ++k)
      (cross_entropy(model->forward(data.x.narrow(0, k * m, m)), data.y.narrow(0, k * m, m)) / double(micro))
          .backward();
    return memory::stats(kCPU).allocated_bytes.peak - before;
  };
  const int64_t full = peak_of_step(1), quarter = peak_of_step(4);
  MESSAGE("peak above the resting state: batch 1024 ", memory::format_bytes(full), ", 4 x 256 ",
          memory::format_bytes(quarter), " (ratio ", double(quarter) / double(full), ")");
  CHECK(double(quarter) <= 0.4 * double(full));
}
