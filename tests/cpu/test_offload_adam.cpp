// optim/offload_adam.h: OffloadAdamW on the CPU, where host and device coincide (Note [CPU
// offload]). Its steps against a float64 reference loop and against optim::AdamW bit for bit
// (float32 parameters; float16/bfloat16 parameters through float32 master weights, against
// AdamW on float32 copies), decoupled weight decay alone, a GradScaler step skipped on inf,
// a state_dict round trip, 1 vs N threads bitwise, the pinned pool holding the state, and
// clip_grad_norm_ and an LR schedule, and bad inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "core/threads.h"
#include "memory/pinned.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/offload_adam.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::optim;

namespace {

using Values = std::vector<double>;

/// torch.optim.AdamW for one tensor in float64 (Note [Adam update], written out directly).
struct AdamWRef {
  Values p, m, v;
  int64_t t = 0;
  void step(const Values& g, double lr, double beta1, double beta2, double eps, double wd) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    const double c1 = 1 - std::pow(beta1, double(t)), c2 = 1 - std::pow(beta2, double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

const std::vector<Shape> kShapes = {{37, 53}, {1000}, {1}, {4, 5, 6}};

/// Gradient values for parameter k at step s.
Values grad_values(size_t k, int s) { return random_values(numel_of(kShapes[k]), 1000 + 17 * uint64_t(s) + k); }

}  // namespace

TEST_CASE("OffloadAdamW: float32 parameters match a float64 loop and AdamW bit for bit, in chunks") {
  const AdamWOptions a{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<Tensor> off, ref;
  std::vector<AdamWRef> exact;
  for (size_t k = 0; k < kShapes.size(); ++k) {
    const Values v = random_values(numel_of(kShapes[k]), 10 + k);
    off.push_back(param_tensor(v, kShapes[k]));
    ref.push_back(param_tensor(v, kShapes[k]));
    exact.push_back({v, {}, {}});
  }
  // Two groups (the second without decay), and chunks smaller than most parameters.
  OffloadAdamW opt({{.params = {off[0], off[1]}}, {.params = {off[2], off[3]}, .weight_decay = 0.0}},
                   {.lr = a.lr,
                    .beta1 = a.beta1,
                    .beta2 = a.beta2,
                    .eps = a.eps,
                    .weight_decay = a.weight_decay,
                    .chunk_elements = 300});
  AdamW adamw({{.params = {ref[0], ref[1]}}, {.params = {ref[2], ref[3]}, .weight_decay = 0.0}}, a);
  for (int s = 0; s < 5; ++s) {
    CAPTURE(s);
    for (size_t k = 0; k < kShapes.size(); ++k) {
      const Values g = grad_values(k, s);
      off[k].set_grad(make_tensor(g, kShapes[k], kFloat32));
      ref[k].set_grad(make_tensor(g, kShapes[k], kFloat32));
      exact[k].step(values_of(off[k].grad()), a.lr, a.beta1, a.beta2, a.eps, k < 2 ? a.weight_decay : 0.0);
    }
    opt.step();
    adamw.step();
    for (size_t k = 0; k < kShapes.size(); ++k) {
      CAPTURE(k);
      CHECK(values_of(off[k]) == values_of(ref[k]));
      CHECK(values_of(opt.state(off[k])->buffers[0]) == values_of(adamw.state(ref[k])->buffers[0]));
      CHECK(values_of(opt.state(off[k])->buffers[1]) == values_of(adamw.state(ref[k])->buffers[1]));
      check_close(values_of(off[k]), exact[k].p, 1e-5, 1e-6, "parameter vs float64");
      CHECK(opt.state(off[k])->step == s + 1);
      CHECK(!opt.state(off[k])->buffers[2].defined());  // a float32 host parameter is its own master
    }
  }
  CHECK(opt.master_param(off[0]).shares_storage(off[0]));
}

TEST_CASE("OffloadAdamW: 16-bit parameters step float32 masters, equal to AdamW on float32 copies") {
  for (const DType dt : {kFloat16, kBFloat16}) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(dtype);
    const AdamWOptions a{.lr = 1e-2, .weight_decay = 0.05};
    std::vector<Tensor> off, ref;
    std::vector<AdamWRef> exact;
    for (size_t k = 0; k < kShapes.size(); ++k) {
      const Tensor p = param_tensor(random_values(numel_of(kShapes[k]), 20 + k), kShapes[k], dt);
      off.push_back(p);
      ref.push_back(param_tensor(values_of(p), kShapes[k]));  // the same values, float32
      exact.push_back({values_of(p), {}, {}});
    }
    OffloadAdamW opt(off, {.lr = a.lr, .weight_decay = a.weight_decay, .chunk_elements = 512});
    AdamW adamw(ref, a);
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      for (size_t k = 0; k < kShapes.size(); ++k) {
        off[k].set_grad(make_tensor(grad_values(k, s), kShapes[k], dt));
        const Values g = values_of(off[k].grad());  // as rounded to 16 bits
        ref[k].set_grad(make_tensor(g, kShapes[k], kFloat32));
        exact[k].step(g, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
      }
      opt.step();
      adamw.step();
      for (size_t k = 0; k < kShapes.size(); ++k) {
        CAPTURE(k);
        const Tensor master = opt.master_param(off[k]);
        REQUIRE(master.defined());
        CHECK(master.dtype() == kFloat32);
        CHECK(values_of(master) == values_of(ref[k]));                  // the float32 master is AdamW's weight
        CHECK(values_of(off[k]) == values_of(ref[k].detach().to(dt)));  // the parameter, rounded once from it
        check_close(values_of(master), exact[k].p, 1e-5, 1e-6, "master vs float64");
      }
    }
  }
}

TEST_CASE("OffloadAdamW: decoupled weight decay alone scales by 1 - lr * wd; maximize ascends") {
  const Values v = random_values(64, 5);
  Tensor p = param_tensor(v, {64});
  OffloadAdamW opt({p}, {.lr = 0.1, .weight_decay = 0.5});
  p.set_grad(zeros({64}));  // no gradient: m = v = 0 and the Adam term is 0 / eps = 0
  opt.step();
  Values expect(v.size());
  for (size_t i = 0; i < v.size(); ++i) expect[i] = double(float(v[i]) * float(1.0 - 0.1 * 0.5));
  CHECK(values_of(p) == expect);

  // maximize: the step goes up the gradient, by lr at the first step (|m / sqrt(v)| = 1).
  Tensor q = param_tensor({1.0, -1.0}, {2});
  OffloadAdamW up({q}, {.lr = 0.25, .weight_decay = 0.0, .maximize = true});
  q.set_grad(make_tensor({3.0, -2.0}, {2}, kFloat32));
  up.step();
  check_close(values_of(q), {1.25, -1.25}, 1e-6, 1e-6, "maximize");
}

TEST_CASE("OffloadAdamW: GradScaler skips a step with an inf gradient and leaves the host state as it was") {
  // y = x W: the gradients come from backward, scaled, as in mixed-precision training.
  const Values w0 = random_values(12, 7), x0 = random_values(8, 8);
  Tensor w = param_tensor(w0, {4, 3}, kFloat16), w_ref = param_tensor(values_of(w), {4, 3});
  const Tensor x = make_tensor(x0, {2, 4}, kFloat16), x_ref = make_tensor(values_of(x), {2, 4}, kFloat32);
  OffloadAdamW opt({w}, {.lr = 1e-2});
  AdamW adamw({w_ref}, {.lr = 1e-2});
  GradScaler scaler({.init_scale = 1024.0}), scaler_ref({.init_scale = 1024.0});
  auto iteration = [&](bool poison) {
    opt.zero_grad();
    adamw.zero_grad();
    scaler.scale(sum(matmul(x, w))).backward();
    scaler_ref.scale(sum(matmul(x_ref, w_ref))).backward();
    if (poison) w.grad().data_ptr<Half>()[5] = Half(std::numeric_limits<float>::infinity());
    scaler.step(opt);
    if (!poison) scaler_ref.step(adamw);
    scaler.update();
    if (!poison) scaler_ref.update();
  };
  iteration(false);
  const Values master = values_of(opt.master_param(w)), m = values_of(opt.state(w)->buffers[0]), p = values_of(w);
  iteration(true);
  CHECK(values_of(opt.master_param(w)) == master);
  CHECK(values_of(opt.state(w)->buffers[0]) == m);
  CHECK(values_of(w) == p);
  CHECK(opt.state(w)->step == 1);
  CHECK(scaler.get_scale() == 512.0);
  scaler_ref.update(512.0);
  iteration(false);  // the next clean step goes on as if the bad one never happened
  CHECK(opt.state(w)->step == 2);
  // x W's gradient x^T 1 is exact in both float16 and float32, so the masters agree bit for bit.
  CHECK(values_of(opt.master_param(w)) == values_of(w_ref));
}

TEST_CASE("OffloadAdamW: clip_grad_norm_ and an LR schedule compose as with AdamW") {
  std::vector<Tensor> off, ref;
  for (size_t k = 0; k < 2; ++k) {
    const Values v = random_values(numel_of(kShapes[k]), 60 + k);
    off.push_back(param_tensor(v, kShapes[k]));
    ref.push_back(param_tensor(v, kShapes[k]));
  }
  OffloadAdamW opt(off, {.lr = 1e-2});
  AdamW adamw(ref, {.lr = 1e-2});
  CosineAnnealingLR schedule(opt, {.T_max = 4}), schedule_ref(adamw, {.T_max = 4});
  for (int s = 0; s < 3; ++s) {
    for (size_t k = 0; k < 2; ++k) {
      const Values g = grad_values(k, s);
      off[k].set_grad(make_tensor(g, kShapes[k], kFloat32));
      ref[k].set_grad(make_tensor(g, kShapes[k], kFloat32));
    }
    CHECK(clip_grad_norm_(off, 1.0) == clip_grad_norm_(ref, 1.0));  // the norm before clipping
    opt.step();
    adamw.step();
    schedule.step();
    schedule_ref.step();
  }
  CHECK(opt.param_groups()[0].lr == adamw.param_groups()[0].lr);
  for (size_t k = 0; k < 2; ++k) CHECK(values_of(off[k]) == values_of(ref[k]));
}

TEST_CASE("OffloadAdamW: a state_dict round trip resumes bit for bit; the state lives in the pinned pool") {
  for (const DType dt : {kFloat32, kFloat16}) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(dtype);
    const Shape shape{33, 7};
    Tensor a = param_tensor(random_values(231, 3), shape, dt);
    const int64_t pinned_before = memory::pinned_stats().allocated_bytes.current;
    OffloadAdamW first({a}, {.lr = 3e-3});
    auto grad_at = [&](int s) { return make_tensor(random_values(231, 50 + uint64_t(s)), shape, dt); };
    for (int s = 0; s < 2; ++s) {
      a.set_grad(grad_at(s));
      first.step();
    }
    const int64_t per_element = dt == kFloat32 ? 8 : 12;  // moments (+ the float32 master of a 16-bit parameter)
    CHECK(first.host_state_bytes() == 231 * per_element);
    CHECK(first.state_bytes() == 231 * per_element);
    CHECK(first.device_state_bytes() == 0);
    CHECK(memory::pinned_stats().allocated_bytes.current - pinned_before >= 231 * per_element);

    StateDict saved;
    for (const auto& [key, t] : first.state_dict()) saved.emplace_back(key, t.clone());
    // step, exp_avg, exp_avg_sq (, master_param) + lr, beta1, beta2, eps, weight_decay, maximize, params
    CHECK(saved.size() == (dt == kFloat32 ? 10u : 11u));
    Tensor b = param_tensor(values_of(a), shape, dt);
    OffloadAdamW second({b}, {.lr = 1.0});  // the loaded lr replaces this one
    second.load_state_dict(saved);
    CHECK(second.param_groups()[0].lr == 3e-3);
    CHECK(second.device_state_bytes() == 0);
    for (int s = 2; s < 4; ++s) {
      a.set_grad(grad_at(s));
      b.set_grad(grad_at(s));
      first.step();
      second.step();
    }
    CHECK(values_of(b) == values_of(a));
    CHECK(values_of(second.master_param(b)) == values_of(first.master_param(a)));
    CHECK(values_of(second.state(b)->buffers[1]) == values_of(first.state(a)->buffers[1]));
    CHECK(second.state(b)->step == 4);
  }
}

TEST_CASE("OffloadAdamW: 1 and N threads give bitwise the same weights") {
  const int saved_threads = get_num_threads();
  const Shape shape{300000};  // several kOffloadAdamGrain slices, so a team really splits it
  auto run = [&](int threads, DType dt) {
    set_num_threads(threads);
    Tensor p = param_tensor(random_values(300000, 1), shape, dt);
    OffloadAdamW opt({p}, {.lr = 1e-3, .chunk_elements = 200000});
    for (int s = 0; s < 3; ++s) {
      p.set_grad(make_tensor(random_values(300000, 2 + uint64_t(s)), shape, dt));
      opt.step();
    }
    return std::pair(values_of(p), values_of(opt.state(p)->buffers[1]));
  };
  for (const DType dt : {kFloat32, kBFloat16}) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(dtype);
    const auto one = run(1, dt), two = run(2, dt), five = run(5, dt);
    CHECK(one.first == two.first);
    CHECK(one.first == five.first);
    CHECK(one.second == five.second);
  }
  set_num_threads(saved_threads);
}

