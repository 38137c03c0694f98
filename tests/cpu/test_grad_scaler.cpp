// optim::GradScaler on the CPU against independent references: unscaled training of the
// same model (no overflow: the same weights), a float64 simulation of PyTorch's
// _amp_update_scale_ rule (backoff, growth, the float32 overflow cap), a naive per-element
// unscale in every floating dtype, skipped steps that leave weights and optimizer state
// bit-identical, several optimizers, state-dict round trips and every error path.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::optim;

namespace {

using Values = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A linear regression y = x W + b on fixed data: W (3, 4), b (4), x (8, 3), target (8, 4).
struct TinyModel {
  Tensor w, b, x, target;
  explicit TinyModel(uint64_t seed)
      : w(param_tensor(random_values(12, seed), {3, 4})),
        b(param_tensor(random_values(4, seed + 1), {4})),
        x(make_tensor(random_values(24, seed + 2), {8, 3}, kFloat32)),
        target(make_tensor(random_values(32, seed + 3), {8, 4}, kFloat32)) {}
  std::vector<Tensor> params() const { return {w, b}; }
  /// mean((x W + b - target)^2), a 0-d float32.
  Tensor loss() const {
    const Tensor d = sub(add(matmul(x, w), b), target);
    return mean(mul(d, d));
  }
};

/// Sets `p`'s gradient to `g` (in p's dtype).
void set_grad(const Tensor& p, const Values& g) { p.set_grad(make_tensor(g, p.sizes(), p.dtype())); }

/// PyTorch's _amp_update_scale_, simulated in double (rounded to float32 as PyTorch's scale).
struct ScaleRef {
  double scale;
  int64_t tracker = 0;
  GradScalerOptions o;
  void update(bool found_inf) {
    if (found_inf) {
      scale = double(float(scale * o.backoff_factor));
      tracker = 0;
    } else if (++tracker == o.growth_interval) {
      const float grown = float(scale * o.growth_factor);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  }
};

}  // namespace

TEST_CASE("GradScaler: scaled training gives the unscaled training's weights when nothing overflows") {
  for (const double init : {65536.0, 1000.0}) {
    CAPTURE(init);
    TinyModel plain(7), scaled(7);
    Adam plain_opt(plain.params(), {.lr = 1e-2});
    Adam scaled_opt(scaled.params(), {.lr = 1e-2});
    GradScaler scaler({.init_scale = init});
    for (int it = 0; it < 5; ++it) {
      plain_opt.zero_grad();
      plain.loss().backward();
      plain_opt.step();

      scaled_opt.zero_grad();
      const Tensor loss = scaled.loss();
      const Tensor big = scaler.scale(loss);
      CHECK(big.item<float>() == float(double(loss.item<float>()) * init));
      big.backward();
      // The backward carried the scale: every gradient is `init` times the plain one.
      Values expected_grad = values_of(plain.w.grad());
      for (double& v : expected_grad) v *= init;
      check_close(scaled.w.grad(), expected_grad, init == 65536.0 ? 1e-6 : 1e-5, 0, "scaled grad");
      scaler.step(scaled_opt);
      scaler.update();
    }
    // A power-of-two scale is exact (gradients bit-identical); 1000 rounds once per element.
    const double rtol = init == 65536.0 ? 1e-6 : 1e-5;
    check_close(scaled.w, values_of(plain.w), rtol, 0, "w");
    check_close(scaled.b, values_of(plain.b), rtol, 0, "b");
    CHECK(scaler.get_scale() == init);
    CHECK(scaler.get_growth_tracker() == 5);
  }
}

TEST_CASE("GradScaler: unscale_ divides every gradient by the scale in float32 math, in every dtype") {
  const double s = 1000.0;  // not a power of two: the rounding of g * float(1/s) shows
  const float inv = float(1.0 / s);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    // Two groups, odd sizes, an empty parameter, a parameter without gradient, a strided
    // gradient and one large enough for the threaded loop.
    std::vector<Tensor> ps = {param_tensor(random_values(5, 1), {5}, dt), param_tensor(random_values(12, 2), {3, 4}, dt),
                              param_tensor({}, {0}, dt), param_tensor(random_values(3, 4), {3}, dt),
                              param_tensor(random_values(140000, 5), {140000}, dt)};
    SGD opt({{.params = {ps[0], ps[1]}}, {.params = {ps[2], ps[3], ps[4]}}}, {.lr = 0.1});
    std::vector<Values> expected(ps.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      if (k == 3) continue;  // no gradient
      const Values g = values_of(make_tensor(random_values(ps[k].numel(), 10 + k, -500, 500), ps[k].sizes(), dt));
      if (k == 1) ps[k].set_grad(make_tensor(g, ps[k].sizes(), dt, Layout::Transposed));
      else set_grad(ps[k], g);
      for (double v : g) {
        // The reference: opmath (float, or double for float64) times float32 inv, rounded once to dt.
        expected[k].push_back(dt == kFloat64 ? v * double(inv) : double(float(float(v) * inv)));
      }
      expected[k] = values_of(make_tensor(expected[k], {int64_t(g.size())}, dt));
    }
    const Tensor strided_grad = ps[1].grad();
    GradScaler scaler({.init_scale = s});
    scaler.unscale_(opt);
    for (size_t k = 0; k < ps.size(); ++k) {
      if (k == 3) {
        CHECK(!ps[k].grad().defined());
        continue;
      }
      check_close(ps[k].grad(), expected[k], 0, 0, "grad " + std::to_string(k));
    }
    CHECK(ps[1].grad().shares_storage(strided_grad));  // in place, through the write-back
    scaler.step(opt);                                  // no overflow: steps with the unscaled gradients
    scaler.update();
    CHECK(scaler.get_growth_tracker() == 1);
  }
}

