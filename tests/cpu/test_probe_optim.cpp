// Probes for silent wrong answers in optim/ on the CPU, against float64 reimplementations of
// what PyTorch (and galore_torch, for GaLore) compute, written here from their documented
// algorithms: SGD over 10 steps with every option and a learning rate that changes between
// steps, Adam/AdamW with an eps large enough to tell where it is added and a decay large
// enough to tell its order, one multi-group multi-dtype optimizer against one optimizer per
// parameter (bit for bit), the threaded loop of a large tensor against a small one, a
// parameter that skips steps, OffloadAdamW against AdamW under a schedule and groups,
// GaLoreAdamW against galore_torch's GaLoreAdamW, clip_grad_norm_ at its boundaries,
// GradScaler's state machine over a run with overflows, and the LR schedulers at every
// step including both ends. A failing case here is a finding.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/galore.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/offload_adam.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/optimizer_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor f64(const Values& v, const Shape& shape) { return from_vector(v, shape, TensorOptions(kFloat64)); }

Tensor f64_param(const Values& v, const Shape& shape) {
  Tensor t = f64(v, shape);
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("probe optim: SGD over 10 steps with every option and an lr changed between steps") {
  const optim::SGDOptions cases[] = {
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.5},  // buf starts at g, not (1 - dampening) g
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.2, .maximize = true},
      {.lr = 0.05, .momentum = 0.7, .weight_decay = 0.1, .nesterov = true},
      {.lr = 0.05, .momentum = 0.7, .nesterov = true, .maximize = true},
      {.lr = 0.2, .weight_decay = 0.3},
  };
  for (const optim::SGDOptions& o : cases) {
    CAPTURE(o.momentum);
    CAPTURE(o.dampening);
    CAPTURE(o.weight_decay);
    CAPTURE(o.nesterov);
    CAPTURE(o.maximize);
    Tensor p = f64_param(random_values(5, 1), {5});
    optim::SGD opt(std::vector<Tensor>{p}, o);
    SgdReference ref{.momentum = o.momentum,
                     .dampening = o.dampening,
                     .wd = o.weight_decay,
                     .nesterov = o.nesterov,
                     .maximize = o.maximize};
    Values want = values_of(p);
    for (int s = 0; s < 10; ++s) {
      const double lr = o.lr * (1.0 + 0.25 * s);  // as a scheduler would change it
      opt.param_groups()[0].lr = lr;
      const Values g = random_values(5, 10 + uint64_t(s));
      p.set_grad(f64(g, {5}));
      ref.lr = lr;
      ref.step(want, g);
      opt.step();
      check_close(p, want, 1e-13, 1e-13, "step " + std::to_string(s));
    }
    if (o.momentum != 0) check_close(opt.state(p)->buffers[0], ref.buf, 1e-13, 1e-13, "momentum_buffer");
    else CHECK(opt.state(p) == nullptr);
  }
}

TEST_CASE("probe optim: Adam and AdamW over 10 steps: eps after the corrected sqrt, decay before, amsgrad on raw v") {
  // eps 0.05 is near sqrt(v_hat), so adding it before the correction would show; lr * wd = 0.1
  // makes the decay order show; gradients that shrink make amsgrad's max differ from v.
  for (bool decoupled : {false, true})
    for (bool amsgrad : {false, true})
      for (bool maximize : {false, true}) {
        CAPTURE(decoupled);
        CAPTURE(amsgrad);
        CAPTURE(maximize);
        Tensor p = f64_param(random_values(6, 2), {2, 3});
        auto options = [&](auto o) {  // AdamOptions or AdamWOptions, the same values
          o.lr = 0.2, o.beta1 = 0.8, o.beta2 = 0.95, o.eps = 0.05, o.weight_decay = 0.5;
          o.amsgrad = amsgrad, o.maximize = maximize;
          return o;
        };
        std::unique_ptr<optim::Optimizer> opt;
        if (decoupled) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, options(optim::AdamWOptions{}));
        else opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, options(optim::AdamOptions{}));
        AdamReference ref{.beta1 = 0.8,
                          .beta2 = 0.95,
                          .eps = 0.05,
                          .wd = 0.5,
                          .decoupled = decoupled,
                          .amsgrad = amsgrad,
                          .maximize = maximize};
        Values want = values_of(p);
        for (int s = 0; s < 10; ++s) {
          const double lr = s < 5 ? 0.2 : 0.05;  // the bias corrections follow the step, the lr the group
          opt->param_groups()[0].lr = lr;
          Values g = random_values(6, 30 + uint64_t(s));
          g[5] = 0.0;  // a zero gradient still decays and moves by the momentum
          for (double& x : g) x *= std::pow(0.5, s);
          p.set_grad(f64(g, {2, 3}));
          ref.lr = lr;
          ref.step(want, g);
          opt->step();
          check_close(p, want, 1e-12, 1e-13, "step " + std::to_string(s));
        }
        const optim::ParamState* st = opt->state(p);
        REQUIRE(st != nullptr);
        CHECK(st->step == 10);
        check_close(st->buffers[0], ref.m, 1e-12, 1e-14, "exp_avg");
        check_close(st->buffers[1], ref.v, 1e-12, 1e-14, "exp_avg_sq");
        if (amsgrad) check_close(st->buffers[2], ref.vmax, 1e-12, 1e-14, "max_exp_avg_sq");
        else CHECK_FALSE(st->buffers[2].defined());
      }
}