TEST_CASE("OffloadAdamW: bad parameters and options throw, naming the parameter") {
  check_error(
      [] {
        OffloadAdamW({param_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64)});
      },
      {"OffloadAdamW", "parameter 0 of param group 0", "float64[2, 3]", "float32, float16 and bfloat16"});
  const Tensor strided = make_tensor(random_values(6, 1), {2, 3}, kFloat32).t();
  strided.requires_grad_();
  check_error([&] { OffloadAdamW({strided}); }, {"OffloadAdamW", "float32[3, 2]", "not contiguous"});
  check_error([] { OffloadAdamW({{.params = {param_tensor({1}, {1})}, .amsgrad = true}}); },
              {"OffloadAdamW", "amsgrad", "does not use"});
  check_error([] { OffloadAdamW({param_tensor({1}, {1})}, {.lr = -0.5}); }, {"OffloadAdamW", "learning rate"});
  check_error([] { OffloadAdamW({param_tensor({1}, {1})}, {.chunk_elements = 0}); }, {"chunk_elements"});
  // A gradient that does not match its parameter stops the step before any state changes.
  Tensor p = param_tensor({1, 2}, {2}, kFloat16);
  OffloadAdamW opt({p});
  p.set_grad(make_tensor({1, 2}, {2}, kFloat32));
  check_error([&] { opt.step(); }, {"OffloadAdamW.step", "float16[2]", "float32[2]"});
  CHECK(opt.state(p) == nullptr);
}