TEST_CASE("GradScaler: an inf or NaN gradient skips the step bit for bit and halves the scale") {
  for (const double bad : {kInf, -kInf, std::nan("")}) {
    CAPTURE(bad);
    TinyModel m(3);
    Adam opt(m.params(), {.lr = 1e-2});
    GradScaler scaler;
    // One clean step first, so Adam has state to leave untouched.
    scaler.scale(m.loss()).backward();
    scaler.step(opt);
    scaler.update();
    const Values w0 = values_of(m.w), b0 = values_of(m.b), m0 = values_of(opt.state(m.w)->buffers[0]);
    opt.zero_grad();
    scaler.scale(m.loss()).backward();
    m.b.grad().data_ptr<float>()[2] = float(bad);  // one element of one gradient
    scaler.step(opt);
    CHECK(values_of(m.w) == w0);
    CHECK(values_of(m.b) == b0);
    CHECK(opt.state(m.w)->step == 1);
    CHECK(values_of(opt.state(m.w)->buffers[0]) == m0);
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
    CHECK(scaler.get_growth_tracker() == 0);
    // The next clean iteration steps again, at the new scale.
    opt.zero_grad();
    scaler.scale(m.loss()).backward();
    scaler.step(opt);
    scaler.update();
    CHECK(opt.state(m.w)->step == 2);
    CHECK(values_of(m.w) != w0);
    CHECK(scaler.get_growth_tracker() == 1);
  }
}

