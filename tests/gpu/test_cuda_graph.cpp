// CudaGraph (tensor/cuda_graph.h, Note [CUDA graphs]): a training step of a small MLP -
// forward, backward, SGD with momentum, zero_grad - captured once and replayed on new
// batches gives bitwise the weights and losses of the same steps run eagerly, in float32,
// under bfloat16 autocast and with dropout (each replay draws new masks, the eager step's);
// with GradScaler, forward and backward are captured and the step follows each replay, the
// scale changing between replays; with GradScaler and SGD the whole step is captured too
// (unscale, the step skipped on the device on inf, the scale's update on the device), equal
// to eager steps through overflows and growths; what a replay would get wrong refuses at
// capture.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "core/stream.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/cuda_graph.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/fill.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr int64_t kBatch = 32, kIn = 64, kHidden = 128, kOut = 16;

struct Mlp {
  Tensor w1, w2;
  Mlp() {
    w1 = make_tensor(random_values(kIn * kHidden, 11, -0.2, 0.2), {kIn, kHidden}, {kFloat32, cuda()}).requires_grad_();
    w2 =
        make_tensor(random_values(kHidden * kOut, 12, -0.2, 0.2), {kHidden, kOut}, {kFloat32, cuda()}).requires_grad_();
  }
  Tensor loss(const Tensor& x, const Tensor& y, bool bf16, double dropout_p = 0.0) const {
    AutocastGuard autocast(cuda(), kBFloat16, bf16);
    return mse_loss(matmul(dropout(relu(matmul(x, w1)), dropout_p, /*training=*/true), w2), y);
  }
};

Tensor batch(const Shape& shape, uint64_t seed) {
  return make_tensor(random_values(numel_of(shape), seed), shape, {kFloat32, cuda()});
}

/// Batches for the whole-step tests: batch 3 holds an inf, so its step overflows.
void overflow_batches(int steps, uint64_t seed, std::vector<Tensor>& xs, std::vector<Tensor>& ys) {
  for (int s = 0; s < steps; ++s)
    xs.push_back(batch({kBatch, kIn}, seed + s)), ys.push_back(batch({kBatch, kOut}, seed + 100 + s));
  ops::fill_(xs[3].narrow(0, 0, 1), INFINITY);
}

/// One whole float16 step: forward under autocast, scaled backward, the scaler's step and update.
void scaled_step(const Mlp& m, optim::Optimizer& opt, optim::GradScaler& scaler, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss;
  {
    AutocastGuard autocast(cuda(), kFloat16);
    loss = mse_loss(matmul(relu(matmul(x, m.w1)), m.w2), y);
  }
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
}

}  // namespace

TEST_CASE("cuda graph: a captured MLP step replayed on new batches equals eager steps bitwise") {
  struct Case {
    bool bf16;
    double dropout_p;
  };
  for (const Case c : {Case{false, 0.0}, Case{true, 0.0}, Case{false, 0.25}}) {
    const bool bf16 = c.bf16;
    CAPTURE(bf16);
    CAPTURE(c.dropout_p);
    manual_seed(7);  // the eager run and the graph's replays draw the same dropout counters
    const int steps = 5;
    std::vector<Tensor> xs, ys;
    for (int s = 0; s < steps; ++s)
      xs.push_back(batch({kBatch, kIn}, 100 + s)), ys.push_back(batch({kBatch, kOut}, 200 + s));

    // Eager: two steps on batch 0 (what the capture's warm-up runs), then one per batch.
    Mlp eager;
    optim::SGD eager_opt({eager.w1, eager.w2}, {.lr = 0.05, .momentum = 0.9});
    std::vector<double> eager_losses;
    auto eager_step = [&](int s) {
      Tensor loss = eager.loss(xs[size_t(s)], ys[size_t(s)], bf16, c.dropout_p);
      loss.backward();
      eager_opt.step();
      eager_opt.zero_grad();
      return loss;
    };
    eager_step(0), eager_step(0);
    for (int s = 1; s < steps; ++s) eager_losses.push_back(eager_step(s).to(kFloat64).item<double>());

    Mlp graphed;
    optim::SGD opt({graphed.w1, graphed.w2}, {.lr = 0.05, .momentum = 0.9});
    manual_seed(7);
    const Tensor static_x = xs[0].clone(), static_y = ys[0].clone();
    Tensor static_loss;
    CudaGraph graph;
    graph.capture([&] {
      static_loss = graphed.loss(static_x, static_y, bf16, c.dropout_p);
      static_loss.backward();
      opt.step();
      opt.zero_grad();
    });
    CHECK(graph.captured());
    CHECK(graph.nodes() > 4);
    for (int s = 1; s < steps; ++s) {
      CAPTURE(s);
      static_x.copy_(xs[size_t(s)]);
      static_y.copy_(ys[size_t(s)]);
      graph.replay();
      CHECK(static_loss.to(kFloat64).item<double>() == eager_losses[size_t(s - 1)]);
    }
    CHECK(values_of(graphed.w1) == values_of(eager.w1));
    CHECK(values_of(graphed.w2) == values_of(eager.w2));
  }
}