TEST_CASE(
    "OffloadAdamW: GradScaler.step unscales inside the step; unscale_ + clip_grad_norm_ + step still match AdamW") {
  for (const bool explicit_unscale : {false, true}) {
    CAPTURE(explicit_unscale);
    const Values w0 = random_values(37 * 53, 70), x0 = random_values(5 * 37, 71);
    Tensor w = param_tensor(w0, {37, 53}), w_ref = param_tensor(w0, {37, 53});
    const Tensor x = make_tensor(x0, {5, 37}, kFloat32);
    OffloadAdamW opt({w}, {.lr = 1e-2});
    AdamW adamw({w_ref}, {.lr = 1e-2});
    GradScaler scaler({.init_scale = 64.0}), scaler_ref({.init_scale = 64.0});
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      adamw.zero_grad();
      scaler.scale(sum(matmul(x, w))).backward();
      scaler_ref.scale(sum(matmul(x, w_ref))).backward();
      if (explicit_unscale) {  // the clipping recipe: unscale_ first, then clip, then step
        scaler.unscale_(opt);
        scaler_ref.unscale_(adamw);
        CHECK(clip_grad_norm_({w}, 0.5) == clip_grad_norm_({w_ref}, 0.5));
      }
      scaler.step(opt);
      scaler_ref.step(adamw);
      scaler.update();
      scaler_ref.update();
      // Scales are powers of two: unscaling in the step (float(g) / 64) and in place agree exactly.
      CHECK(values_of(w) == values_of(w_ref));
    }
    CHECK(opt.state(w)->step == 3);
  }
  AdamW adamw({param_tensor(random_values(4, 72), {4})}, {.lr = 1e-2});
  CHECK_FALSE(adamw.steps_scaled_grads());
  CHECK_THROWS_WITH_AS(adamw.step_scaled(1.0f), doctest::Contains("AdamW.step_scaled"), Error);
}