TEST_CASE("GradScaler: the scale grows after growth_interval clean steps and backs off on overflow") {
  const GradScalerOptions o{.init_scale = 4.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3};
  Tensor p = param_tensor({1.0, 2.0, 3.0}, {3});
  SGD opt({p}, {.lr = 0.5});
  GradScaler scaler(o);
  ScaleRef ref{.scale = o.init_scale, .o = o};
  Values expected = {1.0, 2.0, 3.0};
  const std::string pattern = "ccccicciccccccc";  // c: clean step, i: an inf gradient
  for (size_t it = 0; it < pattern.size(); ++it) {
    CAPTURE(it);
    const bool inf = pattern[it] == 'i';
    const Values g = {0.25, -0.5, 1.0};
    Values scaled = {g[0] * scaler.get_scale(), g[1] * scaler.get_scale(), inf ? kInf : g[2] * scaler.get_scale()};
    set_grad(p, scaled);
    scaler.step(opt);
    scaler.update();
    ref.update(inf);
    if (!inf)
      for (size_t i = 0; i < 3; ++i) expected[i] -= 0.5 * g[i];
    CHECK(scaler.get_scale() == ref.scale);
    CHECK(scaler.get_growth_tracker() == ref.tracker);
    check_close(p, expected, 1e-6, 0, "p");
  }
  CHECK(ref.scale == 8.0);  // the pattern above grew, backed off and grew again

  // Growth that would overflow float32 keeps the scale (and resets the tracker).
  GradScaler big({.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  set_grad(p, {0.0, 0.0, 0.0});
  big.step(opt);
  big.update();
  CHECK(big.get_scale() == std::ldexp(1.0, 127));
  CHECK(big.get_growth_tracker() == 0);

  // update(new_scale) sets the scale and keeps the tracker, as PyTorch.
  GradScaler user(o);
  set_grad(p, {1.0, 1.0, 1.0});
  user.step(opt);
  user.update();
  set_grad(p, {1.0, 1.0, 1.0});
  user.step(opt);
  user.update(3.0);
  CHECK(user.get_scale() == 3.0);
  CHECK(user.get_growth_tracker() == 1);
}

TEST_CASE("GradScaler: each optimizer is checked on its own; any overflow backs off the scale") {
  Tensor a = param_tensor({1.0, 2.0}, {2}), c = param_tensor({3.0, 4.0}, {2});
  SGD opt_a({a}, {.lr = 1.0}), opt_c({c}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 2.0});
  set_grad(a, {kInf, 2.0});
  set_grad(c, {2.0, 4.0});
  scaler.step(opt_a);  // skipped
  scaler.unscale_(opt_c);
  scaler.step(opt_c);  // steps with the unscaled gradient (1, 2)
  scaler.update();
  CHECK(values_of(a) == Values{1.0, 2.0});
  CHECK(values_of(c) == Values{2.0, 2.0});
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("GradScaler: misuse throws and names the problem") {
  Tensor p = param_tensor({1.0, 2.0}, {2});
  SGD opt({p}, {.lr = 0.1});
  GradScaler scaler;
  set_grad(p, {1.0, 1.0});
  scaler.unscale_(opt);
  check_error([&] { scaler.unscale_(opt); }, {"GradScaler.unscale_", "already been called", "since the last update()"});
  scaler.step(opt);
  check_error([&] { scaler.unscale_(opt); }, {"GradScaler.unscale_", "after step()"});
  check_error([&] { scaler.step(opt); }, {"GradScaler.step", "already been called"});
  scaler.update();
  check_error([&] { scaler.update(); }, {"GradScaler.update", "no inf checks were recorded"});
  opt.zero_grad();
  check_error([&] { scaler.step(opt); }, {"GradScaler.step", "no inf checks were recorded", "SGD"});
  check_error([&] { scaler.update(); }, {"GradScaler.update", "no inf checks"});  // no gradient: nothing recorded
  // As in PyTorch, the failed step() still unscaled (nothing): the iteration must be ended
  // before the next one; update(new_scale) does that without an inf check.
  set_grad(p, {1.0, 1.0});
  check_error([&] { scaler.unscale_(opt); }, {"already been called"});
  scaler.update(scaler.get_scale());
  scaler.unscale_(opt);  // a fresh iteration works again
  scaler.update();
  CHECK(scaler.get_growth_tracker() == 2);
  check_error([&] { (void)scaler.scale(Tensor()); }, {"GradScaler.scale", "undefined"});
  check_error([&] { (void)scaler.scale(zeros({}, TensorOptions(kInt64))); }, {"GradScaler.scale", "floating", "int64"});
  check_error([&] { scaler.update(-1.0); }, {"GradScaler.update", "new_scale", "-1"});

  check_error([] { GradScaler s({.init_scale = 0.0}); }, {"GradScaler", "init_scale"});
  check_error([] { GradScaler s({.init_scale = 1e39}); }, {"GradScaler", "init_scale", "float32"});
  check_error([] { GradScaler s({.growth_factor = 1.0}); }, {"GradScaler", "growth_factor", "> 1"});
  check_error([] { GradScaler s({.backoff_factor = 1.0}); }, {"GradScaler", "backoff_factor", "(0, 1)"});
  check_error([] { GradScaler s({.growth_interval = 0}); }, {"GradScaler", "growth_interval", ">= 1"});
}

TEST_CASE("GradScaler: state_dict holds PyTorch's keys and a round trip resumes identically") {
  const GradScalerOptions o{.init_scale = 16.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3};
  Tensor p = param_tensor({1.0}, {1});
  SGD opt({p}, {.lr = 0.0});
  GradScaler a(o);
  for (int it = 0; it < 5; ++it) {  // 3 clean steps grow to 64, 2 more: tracker 2
    set_grad(p, {1.0});
    a.step(opt);
    a.update();
  }
  CHECK(a.get_scale() == 64.0);
  const StateDict sd = a.state_dict();
  REQUIRE(sd.size() == 5);
  const std::vector<std::pair<std::string, DType>> keys = {{"scale", kFloat64},
                                                           {"growth_factor", kFloat64},
                                                           {"backoff_factor", kFloat64},
                                                           {"growth_interval", kInt64},
                                                           {"_growth_tracker", kInt64}};
  const Values vals = {64.0, 4.0, 0.25, 3.0, 2.0};
  for (size_t k = 0; k < keys.size(); ++k) {
    CHECK(sd[k].first == keys[k].first);
    CHECK(sd[k].second.dtype() == keys[k].second);
    CHECK(sd[k].second.dim() == 0);
    CHECK(values_of(sd[k].second)[0] == vals[k]);
  }

  GradScaler b;  // default options: all replaced by the dict's
  b.load_state_dict(sd);
  CHECK(b.get_scale() == 64.0);
  CHECK(b.get_growth_tracker() == 2);
  CHECK(b.options().growth_factor == 4.0);
  CHECK(b.options().backoff_factor == 0.25);
  CHECK(b.options().growth_interval == 3);
  for (const bool inf : {false, false, true, false}) {  // both continue identically
    for (GradScaler* s : {&a, &b}) {
      set_grad(p, {inf ? kInf : 1.0});
      s->step(opt);
      s->update();
    }
    CHECK(a.get_scale() == b.get_scale());
    CHECK(a.get_growth_tracker() == b.get_growth_tracker());
  }

  // Bad dicts throw and change nothing.
  auto with = [&](const std::string& key, Tensor t) {
    StateDict d = sd;
    for (auto& [k, v] : d)
      if (k == key) v = t;
    return d;
  };
  GradScaler c;
  const auto f64 = [](double v) { return scalar_tensor(v, TensorOptions(kFloat64)); };
  check_error([&] { c.load_state_dict({}); }, {"GradScaler.load_state_dict", "empty", "disabled"});
  check_error([&] { c.load_state_dict(StateDict(sd.begin(), sd.end() - 1)); }, {"missing key '_growth_tracker'"});
  StateDict extra = sd;
  extra.emplace_back("enabled", f64(1.0));
  check_error([&] { c.load_state_dict(extra); }, {"unexpected key 'enabled'"});
  StateDict twice = sd;
  twice.push_back(sd[0]);
  check_error([&] { c.load_state_dict(twice); }, {"key 'scale' appears twice"});
  check_error([&] { c.load_state_dict(with("scale", f64(-2.0))); }, {"scale", "positive"});
  check_error([&] { c.load_state_dict(with("growth_factor", f64(0.5))); }, {"growth_factor"});
  check_error([&] { c.load_state_dict(with("growth_interval", f64(2.5))); }, {"growth_interval", "integer"});
  check_error([&] { c.load_state_dict(with("_growth_tracker", f64(3.0))); },
              {"_growth_tracker", "[0, growth_interval"});
  check_error([&] { c.load_state_dict(with("scale", zeros({2}, TensorOptions(kFloat64)))); }, {"scale", "one-element"});
  CHECK(c.get_scale() == 65536.0);
  CHECK(c.get_growth_tracker() == 0);
  CHECK(c.options().growth_interval == 2000);
}

TEST_CASE("GradScaler: a disabled scaler is a pass-through") {
  TinyModel m(5), twin(5);
  SGD opt(m.params(), {.lr = 0.1}), twin_opt(twin.params(), {.lr = 0.1});
  GradScaler scaler({.enabled = false});
  CHECK(!scaler.is_enabled());
  CHECK(scaler.get_scale() == 1.0);
  const Tensor loss = m.loss();
  CHECK(scaler.scale(loss).impl_ptr() == loss.impl_ptr());
  scaler.scale(loss).backward();
  twin.loss().backward();
  const Values g = values_of(m.w.grad());
  scaler.unscale_(opt);
  scaler.unscale_(opt);  // no bookkeeping, so no error
  CHECK(values_of(m.w.grad()) == g);
  scaler.step(opt);
  twin_opt.step();
  scaler.update();
  CHECK(values_of(m.w) == values_of(twin.w));
  CHECK(values_of(m.b) == values_of(twin.b));
  // Even an inf gradient is passed on to the optimizer.
  opt.zero_grad();
  set_grad(m.b, {kInf, 0.0, 0.0, 0.0});
  scaler.step(opt);
  CHECK(std::isinf(values_of(m.b)[0]));
  CHECK(scaler.state_dict().empty());
  scaler.load_state_dict({});  // a no-op when disabled
  CHECK(scaler.get_scale() == 1.0);
}