TEST_CASE("cuda graph: float16 forward and backward captured with GradScaler; step and update after each replay") {
  const int steps = 5;
  std::vector<Tensor> xs, ys;
  for (int s = 0; s < steps; ++s)
    xs.push_back(batch({kBatch, kIn}, 400 + s)), ys.push_back(batch({kBatch, kOut}, 500 + s));
  auto scaled_backward = [](const Mlp& m, optim::SGD& opt, optim::GradScaler& scaler, const Tensor& x,
                            const Tensor& y) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(cuda(), kFloat16);
      loss = mse_loss(matmul(relu(matmul(x, m.w1)), m.w2), y);
    }
    scaler.scale(loss).backward();
  };
  // The scale changes between steps (as a backoff would): the replays must follow it.
  const double scales[] = {1024.0, 1024.0, 256.0, 256.0, 4096.0};

  Mlp eager;
  optim::SGD eager_opt({eager.w1, eager.w2}, {.lr = 0.05, .momentum = 0.9});
  optim::GradScaler eager_scaler({.init_scale = 1024.0});
  for (int s = 0; s < steps; ++s) {
    scaled_backward(eager, eager_opt, eager_scaler, xs[size_t(s)], ys[size_t(s)]);
    eager_scaler.step(eager_opt);
    eager_scaler.update(scales[(s + 1) % steps]);
  }

  Mlp graphed;
  optim::SGD opt({graphed.w1, graphed.w2}, {.lr = 0.05, .momentum = 0.9});
  optim::GradScaler scaler({.init_scale = 1024.0});
  const Tensor static_x = xs[0].clone(), static_y = ys[0].clone();
  scaled_backward(graphed, opt, scaler, static_x, static_y);  // step 0, eager: momentum, the device scale
  scaler.step(opt);
  scaler.update(scales[1]);
  CudaGraph graph;
  graph.capture([&] { scaled_backward(graphed, opt, scaler, static_x, static_y); }, {.warmup = 0});
  for (int s = 1; s < steps; ++s) {
    CAPTURE(s);
    static_x.copy_(xs[size_t(s)]);
    static_y.copy_(ys[size_t(s)]);
    graph.replay();
    scaler.step(opt);
    scaler.update(scales[(s + 1) % steps]);
  }
  CHECK(values_of(graphed.w1) == values_of(eager.w1));
  CHECK(values_of(graphed.w2) == values_of(eager.w2));
}

TEST_CASE("cuda graph: the whole float16 step with GradScaler and SGD captured equals eager steps") {
  // Note [GradScaler in a CUDA graph]. growth_interval 2 makes the scale grow within the
  // replays; batch 3's inf input overflows, so that replay's step is skipped on the device and
  // the scale backs off. Every replay must give the eager step's weights, scale and tracker.
  const int steps = 8;
  std::vector<Tensor> xs, ys;
  overflow_batches(steps, 700, xs, ys);
  const optim::GradScalerOptions scaling{.init_scale = 1024.0, .growth_interval = 2};
  const auto& full_step = scaled_step;

  Mlp eager;
  optim::SGD eager_opt({eager.w1, eager.w2}, {.lr = 0.05, .momentum = 0.9});
  optim::GradScaler eager_scaler(scaling);
  std::vector<double> eager_scales;
  std::vector<int64_t> eager_trackers;
  std::vector<std::vector<double>> eager_w2;
  full_step(eager, eager_opt, eager_scaler, xs[0], ys[0]);  // what the graphed run does eagerly first
  for (int s = 1; s < steps; ++s) {
    full_step(eager, eager_opt, eager_scaler, xs[size_t(s)], ys[size_t(s)]);
    eager_scales.push_back(eager_scaler.get_scale());
    eager_trackers.push_back(eager_scaler.get_growth_tracker());
    eager_w2.push_back(values_of(eager.w2));
  }
  CHECK(eager_scales[2] < eager_scales[1]);  // batch 3 backed the scale off
  CHECK(eager_scales[1] > 1024.0);           // and it grew before

  Mlp graphed;
  optim::SGD opt({graphed.w1, graphed.w2}, {.lr = 0.05, .momentum = 0.9});
  optim::GradScaler scaler(scaling);
  const Tensor static_x = xs[0].clone(), static_y = ys[0].clone();
  full_step(graphed, opt, scaler, static_x, static_y);  // eager: momentum buffers, the device scale
  CudaGraph graph;
  graph.capture([&] { full_step(graphed, opt, scaler, static_x, static_y); }, {.warmup = 0});
  for (int s = 1; s < steps; ++s) {
    CAPTURE(s);
    static_x.copy_(xs[size_t(s)]);
    static_y.copy_(ys[size_t(s)]);
    graph.replay();
    CHECK(scaler.get_scale() == eager_scales[size_t(s - 1)]);
    CHECK(scaler.get_growth_tracker() == eager_trackers[size_t(s - 1)]);
    CHECK(values_of(graphed.w2) == eager_w2[size_t(s - 1)]);
  }
  CHECK(values_of(graphed.w1) == values_of(eager.w1));
  // After the replays an eager step continues from the device's scale, as the eager run does.
  full_step(graphed, opt, scaler, xs[1], ys[1]);
  full_step(eager, eager_opt, eager_scaler, xs[1], ys[1]);
  CHECK(scaler.get_scale() == eager_scaler.get_scale());
  CHECK(values_of(graphed.w2) == values_of(eager.w2));
  for (const auto& [key, value] : scaler.state_dict())
    if (key == "scale" || key == "_growth_tracker")
      CHECK(value.item<double>() ==
            (key == "scale" ? eager_scaler.get_scale() : double(eager_scaler.get_growth_tracker())));
}