TEST_CASE("probe optim: one optimizer over groups and dtypes equals one optimizer per parameter, bit for bit") {
  // The batched path (entries grouped by dtype, hyperparameters per entry) against the same
  // rule applied to each parameter alone.
  auto params = [] {
    return std::vector<Tensor>{
        param_tensor(random_values(7, 3), {7}, kFloat32), param_tensor(random_values(6, 4), {2, 3}, kFloat64),
        param_tensor(random_values(5, 5), {5}, kBFloat16), param_tensor(random_values(4, 6), {4}, kFloat32)};
  };
  std::vector<Tensor> all = params(), alone = params();
  const optim::AdamWOptions base{.lr = 0.01, .weight_decay = 0.1};
  std::vector<optim::ParamGroup> groups = {{.params = {all[0], all[1]}},
                                           {.params = {all[2]}, .lr = 0.03, .beta1 = 0.5, .eps = 1e-3, .amsgrad = true},
                                           {.params = {all[3]}, .lr = 0.002, .weight_decay = 0.0, .maximize = true}};
  optim::AdamW together(groups, base);
  std::vector<std::unique_ptr<optim::AdamW>> single;
  single.push_back(std::make_unique<optim::AdamW>(std::vector<Tensor>{alone[0]}, base));
  single.push_back(std::make_unique<optim::AdamW>(std::vector<Tensor>{alone[1]}, base));
  single.push_back(std::make_unique<optim::AdamW>(
      std::vector<Tensor>{alone[2]},
      optim::AdamWOptions{.lr = 0.03, .beta1 = 0.5, .eps = 1e-3, .weight_decay = 0.1, .amsgrad = true}));
  single.push_back(std::make_unique<optim::AdamW>(
      std::vector<Tensor>{alone[3]}, optim::AdamWOptions{.lr = 0.002, .weight_decay = 0.0, .maximize = true}));
  for (int s = 0; s < 10; ++s) {
    for (size_t k = 0; k < all.size(); ++k) {
      if (k == 1 && s % 3 == 1) {  // a parameter without a gradient now and then: skipped by both
        all[k].set_grad(Tensor());
        alone[k].set_grad(Tensor());
        continue;
      }
      const Tensor g = make_tensor(random_values(all[k].numel(), 100 + 10 * uint64_t(s) + k), all[k].sizes(),
                                   TensorOptions(all[k].dtype()));
      all[k].set_grad(g);
      alone[k].set_grad(g.clone());
    }
    together.step();
    for (size_t k = 0; k < single.size(); ++k)
      if (alone[k].grad().defined()) single[k]->step();
  }
  for (size_t k = 0; k < all.size(); ++k) {
    CAPTURE(k);
    CHECK(values_of(all[k]) == values_of(alone[k]));
    CHECK(together.state(all[k])->step == single[k]->state(alone[k])->step);
    CHECK(values_of(together.state(all[k])->buffers[1]) == values_of(single[k]->state(alone[k])->buffers[1]));
  }
  CHECK(together.state(all[1])->step == 7);  // skipped at s = 1, 4, 7
}

