// train::evaluate (train/evaluate.h) against a loop written out by hand in double
// precision; the modes of every module are restored, and no graph is recorded.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tests/test_util.h"
#include "train/evaluate.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
// Records whether its forward ran with grad on, and in which mode.
struct Probe : nn::UnaryModule {
  bool saw_grad = true, saw_training = true;
  Tensor forward(const Tensor& x) override {
    saw_grad = autograd::is_grad_enabled(), saw_training = is_training();
    return x;
  }
};
}  // namespace

TEST_CASE("evaluate: accuracy and mean cross-entropy equal a double-precision loop; modes are restored") {
  const int64_t n = 23, c = 3;  // batches of 5: the last one is short
  const std::vector<double> x = random_values(n * 4, 21);
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = (i * 5) % c;
  data::TensorDataset ds(from_vector(x, {n, 4}, kFloat32), from_vector(y, {n}));
  data::DataLoader loader(ds, {.batch_size = 5});

  auto probe = std::make_shared<Probe>();
  auto dropout = std::make_shared<nn::Dropout>(0.5);
  auto linear = std::make_shared<nn::Linear>(4, c);
  nn::Sequential model({probe, dropout, linear});
  dropout->eval();  // a part frozen in eval stays so
  const train::EvalResult r = train::evaluate(model, loader);

  // The reference: logits = x W^T + b in double, then log-softmax and argmax per row.
  const std::vector<double> w = values_of(linear->weight), b = values_of(linear->bias);
  double loss = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> z(c);
    for (int64_t j = 0; j < c; ++j) {
      z[j] = b[j];
      for (int64_t k = 0; k < 4; ++k) z[j] += double(float(x[i * 4 + k])) * w[j * 4 + k];
    }
    const int64_t best = std::max_element(z.begin(), z.end()) - z.begin();
    double m = *std::max_element(z.begin(), z.end()), s = 0;
    for (double v : z) s += std::exp(v - m);
    loss += m + std::log(s) - z[y[i]];
    correct += best == y[i];
  }
  CHECK(r.samples == n);
  CHECK(r.loss == doctest::Approx(loss / double(n)).epsilon(1e-5));
  CHECK(r.accuracy == double(correct) / double(n));
  CHECK(!probe->saw_grad);
  CHECK(!probe->saw_training);
  CHECK(model.is_training());
  CHECK(probe->is_training());
  CHECK(!dropout->is_training());
  CHECK(autograd::is_grad_enabled());

  // A custom loss and no accuracy (outputs that are not class scores).
  const train::EvalResult mse = train::evaluate(
      *probe, loader,
      {.loss_fn = [](const Tensor& out, const Tensor&) { return ops::mean(ops::mul(out, out)); }, .accuracy = false});
  double sq = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < 4; ++k) sq += double(float(x[i * 4 + k])) * double(float(x[i * 4 + k])) / 4.0;
  CHECK(mse.loss == doctest::Approx(sq / double(n)).epsilon(1e-5));
  CHECK(std::isnan(mse.accuracy));
  data::TensorDataset pairs(from_vector(x, {n, 4}, kFloat32), from_vector(x, {n, 2, 2}, kFloat32));
  data::DataLoader pair_loader(pairs, {.batch_size = 5});
  const auto mse_fn = [](const Tensor& out, const Tensor& t) {
    return ops::mean(ops::mul(out, ops::sub(out, t.flatten(1))));
  };
  check_error([&] { train::evaluate(*probe, pair_loader, {.loss_fn = mse_fn}); },
              {"evaluate: accuracy needs outputs (B, C) and targets (B)", "got outputs [5, 4] and targets [5, 2, 2]"});
}