TEST_CASE("cuda graph: the whole float16 step with GradScaler and a capturable AdamW captured equals eager steps") {
  // Note [Capturable Adam]: the bias corrections come from device step counts that every
  // replay raises, unless its step was skipped (batch 3 overflows). Replays must give the
  // eager capturable steps' weights, scale and step counts bit for bit; eager capturable steps
  // stay within float rounding of the host-corrected AdamW.
  const int steps = 8;
  std::vector<Tensor> xs, ys;
  overflow_batches(steps, 720, xs, ys);
  const optim::GradScalerOptions scaling{.init_scale = 1024.0, .growth_interval = 2};
  const auto& full_step = scaled_step;
  const optim::AdamWOptions options{.lr = 1e-3, .weight_decay = 0.01, .capturable = true};

  Mlp eager, host;
  optim::AdamW eager_opt({eager.w1, eager.w2}, options);
  optim::AdamW host_opt({host.w1, host.w2}, {.lr = 1e-3, .weight_decay = 0.01});
  optim::GradScaler eager_scaler(scaling), host_scaler(scaling);
  std::vector<std::vector<double>> eager_w2;
  std::vector<double> eager_scales;
  for (int s = 0; s < steps; ++s) {
    full_step(eager, eager_opt, eager_scaler, xs[size_t(s)], ys[size_t(s)]);
    full_step(host, host_opt, host_scaler, xs[size_t(s)], ys[size_t(s)]);
    eager_w2.push_back(values_of(eager.w2));
    eager_scales.push_back(eager_scaler.get_scale());
  }
  check_close(eager.w2, values_of(host.w2), 1e-6, 1e-5, "capturable AdamW against the host's corrections");
  CHECK(eager_opt.state(eager.w2)->step == steps - 1);  // batch 3's step was skipped
  CHECK(host_opt.state(host.w2)->step == steps - 1);

  Mlp graphed;
  optim::AdamW opt({graphed.w1, graphed.w2}, options);
  optim::GradScaler scaler(scaling);
  const Tensor static_x = xs[0].clone(), static_y = ys[0].clone();
  full_step(graphed, opt, scaler, static_x, static_y);  // eager: the moments and device counts
  CudaGraph graph;
  graph.capture([&] { full_step(graphed, opt, scaler, static_x, static_y); }, {.warmup = 0});
  for (int s = 1; s < steps; ++s) {
    CAPTURE(s);
    static_x.copy_(xs[size_t(s)]);
    static_y.copy_(ys[size_t(s)]);
    graph.replay();
    CHECK(scaler.get_scale() == eager_scales[size_t(s)]);
    CHECK(values_of(graphed.w2) == eager_w2[size_t(s)]);
  }
  CHECK(values_of(graphed.w1) == values_of(eager.w1));
  CHECK(opt.state(graphed.w1)->step == steps - 1);
  for (const auto& [key, value] : opt.state_dict())
    if (key.find(".step") != std::string::npos) CHECK(value.item<int64_t>() == steps - 1);
  // An eager step after the replays goes on from the device's counts, as the eager run does.
  full_step(graphed, opt, scaler, xs[1], ys[1]);
  full_step(eager, eager_opt, eager_scaler, xs[1], ys[1]);
  CHECK(values_of(graphed.w2) == values_of(eager.w2));
  CHECK(opt.state(graphed.w2)->step == steps);
}