TEST_CASE("probe optim: the threaded loop of a large tensor computes every element as a small tensor does") {
  // 150000 elements take the parallel path (>= 2^17); their first 64 equal a 64-element
  // parameter's update bit for bit, for SGD with momentum and for AdamW.
  const int64_t n = 150000, k = 64;
  const Values p0 = random_values(n, 7), g0 = random_values(n, 8), g1 = random_values(n, 9);
  const Values p0s(p0.begin(), p0.begin() + k), g0s(g0.begin(), g0.begin() + k), g1s(g1.begin(), g1.begin() + k);
  for (bool adam : {false, true}) {
    CAPTURE(adam);
    Tensor big = param_tensor(p0, {n}), small = param_tensor(p0s, {k});
    std::unique_ptr<optim::Optimizer> a, b;
    if (adam) {
      a = std::make_unique<optim::AdamW>(std::vector<Tensor>{big}, optim::AdamWOptions{.lr = 0.01});
      b = std::make_unique<optim::AdamW>(std::vector<Tensor>{small}, optim::AdamWOptions{.lr = 0.01});
    } else {
      a = std::make_unique<optim::SGD>(std::vector<Tensor>{big}, optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
      b = std::make_unique<optim::SGD>(std::vector<Tensor>{small}, optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    }
    for (const auto* g : {&g0, &g1}) {
      big.set_grad(make_tensor(*g, {n}, kFloat32));
      small.set_grad(make_tensor(Values(g->begin(), g->begin() + k), {k}, kFloat32));
      a->step();
      b->step();
    }
    CHECK(values_of(big.narrow(0, 0, k)) == values_of(small));
  }
}

TEST_CASE("probe optim: OffloadAdamW equals AdamW bit for bit over groups, maximize and a schedule") {
  auto params = [] {
    return std::vector<Tensor>{param_tensor(random_values(40, 11), {8, 5}), param_tensor(random_values(9, 12), {9})};
  };
  std::vector<Tensor> pa = params(), pb = params();
  optim::AdamW a({{.params = {pa[0]}}, {.params = {pa[1]}, .lr = 0.02, .maximize = true}},
                 {.lr = 0.01, .beta2 = 0.99, .weight_decay = 0.2});
  optim::OffloadAdamW b({{.params = {pb[0]}}, {.params = {pb[1]}, .lr = 0.02, .maximize = true}},
                        {.lr = 0.01, .beta2 = 0.99, .weight_decay = 0.2, .chunk_elements = 7});
  optim::WarmupCosineLR sa(a, {.warmup_steps = 3, .total_steps = 10, .start_factor = 0.1});
  optim::WarmupCosineLR sb(b, {.warmup_steps = 3, .total_steps = 10, .start_factor = 0.1});
  for (int s = 0; s < 10; ++s) {
    for (size_t k = 0; k < pa.size(); ++k) {
      const Tensor g = make_tensor(random_values(pa[k].numel(), 300 + 10 * uint64_t(s) + k), pa[k].sizes(), kFloat32);
      pa[k].set_grad(g);
      pb[k].set_grad(g.clone());
    }
    a.step();
    b.step();
    sa.step();
    sb.step();
  }
  for (size_t k = 0; k < pa.size(); ++k) {
    CAPTURE(k);
    CHECK(values_of(pa[k]) == values_of(pb[k]));
    CHECK(values_of(a.state(pa[k])->buffers[0]) == values_of(b.state(pb[k])->buffers[0]));
  }
}

TEST_CASE("probe optim: GaLoreAdamW follows galore_torch's GaLoreAdamW (eps, bias correction, scale, decay order)") {
  // galore_torch/adamw.py, per parameter at step t (t counted from 1):
  //   R = project(G)  (P^T G for m < n, else G P; P from the SVD at t - 1 % T == 0)
  //   M = b1 M + (1 - b1) R;  V = b2 V + (1 - b2) R^2;  N = M / (sqrt(V) + eps)
  //   step_size = lr * sqrt(1 - b2^t) / (1 - b1^t)
  //   p -= step_size * (projected ? scale * project_back(N) : N);  then p -= lr * wd * p
  // eps and the decay are large here so that their placement shows.
  const double lr = 0.05, b1 = 0.9, b2 = 0.99, eps = 1e-2, wd = 0.4, scale = 0.25;
  Tensor wide = f64_param(random_values(4 * 7, 41), {4, 7});  // m < n: left projection
  Tensor tall = f64_param(random_values(6 * 5, 42), {6, 5});  // m >= n: right projection
  Tensor vec = f64_param(random_values(5, 43), {5});          // not projected
  optim::GaLoreAdamW opt(std::vector<Tensor>{wide, tall, vec}, {.lr = lr,
                                                                .beta1 = b1,
                                                                .beta2 = b2,
                                                                .eps = eps,
                                                                .weight_decay = wd,
                                                                .rank = 2,
                                                                .update_proj_gap = 1000,
                                                                .scale = scale});
  struct Ref {
    Values p, m, v;
  };
  std::vector<Tensor> ps = {wide, tall, vec};
  std::vector<Ref> refs;
  for (const Tensor& p : ps) refs.push_back({values_of(p), {}, {}});
  std::vector<Values> proj(ps.size());  // P (rows, r), row-major, read after the first step
  for (int t = 1; t <= 10; ++t) {
    std::vector<Values> grads;
    for (size_t k = 0; k < ps.size(); ++k) {
      grads.push_back(random_values(ps[k].numel(), 500 + 10 * uint64_t(t) + k));
      ps[k].set_grad(f64(grads[k], ps[k].sizes()));
    }
    opt.step();
    const double step_size = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (size_t k = 0; k < ps.size(); ++k) {
      CAPTURE(k);
      CAPTURE(t);
      Ref& r = refs[k];
      const Values& G = grads[k];
      Values R = G;
      int64_t m = 1, n = ps[k].numel(), rank = 2;
      const bool projected = ps[k].dim() == 2;
      const bool left = projected && ps[k].size(0) < ps[k].size(1);
      if (projected) {
        m = ps[k].size(0), n = ps[k].size(1);
        if (proj[k].empty()) proj[k] = values_of(opt.state(ps[k])->buffers[2]);
        const Values& P = proj[k];  // (m, r) left, (n, r) right
        R.assign(size_t(left ? rank * n : m * rank), 0.0);
        if (left)
          for (int64_t i = 0; i < rank; ++i)
            for (int64_t j = 0; j < n; ++j)
              for (int64_t l = 0; l < m; ++l) R[size_t(i * n + j)] += P[size_t(l * rank + i)] * G[size_t(l * n + j)];
        else
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < rank; ++j)
              for (int64_t l = 0; l < n; ++l) R[size_t(i * rank + j)] += G[size_t(i * n + l)] * P[size_t(l * rank + j)];
      }
      if (r.m.empty()) r.m.assign(R.size(), 0.0), r.v.assign(R.size(), 0.0);
      Values N(R.size());
      for (size_t i = 0; i < R.size(); ++i) {
        r.m[i] = b1 * r.m[i] + (1 - b1) * R[i];
        r.v[i] = b2 * r.v[i] + (1 - b2) * R[i] * R[i];
        N[i] = r.m[i] / (std::sqrt(r.v[i]) + eps);
      }
      Values U = N;  // the full-size update direction
      if (projected) {
        const Values& P = proj[k];
        U.assign(size_t(m * n), 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t l = 0; l < rank; ++l)
              s += left ? P[size_t(i * rank + l)] * N[size_t(l * n + j)]
                        : N[size_t(i * rank + l)] * P[size_t(j * rank + l)];
            U[size_t(i * n + j)] = scale * s;
          }
      }
      for (size_t i = 0; i < r.p.size(); ++i) {
        r.p[i] -= step_size * U[i];
        r.p[i] -= lr * wd * r.p[i];
      }
      check_close(ps[k], r.p, 1e-12, 1e-13, "parameter " + std::to_string(k) + " at step " + std::to_string(t));
    }
  }
}

