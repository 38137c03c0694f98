// GradScaler's fused CUDA unscale (optim/fused_unscale.cu) against the CPU loop (itself
// checked against a naive reference in tests/cpu/test_grad_scaler.cpp) on the same
// values: 50 gradients of varied sizes (odd, multi-chunk, > 1M elements) in float32,
// float16, bfloat16 and float64, mixed dtypes and a strided gradient in one optimizer, one
// launch per (device, dtype), inf/NaN detection in one element of one of 50 gradients (the
// step skipped bit for bit) and scaled training on the GPU against the CPU.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/multi_tensor.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/test_util.h"
#include "train/checks.h"

using namespace frugal;
using namespace frugal::testing;
using optim::Adam;
using optim::AdamW;
using optim::GradScaler;
using optim::SGD;
using optim::detail::fused_launch_count;

namespace {

using Values = std::vector<double>;

/// 50 shapes: tiny, odd (not multiples of 4), chunk-boundary and > 1M-element tensors.
std::vector<Shape> fifty_shapes() {
  std::vector<Shape> s = {{1},          {3},         {5},        {7, 3},  {16},    {1023},    {1024},
                          {4099},       {17, 129},   {256, 257}, {16384}, {16385}, {3, 5461}, {(1 << 20) + 3},
                          {1100, 1000}, {2, 3, 4, 5}};
  for (int64_t k = 0; s.size() < 50; ++k) s.push_back({1 + 37 * k % 2000, 1 + k % 7});
  return s;
}

/// The same parameters and gradients on the CPU and on the GPU; dtypes[k % dtypes.size()]
/// for parameter k. Gradient values in [-500, 500) (inside float16's range).
struct Twins {
  std::vector<Tensor> cpu, gpu;
  Twins(const std::vector<Shape>& shapes, const std::vector<DType>& dtypes, uint64_t seed) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      const DType dt = dtypes[k % dtypes.size()];
      const Values v = random_values(numel_of(shapes[k]), seed + k);
      cpu.push_back(make_tensor(v, shapes[k], dt).requires_grad_());
      gpu.push_back(make_tensor(v, shapes[k], {dt, cuda()}).requires_grad_());
    }
  }
  /// Sets gradient k of both to random values; element `at` of gradient `bad_param` to `bad`.
  void set_grads(uint64_t seed, int64_t bad_param = -1, int64_t at = 0, double bad = 0.0,
                 Layout strided_layout = Layout::Contiguous) {
    for (size_t k = 0; k < cpu.size(); ++k) {
      Values g = random_values(cpu[k].numel(), seed * 1000 + k, -500, 500);
      if (int64_t(k) == bad_param) g[size_t(at)] = bad;
      const Layout layout = k == 8 ? strided_layout : Layout::Contiguous;  // k == 8: a (17, 129) gradient
      cpu[k].set_grad(make_tensor(g, cpu[k].sizes(), cpu[k].dtype(), layout));
      gpu[k].set_grad(make_tensor(g, gpu[k].sizes(), {gpu[k].dtype(), cuda()}, layout));
    }
  }
};

/// Every gradient of the GPU twins equals the CPU one exactly: both compute T(M(g) * inv)
/// with one rounding (see Note [Fused unscale]).
void check_grads_equal(const Twins& t) {
  for (size_t k = 0; k < t.cpu.size(); ++k)
    check_close(t.gpu[k].grad(), values_of(t.cpu[k].grad()), 0, 0,
                "grad " + std::to_string(k) + " " + dtype_name(t.cpu[k].dtype()));
}

}  // namespace

TEST_CASE("GradScaler CUDA: fused unscale matches the CPU on 50 gradients, one launch per dtype") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    CAPTURE(dtype_name(dt));
    Twins t(fifty_shapes(), {dt}, 11);
    SGD cpu_opt({{.params = {t.cpu.begin(), t.cpu.begin() + 20}}, {.params = {t.cpu.begin() + 20, t.cpu.end()}}},
                {.lr = 0.1});
    SGD gpu_opt({{.params = {t.gpu.begin(), t.gpu.begin() + 20}}, {.params = {t.gpu.begin() + 20, t.gpu.end()}}},
                {.lr = 0.1});
    GradScaler cpu_scaler({.init_scale = 1000.0}), gpu_scaler({.init_scale = 1000.0});  // 1/1000 rounds
    for (int it = 0; it < 2; ++it) {
      t.set_grads(it + 1);
      cpu_scaler.unscale_(cpu_opt);
      const int64_t before = fused_launch_count();
      gpu_scaler.unscale_(gpu_opt);
      CHECK(fused_launch_count() - before == 1);  // both groups, 50 gradients: one kernel
      check_grads_equal(t);
      cpu_scaler.step(cpu_opt);
      gpu_scaler.step(gpu_opt);
      cpu_scaler.update();
      gpu_scaler.update();
      CHECK(gpu_scaler.get_growth_tracker() == it + 1);
    }
    const double rtol = dt == kFloat32 ? 1e-5 : dt == kFloat64 ? 1e-12 : 2 * default_rtol(dt);
    for (size_t k = 0; k < t.cpu.size(); ++k) check_close(t.gpu[k], values_of(t.cpu[k]), rtol, 1e-6, "param");
  }
}