TEST_CASE("SGD.step_skipping_if: a skipped first step leaves no momentum buffer; the next first step sets it") {
  // A first step sets the buffer to the gradient. Skipped on the device flag alone it would
  // leave an unset buffer marked as set, and the next step would add garbage to it.
  Mlp skipped, plain;
  optim::SGD opt({skipped.w1, skipped.w2}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.5});
  optim::SGD plain_opt({plain.w1, plain.w2}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.5});
  const Tensor found_inf = full({}, 1.0, {kFloat32, cuda()});
  const Tensor x = batch({kBatch, kIn}, 901), y = batch({kBatch, kOut}, 902);
  skipped.loss(x, y, false).backward();
  const std::vector<double> w2_before = values_of(skipped.w2);
  opt.step_skipping_if(found_inf);
  CHECK(values_of(skipped.w2) == w2_before);
  CHECK((opt.state(skipped.w2) == nullptr || !opt.state(skipped.w2)->buffers[0].defined()));
  ops::fill_(found_inf, 0.0);
  for (int s = 0; s < 2; ++s) {  // the first step (buffer = gradient, no dampening), then an update
    opt.step_skipping_if(found_inf);
    plain.loss(x, y, false).backward();
    plain_opt.step();
    plain_opt.zero_grad();
    CHECK(values_of(skipped.w2) == values_of(plain.w2));
    opt.zero_grad();
    skipped.loss(x, y, false).backward();
  }
}

TEST_CASE("cuda graph: a replay whose labels are out of range raises at the next synchronize") {
  Mlp mlp;
  const Tensor x = batch({kBatch, kIn}, 600);
  const Tensor labels = zeros({kBatch}, TensorOptions(kInt64, cuda()));
  Tensor static_loss;
  CudaGraph graph;
  graph.capture([&] { static_loss = cross_entropy(matmul(relu(matmul(x, mlp.w1)), mlp.w2), labels); }, {.warmup = 1});
  graph.replay();
  synchronize(cuda());                   // in range: nothing to raise
  ops::fill_(labels, double(kOut + 3));  // (Note [Index checks in a CUDA graph])
  graph.replay();
  CHECK_THROWS_WITH_AS(synchronize(cuda()), doctest::Contains("is out of range"), Error);
  synchronize(cuda());  // raised once, then gone
}

TEST_CASE("cuda graph: what a replay would get wrong refuses at capture; a changed lr refuses at replay") {
  Mlp mlp;
  optim::SGD opt({mlp.w1, mlp.w2}, {.lr = 0.05, .momentum = 0.9});
  const Tensor x = batch({kBatch, kIn}, 300), y = batch({kBatch, kOut}, 301);
  auto step = [&] {
    mlp.loss(x, y, false).backward();
    opt.step();
    opt.zero_grad();
  };
  auto refused = [&](const std::function<void()>& fn, const std::string& says) {
    CudaGraph graph;
    try {
      graph.capture(fn, {.warmup = 0});
      FAIL("the capture should throw");
    } catch (const Error& e) { CHECK(std::string(e.what()).find(says) != std::string::npos); }
    CHECK_FALSE(graph.captured());
  };
  step();  // the momentum buffers exist: SGD may be captured
  Generator own(5);
  refused([&] { (void)ops::dropout(x, 0.1, &own); }, "Philox offset");
  refused([&] { synchronize(cuda()); }, "synchronize");
  refused([&] { (void)mlp.loss(x, y, false).item<float>(); }, "to the host");
  optim::GradScaler scaler;
  refused([&] { (void)scaler.scale(mlp.loss(x, y, false)); }, "made outside a capture");  // no warm-up
  (void)scaler.scale(mlp.loss(x, y, false));  // now it has its device copy; unscale_ and step still refuse
  optim::AdamW adamw({mlp.w1, mlp.w2}, {.lr = 1e-3});
  mlp.loss(x, y, false).backward();
  refused([&] { scaler.step(adamw); }, "AdamW cannot skip its step on the device");
  optim::AdamW capturable({mlp.w1, mlp.w2}, {.lr = 1e-3, .capturable = true});
  refused([&] { capturable.step(); }, "first step");  // no warm-up: it would make the moments
  opt.zero_grad();

  CudaGraph graph;  // after those failures a capture still works
  CHECK_THROWS_WITH_AS(graph.replay(), doctest::Contains("nothing captured"), Error);
  graph.capture(step, {.warmup = 1});
  graph.replay();
  opt.param_groups()[0].lr = 0.01;
  CHECK_THROWS_WITH_AS(graph.replay(), doctest::Contains("learning rate"), Error);
  opt.param_groups()[0].lr = 0.05;
  graph.replay();
  synchronize(cuda());
}