TEST_CASE("probe optim: clip_grad_norm_ at its boundaries: max_norm 0, total equal to max_norm, norm 3, inf") {
  auto grads = [] { return std::vector<Values>{{3.0, -4.0}, {0.0, 12.0, -1.0}}; };
  auto params = [&](const std::vector<Values>& gs) {
    std::vector<Tensor> ps;
    for (const Values& g : gs) {
      ps.push_back(f64_param(Values(g.size(), 0.0), {int64_t(g.size())}));
      ps.back().set_grad(f64(g, {int64_t(g.size())}));
    }
    return ps;
  };
  struct Case {
    double max_norm, norm_type;
  };
  // Totals: p=2 sqrt(170), p=1 20, p=inf 12, p=3 (27+64+1728+1)^(1/3).
  const Case cases[] = {{0.0, 2.0}, {std::sqrt(170.0), 2.0}, {20.0, 1.0}, {12.0, kInf}, {5.0, 3.0}, {1e9, 3.0}};
  for (const Case& c : cases) {
    CAPTURE(c.max_norm);
    CAPTURE(c.norm_type);
    const std::vector<Values> gs = grads();
    std::vector<Tensor> ps = params(gs);
    double total = 0;
    for (const Values& g : gs)
      for (double x : g)
        total = std::isinf(c.norm_type) ? std::max(total, std::fabs(x)) : total + std::pow(std::fabs(x), c.norm_type);
    if (!std::isinf(c.norm_type)) total = std::pow(total, 1.0 / c.norm_type);
    const double coef = std::min(1.0, c.max_norm / (total + 1e-6));  // torch scales even at total == max_norm
    CHECK(optim::clip_grad_norm_(ps, c.max_norm, c.norm_type) == doctest::Approx(total).epsilon(1e-14));
    for (size_t k = 0; k < ps.size(); ++k) {
      Values want = gs[k];
      for (double& x : want) x *= coef;
      check_close(ps[k].grad(), want, 1e-14, 0.0, "gradient " + std::to_string(k));
    }
  }
}