TEST_CASE("GradScaler CUDA: mixed dtypes and a strided gradient in one optimizer") {
  Twins t(fifty_shapes(), {kFloat32, kFloat16, kBFloat16}, 21);
  SGD cpu_opt(t.cpu, {.lr = 0.1}), gpu_opt(t.gpu, {.lr = 0.1});
  t.set_grads(3, -1, 0, 0.0, Layout::Transposed);
  const Tensor strided = t.gpu[8].grad();
  REQUIRE(!strided.is_contiguous());
  GradScaler cpu_scaler({.init_scale = 3.0}), gpu_scaler({.init_scale = 3.0});
  cpu_scaler.unscale_(cpu_opt);
  const int64_t before = fused_launch_count();
  gpu_scaler.unscale_(gpu_opt);
  CHECK(fused_launch_count() - before == 3);  // one per dtype
  check_grads_equal(t);
  CHECK(t.gpu[8].grad().shares_storage(strided));
  // A multiply by 1 only checks: the gradients stay as they are.
  GradScaler one({.init_scale = 1.0});
  gpu_scaler.update(1.0);
  const Values g0 = values_of(t.gpu[0].grad());
  one.unscale_(gpu_opt);
  CHECK(values_of(t.gpu[0].grad()) == g0);
}

TEST_CASE("GradScaler CUDA: inf or NaN in one element of one of 50 gradients skips the step") {
  struct Case {
    DType dt;
    int64_t param, at;  // which gradient and element
    double bad;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {{kFloat32, 37, 11, inf},
                        {kFloat32, 13, (1 << 20) + 2, -inf},   // the last element of the 1M gradient (scalar tail)
                        {kFloat16, 14, 700001, std::nan("")},  // the middle of a multi-chunk gradient
                        {kBFloat16, 0, 0, inf},
                        {kFloat64, 49, 0, std::nan("")}};
  for (const Case& c : cases) {
    CAPTURE(dtype_name(c.dt));
    CAPTURE(c.param);
    Twins t(fifty_shapes(), {c.dt}, 31);
    Adam cpu_opt(t.cpu, {.lr = 1e-2}), gpu_opt(t.gpu, {.lr = 1e-2});
    GradScaler cpu_scaler, gpu_scaler;
    t.set_grads(1);  // a clean step first, so Adam has state
    cpu_scaler.step(cpu_opt);
    gpu_scaler.step(gpu_opt);
    cpu_scaler.update();
    gpu_scaler.update();
    std::vector<Values> before;
    for (const Tensor& p : t.gpu) before.push_back(values_of(p));
    const Values exp_avg = values_of(gpu_opt.state(t.gpu[5])->buffers[0]);

    t.set_grads(2, c.param, c.at, c.bad);
    cpu_scaler.unscale_(cpu_opt);
    gpu_scaler.unscale_(gpu_opt);
    check_grads_equal(t);  // every gradient is still unscaled, as PyTorch does
    cpu_scaler.step(cpu_opt);
    gpu_scaler.step(gpu_opt);
    for (size_t k = 0; k < t.gpu.size(); ++k) CHECK(values_of(t.gpu[k]) == before[k]);
    CHECK(gpu_opt.state(t.gpu[5])->step == 1);
    CHECK(values_of(gpu_opt.state(t.gpu[5])->buffers[0]) == exp_avg);
    cpu_scaler.update();
    gpu_scaler.update();
    CHECK(gpu_scaler.get_scale() == 32768.0);
    CHECK(cpu_scaler.get_scale() == 32768.0);
    CHECK(gpu_scaler.get_growth_tracker() == 0);
  }
}

TEST_CASE("GradScaler CUDA: scaled training on the GPU matches the CPU") {
  auto param = [](uint64_t seed, const Shape& s, Device d) {
    return make_tensor(random_values(numel_of(s), seed), s, {kFloat32, d}).requires_grad_();
  };
  struct Model {
    Tensor w, b, x, y;
    Tensor loss() const {
      const Tensor d = sub(add(matmul(x, w), b), y);
      return mean(mul(d, d));
    }
  };
  auto make = [&](Device d) {
    return Model{param(1, {16, 8}, d), param(2, {8}, d),
                 make_tensor(random_values(32 * 16, 3), {32, 16}, {kFloat32, d}),
                 make_tensor(random_values(32 * 8, 4), {32, 8}, {kFloat32, d})};
  };
  Model cm = make(kCPU), gm = make(cuda());
  AdamW copt({cm.w, cm.b}, {.lr = 1e-2}), gopt({gm.w, gm.b}, {.lr = 1e-2});
  GradScaler cs({.growth_interval = 2}), gs({.growth_interval = 2});
  for (int it = 0; it < 6; ++it) {
    copt.zero_grad();
    gopt.zero_grad();
    cs.scale(cm.loss()).backward();
    gs.scale(gm.loss()).backward();
    cs.step(copt);
    gs.step(gopt);
    cs.update();
    gs.update();
    CHECK(gs.get_scale() == cs.get_scale());
  }
  CHECK(gs.get_scale() == 65536.0 * 8);  // grew every second step
  check_close(gm.w, values_of(cm.w), 1e-5, 1e-6, "w");
  check_close(gm.b, values_of(cm.b), 1e-5, 1e-6, "b");
}

TEST_CASE("GradScaler CUDA: SGD and a capturable AdamW step and update without a host sync, as the CPU's synced ones") {
  // Note [GradScaler host state]: these optimizers skip on the device flag, so step() and
  // update() never read it on the host; the CPU twin reads it. An overflow at iteration 3
  // (an inf input) must skip that step and back off in both; growth every second clean step.
  struct Model {
    Tensor w, b, x, y;
    Tensor loss() const {
      const Tensor d = sub(add(matmul(x, w), b), y);
      return mean(mul(d, d));
    }
  };
  auto make = [](Device d) {
    auto param = [&](uint64_t seed, const Shape& s) {
      return make_tensor(random_values(numel_of(s), seed), s, {kFloat32, d}).requires_grad_();
    };
    return Model{param(1, {16, 8}), param(2, {8}), make_tensor(random_values(32 * 16, 3), {32, 16}, {kFloat32, d}),
                 make_tensor(random_values(32 * 8, 4), {32, 8}, {kFloat32, d})};
  };
  for (const bool adamw : {false, true}) {
    CAPTURE(adamw);
    Model cm = make(kCPU), gm = make(cuda());
    std::unique_ptr<optim::Optimizer> copt, gopt;
    if (adamw) {
      copt = std::make_unique<AdamW>(std::vector<Tensor>{cm.w, cm.b}, optim::AdamWOptions{.lr = 1e-2});
      gopt =
          std::make_unique<AdamW>(std::vector<Tensor>{gm.w, gm.b}, optim::AdamWOptions{.lr = 1e-2, .capturable = true});
    } else {
      copt = std::make_unique<SGD>(std::vector<Tensor>{cm.w, cm.b}, optim::SGDOptions{.lr = 1e-2, .momentum = 0.9});
      gopt = std::make_unique<SGD>(std::vector<Tensor>{gm.w, gm.b}, optim::SGDOptions{.lr = 1e-2, .momentum = 0.9});
    }
    GradScaler cs({.growth_interval = 2}), gs({.growth_interval = 2});
    const double inf = std::numeric_limits<double>::infinity();
    double expected_scale = 65536.0;
    int clean = 0;
    for (int it = 0; it < 7; ++it) {
      CAPTURE(it);
      const bool overflow = it == 3;
      Model cs_model = cm, gs_model = gm;
      if (overflow) {
        Values x = values_of(cm.x);
        x[5] = inf;
        cs_model.x = make_tensor(x, cm.x.sizes(), kFloat32);
        gs_model.x = make_tensor(x, cm.x.sizes(), {kFloat32, cuda()});
      }
      const Values w_before = values_of(gm.w);
      copt->zero_grad();
      gopt->zero_grad();
      cs.scale(cs_model.loss()).backward();
      gs.scale(gs_model.loss()).backward();
      cs.step(*copt);
      gs.step(*gopt);
      cs.update();
      gs.update();
      if (overflow) {
        expected_scale /= 2;
        clean = 0;
        CHECK(values_of(gm.w) == w_before);  // skipped on the device
      } else if (++clean == 2) {
        expected_scale *= 2;
        clean = 0;
      }
      CHECK(gs.get_scale() == expected_scale);
      CHECK(cs.get_scale() == expected_scale);
      CHECK(gs.get_growth_tracker() == cs.get_growth_tracker());
      check_close(gm.w, values_of(cm.w), 1e-5, 1e-6, "w");
      check_close(gm.b, values_of(cm.b), 1e-5, 1e-6, "b");
    }
    // The device owns the scale now; its state dict and a new scale round-trip as before.
    const optim::StateDict sd = gs.state_dict();
    GradScaler fresh;
    fresh.load_state_dict(sd);
    CHECK(fresh.get_scale() == expected_scale);
    gs.update(1024.0);
    CHECK(gs.get_scale() == 1024.0);
  }
}

TEST_CASE(
    "GradScaler CUDA: once the device owns the scale, update(new_scale) keeps its tracker and CPU losses read it") {
  const Tensor w = make_tensor(random_values(64, 7), {64}, {kFloat32, cuda()}).requires_grad_();
  SGD opt({w}, {.lr = 1e-3, .momentum = 0.9});
  GradScaler s({.growth_interval = 100});
  for (int it = 0; it < 3; ++it) {
    opt.zero_grad();
    s.scale(mean(mul(w, w))).backward();
    s.step(opt);
    s.update();  // on the device after the first (momentum-making) step
  }
  CHECK(s.scale_on_device());
  s.update(512.0);  // no get_scale() in between: the tracker must come from the device
  CHECK(s.get_growth_tracker() == 3);
  CHECK(s.get_scale() == 512.0);
  const Tensor cpu_loss = full({}, 1.5, TensorOptions(kFloat32));
  CHECK(s.scale(cpu_loss).item<double>() == 768.0);
  const Tensor half_loss = full({}, 1.5, {kFloat16, cuda()});
  const Tensor scaled = s.scale(half_loss);
  CHECK(scaled.dtype() == kFloat16);  // as the host scalar's multiply
  CHECK(scaled.item<double>() == 768.0);
}

TEST_CASE("GradScaler CUDA: two SGD optimizers on one scaler take the host path and grow together") {
  const Tensor a = make_tensor(random_values(32, 8), {32}, {kFloat32, cuda()}).requires_grad_();
  const Tensor b = make_tensor(random_values(32, 9), {32}, {kFloat32, cuda()}).requires_grad_();
  SGD oa({a}, {.lr = 1e-3}), ob({b}, {.lr = 1e-3});
  GradScaler s({.growth_interval = 1});
  for (int it = 0; it < 3; ++it) {
    oa.zero_grad();
    ob.zero_grad();
    s.scale(add(mean(mul(a, a)), mean(mul(b, b)))).backward();
    s.step(oa);
    s.step(ob);
    s.update();
    CHECK(s.get_scale() == 65536.0 * double(int64_t(2) << it));
  }
}

TEST_CASE("GradScaler CUDA: a capturable AdamW's empty parameter counts its steps with the others, skipped ones not") {
  const Tensor w = make_tensor(random_values(16, 11), {16}, {kFloat32, cuda()}).requires_grad_();
  const Tensor empty_param = zeros({0, 4}, {kFloat32, cuda()}).requires_grad_();
  AdamW opt({w, empty_param}, optim::AdamWOptions{.lr = 1e-2, .capturable = true});
  GradScaler s;
  for (int it = 0; it < 5; ++it) {
    CAPTURE(it);
    Values x = random_values(16, 20 + uint64_t(it));
    if (it == 2) x[3] = std::numeric_limits<double>::infinity();  // this step is skipped on the device
    opt.zero_grad();
    s.scale(add(mean(mul(make_tensor(x, {16}, {kFloat32, cuda()}), w)), sum(empty_param))).backward();
    s.step(opt);
    s.update();
  }
  REQUIRE(opt.state(w) != nullptr);
  REQUIRE(opt.state(empty_param) != nullptr);
  CHECK(opt.state(w)->step == 4);
  CHECK(opt.state(empty_param)->step == 4);
  int64_t saved = -1;
  for (const auto& [key, value] : opt.state_dict())
    if (key == "state.1.step") saved = value.item<int64_t>();
  CHECK(saved == 4);
}

TEST_CASE("GradScaler CUDA: LossWatch sums a window's finite losses on the device and counts the rest apart") {
  Tensor w = zeros({1}, {kFloat32, cuda()});
  optim::SGD opt({w}, {.lr = 0.25});
  optim::GradScaler scaler({.init_scale = 1024.0});
  train::LossWatch watch(opt, &scaler);
  const std::vector<float> losses = {2.0f, INFINITY, 4.0f, NAN, -INFINITY, 0.5f};
  for (size_t i = 0; i < losses.size(); ++i)
    watch.add(from_vector<float>({losses[i]}, {}).to(cuda()), 1, int64_t(i) + 1);
  const train::LossSum window = watch.check();
  CHECK(window.sum == 6.5);
  CHECK(window.count == 3);
  CHECK(window.nonfinite == 3);
  // Without a scaler a window holding an inf is divergence, named at check().
  train::LossWatch plain(opt);
  plain.add(from_vector<float>({2.0f}, {}).to(cuda()), 1, 1);
  plain.add(from_vector<float>({INFINITY}, {}).to(cuda()), 1, 2);
  check_error([&] { plain.check(); }, {"training diverged at epoch 1, steps 1-2"});
}