TEST_CASE("probe optim: GradScaler over 10 iterations with overflows follows torch's state machine") {
  // growth_interval 3, growth 4, backoff 0.25; overflows at iterations 2 and 7.
  Tensor p = param_tensor({1.0, -1.0}, {2});
  optim::SGD opt(std::vector<Tensor>{p}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 8.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  double scale = 8.0;
  int64_t tracker = 0;
  Values want = values_of(p);
  for (int it = 0; it < 10; ++it) {
    CAPTURE(it);
    const bool overflow = it == 2 || it == 7;
    const Values g = {0.5 * (it + 1), -0.25};
    p.set_grad(make_tensor({g[0] * scale, overflow ? kInf : g[1] * scale}, {2}, kFloat32));
    if (it % 2 == 0) {
      scaler.unscale_(opt);
      check_error([&] { scaler.unscale_(opt); }, {"already been called"});
    }
    scaler.step(opt);
    check_error([&] { scaler.step(opt); }, {"already been called"});
    check_error([&] { scaler.unscale_(opt); }, {"after step()"});
    if (!overflow)
      for (size_t i = 0; i < 2; ++i) want[i] -= 0.5 * g[i];
    scaler.update();
    if (overflow) scale *= 0.25, tracker = 0;
    else if (++tracker == 3) scale *= 4.0, tracker = 0;
    CHECK(scaler.get_scale() == scale);
    CHECK(scaler.get_growth_tracker() == tracker);
    check_close(p, want, 0.0, 0.0, "weights");
  }
}

TEST_CASE("probe optim: LR schedulers at every step, both ends included, and the lr the optimizer uses") {
  using std::numbers::pi;
  const double base = 0.4;
  auto run = [&](const char* what, auto make, auto closed, int steps) {
    CAPTURE(what);
    Tensor p = f64_param({0.0}, {1});
    optim::SGD opt({{.params = {p}, .lr = base}}, {.lr = base});
    auto sched = make(opt);
    for (int t = 0; t <= steps; ++t) {
      CAPTURE(t);
      const double want = closed(t);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(want).epsilon(1e-14));
      CHECK(sched->last_lr()[0] == opt.param_groups()[0].lr);
      const double before = values_of(p)[0];
      p.set_grad(f64({1.0}, {1}));
      opt.step();
      CHECK(before - values_of(p)[0] == doctest::Approx(want).epsilon(1e-12));  // p -= lr * 1
      sched->step();
    }
  };
  run(
      "StepLR",
      [](optim::Optimizer& o) {
        return std::make_unique<optim::StepLR>(o, optim::StepLROptions{3, 0.5});
      },
      [&](int t) { return base * std::pow(0.5, t / 3); }, 10);
  run(
      "LinearLR",
      [](optim::Optimizer& o) {
        return std::make_unique<optim::LinearLR>(
            o, optim::LinearLROptions{.start_factor = 0.25, .end_factor = 0.75, .total_iters = 4});
      },
      [&](int t) { return base * (0.25 + 0.5 * std::min(t, 4) / 4.0); }, 8);
  run(
      "CosineAnnealingLR",
      [](optim::Optimizer& o) {
        return std::make_unique<optim::CosineAnnealingLR>(o,
                                                          optim::CosineAnnealingLROptions{.T_max = 6, .eta_min = 0.01});
      },
      [&](int t) { return 0.01 + (base - 0.01) * (1 + std::cos(pi * t / 6)) / 2; }, 6);
  run(
      "WarmupCosineLR",
      [](optim::Optimizer& o) {
        return std::make_unique<optim::WarmupCosineLR>(
            o,
            optim::WarmupCosineLROptions{.warmup_steps = 4, .total_steps = 10, .start_factor = 0.1, .eta_min = 0.02});
      },
      [&](int t) {
        return t < 4 ? base * (0.1 + 0.9 * t / 4.0) : 0.02 + (base - 0.02) * (1 + std::cos(pi * (t - 4) / 6.0)) / 2;
      },
      10);
  // torch 1.13 printed these for SequentialLR([LinearLR(0.1, 1, 4), CosineAnnealingLR(6, 0.01), StepLR(2, 0.5)], [4,
  // 10]) on lr 0.5; here on 0.4, so scaled by 0.8.
  const Values torch_seq = {0.05,
                            0.1625,
                            0.275,
                            0.3875,
                            0.5,
                            0.4671762239271875,
                            0.3775,
                            0.255,
                            0.13250000000000006,
                            0.04282377607281252,
                            0.5,
                            0.5,
                            0.25,
                            0.25,
                            0.125,
                            0.125};
  run(
      "SequentialLR",
      [](optim::Optimizer& o) {
        auto a = std::make_shared<optim::LinearLR>(o, optim::LinearLROptions{.start_factor = 0.1, .total_iters = 4});
        auto b = std::make_shared<optim::CosineAnnealingLR>(
            o, optim::CosineAnnealingLROptions{.T_max = 6, .eta_min = 0.008});
        auto c = std::make_shared<optim::StepLR>(o, optim::StepLROptions{2, 0.5});
        return std::make_unique<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{a, b, c},
                                                     std::vector<int64_t>{4, 10});
      },
      [&](int t) { return 0.8 * torch_seq[size_t(t)]; }, 15);
}

TEST_CASE("probe optim: SequentialLR at a milestone sets the next part's closed form under a chained StepLR") {
  // torch 1.13, one optimizer with lr 0.1 and, stepped each epoch after opt.step():
  //   seq = SequentialLR(opt, [LinearLR(opt, 0.1, 1.0, 5), ExponentialLR(opt, 0.9)], [8])
  //   step = StepLR(opt, 3, 0.5)
  // printed lr 0.028 0.046 0.032 0.041 0.05 0.025 0.025 0.1 0.045 for epochs 1-9: at epoch 8 the
  // milestone's step(0) puts ExponentialLR's base back, dropping StepLR's decays.
  Tensor p = f64_param({0.0}, {1});
  optim::SGD opt(std::vector<Tensor>{p}, {.lr = 0.1});
  auto warm = std::make_shared<optim::LinearLR>(opt, optim::LinearLROptions{0.1, 1.0, 5});
  auto decay = std::make_shared<optim::ExponentialLR>(opt, optim::ExponentialLROptions{0.9});
  optim::SequentialLR seq(opt, {warm, decay}, {8});
  optim::StepLR step(opt, {3, 0.5});
  const std::vector<double> torch = {0.028, 0.046, 0.032, 0.041, 0.05, 0.025, 0.025, 0.1, 0.045};
  for (size_t e = 0; e < torch.size(); ++e) {
    CAPTURE(e + 1);
    seq.step();
    step.step();
    CHECK(opt.param_groups()[0].lr == doctest::Approx(torch[e]).epsilon(1e-12));
  }
}

TEST_CASE("probe optim: a param group's negative lr is refused, an unset one takes the optimizer's") {
  // torch: SGD([{'params': [p], 'lr': -0.5}], lr=0.1) raises "Invalid learning rate: -0.5".
  Tensor p = f64_param({0.0}, {1}), q = f64_param({0.0}, {1});
  check_error([&] { optim::SGD({{.params = {p}, .lr = -0.5}}, {.lr = 0.1}); },
              {"SGD", "param group 0", "invalid learning rate -0.5"});
  check_error([&] { optim::AdamW({{.params = {p}, .lr = -1.0}}, {.lr = 0.1}); },
              {"AdamW", "param group 0", "invalid learning rate -1"});
  optim::SGD opt({{.params = {p}}, {.params = {q}, .lr = 0.5}}, {.lr = 0.1});
  CHECK(opt.param_groups()[0].lr == 0.1);
  CHECK(opt.param_groups()[1].lr == 0.5);
  optim::SGD later(std::vector<Tensor>{p}, {.lr = 0.1});
  check_error([&] { later.add_param_group({.params = {q}, .lr = -0.25}); }, {"SGD", "invalid learning rate -0.25"});
}
