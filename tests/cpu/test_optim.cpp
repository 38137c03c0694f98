// optim/: SGD, Adam and AdamW against naive float64 reimplementations of PyTorch's
// update rules (every option, several steps, param groups, skipped parameters,
// strided tensors, 16-bit parameters), zero_grad, state dicts (keys, a bit-identical
// resume through a safetensors file, every load error), LR schedulers against the
// closed forms PyTorch documents and its recursive forms, and clip_grad_norm_
// against hand-computed norms.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "autograd/ops/matmul.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "optim/update_math.h"  // adam_update: the reference of the vectorised AdamW
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::optim;

namespace {

using Values = std::vector<double>;

Tensor make_param(const Values& v, const Shape& shape, DType dt = kFloat64, Layout layout = Layout::Contiguous) {
  Tensor t = make_tensor(v, shape, dt, layout);
  t.requires_grad_();
  return t;
}

/// `v` rounded to dtype `dt` (through frugal's conversion).
Values rounded(const Values& v, DType dt) { return values_of(make_tensor(v, {int64_t(v.size())}, dt)); }

// ---- float64 references, written from PyTorch's documented algorithms ---------------

struct SgdRef {
  SGDOptions o;
  Values buf;
  void step(Values& p, const Values& grad) {
    Values d(grad);
    for (size_t i = 0; i < p.size(); ++i) {
      if (o.maximize) d[i] = -d[i];
      if (o.weight_decay != 0) d[i] += o.weight_decay * p[i];
    }
    if (o.momentum != 0) {
      if (buf.empty()) {
        buf = d;
      } else {
        for (size_t i = 0; i < p.size(); ++i) buf[i] = o.momentum * buf[i] + (1 - o.dampening) * d[i];
      }
      for (size_t i = 0; i < p.size(); ++i) d[i] = o.nesterov ? d[i] + o.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= o.lr * d[i];
  }
};

struct AdamRef {
  AdamOptions o;
  bool decoupled = false;
  Values m, v, vmax;
  int64_t t = 0;
  void step(Values& p, const Values& grad) {
    if (m.empty()) m = v = vmax = Values(p.size(), 0.0);
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, double(t)), bc2 = 1 - std::pow(o.beta2, double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grad[i] : grad[i];
      if (decoupled) p[i] *= 1 - o.lr * o.weight_decay;
      else g += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double m_hat = m[i] / bc1, v_hat = (o.amsgrad ? vmax[i] : v[i]) / bc2;
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

AdamOptions adam_of(const AdamWOptions& w) {
  return {w.lr, w.beta1, w.beta2, w.eps, w.weight_decay, w.amsgrad, w.maximize};
}

const Shape kShapes[] = {{3, 4}, {5}, {2, 3, 2}};

/// Steps `opt` and the references `steps` times on the same random gradients and
/// compares every parameter after each step.
template <typename Ref>
void run_against_reference(Optimizer& opt, std::vector<Tensor>& params, std::vector<Ref>& refs, int steps, DType dt,
                           double rtol, double atol, uint64_t seed) {
  std::vector<Values> ref_p;
  for (const Tensor& p : params) ref_p.push_back(values_of(p));
  for (int s = 0; s < steps; ++s) {
    for (size_t k = 0; k < params.size(); ++k) {
      const Tensor g = make_tensor(random_values(params[k].numel(), seed + 100 * s + k), params[k].sizes(), dt);
      params[k].set_grad(g);
      refs[k].step(ref_p[k], values_of(g));
    }
    opt.step();
    for (size_t k = 0; k < params.size(); ++k)
      check_close(params[k], ref_p[k], rtol, atol,
                  "param " + std::to_string(k) + " after step " + std::to_string(s + 1));
  }
}

std::vector<Tensor> make_params(DType dt, uint64_t seed) {
  std::vector<Tensor> ps;
  for (const Shape& s : kShapes) ps.push_back(make_param(random_values(numel_of(s), seed++), s, dt));
  return ps;
}

std::string describe(const SGDOptions& o) {
  return "lr " + std::to_string(o.lr) + " momentum " + std::to_string(o.momentum) + " dampening " +
         std::to_string(o.dampening) + " wd " + std::to_string(o.weight_decay) + (o.nesterov ? " nesterov" : "") +
         (o.maximize ? " maximize" : "");
}

std::string describe(const AdamOptions& o) {
  return "lr " + std::to_string(o.lr) + " betas " + std::to_string(o.beta1) + "," + std::to_string(o.beta2) + " wd " +
         std::to_string(o.weight_decay) + (o.amsgrad ? " amsgrad" : "") + (o.maximize ? " maximize" : "");
}

/// A deep copy of a state dict (its buffers are the live state).
StateDict cloned(const StateDict& d) {
  StateDict out;
  for (const auto& [k, t] : d) out.emplace_back(k, t.clone());
  return out;
}

const Tensor& find(const StateDict& d, const std::string& key) {
  for (const auto& [k, t] : d)
    if (k == key) return t;
  FAIL("missing key " << key);
  static Tensor none;
  return none;
}

StateDict without(const StateDict& d, const std::string& key) {
  StateDict out;
  for (const auto& kv : d)
    if (kv.first != key) out.push_back(kv);
  return out;
}

StateDict replaced(const StateDict& d, const std::string& key, const Tensor& t) {
  StateDict out = d;
  for (auto& kv : out)
    if (kv.first == key) kv.second = t;
  return out;
}

}  // namespace

// ---- SGD ------------------------------------------------------------------------------

TEST_CASE("optim: SGD matches PyTorch's update rule with every option") {
  const SGDOptions variants[] = {
      {.lr = 0.1},
      {.lr = 0.05, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.3},
      {.lr = 0.05, .momentum = 0.8, .nesterov = true},
      {.lr = 0.02, .momentum = 0.5, .weight_decay = 0.1},
      {.lr = 0.02, .weight_decay = 0.05, .nesterov = false, .maximize = true},
      {.lr = 0.03, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true, .maximize = true},
  };
  for (DType dt : {kFloat64, kFloat32}) {
    for (const SGDOptions& o : variants) {
      CAPTURE(dtype_name(dt));
      CAPTURE(describe(o));
      std::vector<Tensor> ps = make_params(dt, 11);
      std::vector<SgdRef> refs(ps.size(), SgdRef{o, {}});
      SGD opt(ps, o);
      run_against_reference(opt, ps, refs, 5, dt, dt == kFloat64 ? 1e-12 : 1e-5, dt == kFloat64 ? 1e-14 : 1e-6, 7);
      if (o.momentum != 0) {
        const ParamState* st = opt.state(ps[0]);
        REQUIRE(st != nullptr);
        check_close(st->buffers[0], refs[0].buf, dt == kFloat64 ? 1e-12 : 1e-5, 1e-6, "momentum_buffer");
      } else {
        CHECK(opt.state(ps[0]) == nullptr);  // plain SGD keeps no state
      }
    }
  }
}

// ---- Adam / AdamW -----------------------------------------------------------------------

TEST_CASE("optim: Adam and AdamW match PyTorch's update rule with every option") {
  const AdamOptions adam_variants[] = {
      {},
      {.lr = 0.01, .weight_decay = 0.1},
      {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .amsgrad = true},
      {.lr = 0.02, .weight_decay = 0.05, .amsgrad = true, .maximize = true},
  };
  const AdamWOptions adamw_variants[] = {
      {},
      {.lr = 0.01, .weight_decay = 0.1},
      {.lr = 0.01, .beta1 = 0.5, .beta2 = 0.9, .weight_decay = 0.2, .amsgrad = true},
      {.lr = 0.02, .weight_decay = 0.0, .maximize = true},
  };
  for (DType dt : {kFloat64, kFloat32}) {
    const double rtol = dt == kFloat64 ? 1e-10 : 2e-5, atol = dt == kFloat64 ? 1e-13 : 1e-6;
    for (const AdamOptions& o : adam_variants) {
      CAPTURE(dtype_name(dt));
      CAPTURE("Adam " + describe(o));
      std::vector<Tensor> ps = make_params(dt, 21);
      std::vector<AdamRef> refs(ps.size(), AdamRef{o, false, {}, {}, {}, 0});
      Adam opt(ps, o);
      run_against_reference(opt, ps, refs, 6, dt, rtol, atol, 3);
      const ParamState* st = opt.state(ps[2]);
      REQUIRE(st != nullptr);
      CHECK(st->step == 6);
      check_close(st->buffers[0], refs[2].m, rtol, atol, "exp_avg");
      check_close(st->buffers[1], refs[2].v, rtol, atol, "exp_avg_sq");
      CHECK(st->buffers[2].defined() == o.amsgrad);
      if (o.amsgrad) check_close(st->buffers[2], refs[2].vmax, rtol, atol, "max_exp_avg_sq");
    }
    for (const AdamWOptions& o : adamw_variants) {
      CAPTURE(dtype_name(dt));
      CAPTURE("AdamW " + describe(adam_of(o)));
      std::vector<Tensor> ps = make_params(dt, 31);
      std::vector<AdamRef> refs(ps.size(), AdamRef{adam_of(o), true, {}, {}, {}, 0});
      AdamW opt(ps, o);
      run_against_reference(opt, ps, refs, 6, dt, rtol, atol, 5);
    }
  }
}

TEST_CASE("optim: AdamW's default weight decay is 1e-2 and Adam's is 0") {
  std::vector<Tensor> a = make_params(kFloat64, 1), b = make_params(kFloat64, 1);
  AdamW w(a);
  Adam plain(b);
  CHECK(*w.param_groups()[0].weight_decay == 1e-2);
  CHECK(*plain.param_groups()[0].weight_decay == 0.0);
  CHECK(w.param_groups()[0].lr == 1e-3);
  CHECK(std::string(w.name()) == "AdamW");
  CHECK(std::string(plain.name()) == "Adam");
}

TEST_CASE("optim: 16-bit parameters keep float32 state and round once per step") {
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const Shape shape{37};
    const AdamOptions o{.lr = 0.05, .weight_decay = 0.01};
    Tensor p = make_param(random_values(37, 4, 0.5, 2.0), shape, dt);
    Adam opt({p}, o);
    AdamRef ref{o, false, {}, {}, {}, 0};
    Values ref_p = values_of(p);
    for (int s = 0; s < 4; ++s) {
      const Tensor g = make_tensor(random_values(37, 50 + s), shape, dt);
      p.set_grad(g);
      opt.step();
      ref.step(ref_p, values_of(g));
      ref_p = rounded(ref_p, dt);  // the parameter is stored in dt after every step
      // within a rounding of dt (float-vs-double math can round the other way)
      check_close(p, ref_p, 2 * default_rtol(dt), 0.0, "param after step " + std::to_string(s + 1));
      ref_p = values_of(p);  // continue from what frugal stored, so errors do not compound
    }
    const ParamState* st = opt.state(p);
    REQUIRE(st != nullptr);
    CHECK(st->buffers[0].dtype() == kFloat32);
    CHECK(st->buffers[1].dtype() == kFloat32);
    CHECK(p.dtype() == dt);

    Tensor q = make_param(random_values(9, 5), {9}, dt);
    SGD sgd({q}, {.lr = 0.1, .momentum = 0.9});
    q.set_grad(make_tensor(random_values(9, 6), {9}, dt));
    sgd.step();
    CHECK(sgd.state(q)->buffers[0].dtype() == kFloat32);
  }
}

// ---- groups, skipping, layouts ------------------------------------------------------------

TEST_CASE("optim: param groups take their own hyperparameters, defaults from the options") {
  std::vector<Tensor> a = make_params(kFloat64, 40), b = make_params(kFloat64, 50);
  const SGDOptions o{.lr = 0.1, .momentum = 0.9};
  SGD opt({{.params = a}, {.params = b, .lr = 0.01, .weight_decay = 0.1}}, o);
  REQUIRE(opt.param_groups().size() == 2);
  const ParamGroup& g0 = opt.param_groups()[0];
  const ParamGroup& g1 = opt.param_groups()[1];
  CHECK(g0.lr == 0.1);
  CHECK(*g0.momentum == 0.9);
  CHECK(*g0.weight_decay == 0.0);
  CHECK(g1.lr == 0.01);
  CHECK(*g1.momentum == 0.9);
  CHECK(*g1.weight_decay == 0.1);
  CHECK_FALSE(g0.beta1.has_value());  // fields SGD does not use stay unset

  std::vector<Tensor> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::vector<SgdRef> refs;
  for (size_t k = 0; k < a.size(); ++k) refs.push_back({o, {}});
  for (size_t k = 0; k < b.size(); ++k) refs.push_back({{.lr = 0.01, .momentum = 0.9, .weight_decay = 0.1}, {}});
  run_against_reference(opt, all, refs, 4, kFloat64, 1e-12, 1e-14, 9);

  // Adam groups: a decay group and a no-decay group (the usual transformer split).
  std::vector<Tensor> c = make_params(kFloat64, 60), d = make_params(kFloat64, 70);
  const AdamWOptions wo{.lr = 0.01, .weight_decay = 0.1};
  AdamW adamw({{.params = c}, {.params = d, .weight_decay = 0.0, .beta2 = 0.95}}, wo);
  std::vector<Tensor> cd = c;
  cd.insert(cd.end(), d.begin(), d.end());
  std::vector<AdamRef> arefs;
  for (size_t k = 0; k < c.size(); ++k) arefs.push_back({adam_of(wo), true, {}, {}, {}, 0});
  AdamOptions nd = adam_of(wo);
  nd.weight_decay = 0.0;
  nd.beta2 = 0.95;
  for (size_t k = 0; k < d.size(); ++k) arefs.push_back({nd, true, {}, {}, {}, 0});
  run_against_reference(adamw, cd, arefs, 4, kFloat64, 1e-10, 1e-13, 19);

  // add_param_group after construction
  Tensor extra = make_param(random_values(4, 80), {4});
  adamw.add_param_group({.params = {extra}, .lr = 0.5});
  CHECK(adamw.param_groups().size() == 3);
  CHECK(*adamw.param_groups()[2].weight_decay == 0.1);
  CHECK(adamw.param_groups()[2].lr == 0.5);
}

TEST_CASE("optim: parameters without a gradient are skipped and keep their own step count") {
  std::vector<Tensor> ps = make_params(kFloat64, 90);
  const AdamOptions o{.lr = 0.01};
  Adam opt(ps, o);
  std::vector<AdamRef> refs(3, AdamRef{o, false, {}, {}, {}, 0});
  std::vector<Values> ref_p;
  for (const Tensor& p : ps) ref_p.push_back(values_of(p));
  const uint64_t v0 = ps[1].version();
  // steps 1-2: only params 0 and 2 have gradients; step 3: all three.
  for (int s = 0; s < 3; ++s) {
    for (size_t k = 0; k < 3; ++k) {
      if (k == 1 && s < 2) continue;
      const Tensor g = make_tensor(random_values(ps[k].numel(), 200 + 10 * s + k), ps[k].sizes(), kFloat64);
      ps[k].set_grad(g);
      refs[k].step(ref_p[k], values_of(g));
    }
    opt.step();
    if (s < 2) {
      CHECK(opt.state(ps[1]) == nullptr);
      CHECK(ps[1].version() == v0);
    }
    if (s == 0) opt.zero_grad();
  }
  for (size_t k = 0; k < 3; ++k) check_close(ps[k], ref_p[k], 1e-10, 1e-13, "param " + std::to_string(k));
  CHECK(opt.state(ps[0])->step == 3);
  CHECK(opt.state(ps[1])->step == 1);
  CHECK(ps[1].version() > v0);  // updated in place
}

TEST_CASE("optim: strided parameters and gradients are updated in place") {
  const Values pv = random_values(12, 300), gv = random_values(12, 301);
  Tensor p = make_param(pv, {3, 4}, kFloat64, Layout::Transposed);  // a leaf view with column-major storage
  REQUIRE_FALSE(p.is_contiguous());
  Tensor storage_view = p.detach();
  const Tensor g = make_tensor(gv, {3, 4}, kFloat64, Layout::Strided);
  REQUIRE_FALSE(g.is_contiguous());
  p.set_grad(g);
  const SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  SGD opt({p}, o);
  SgdRef ref{o, {}};
  Values rp = pv;
  const uint64_t v0 = p.version();
  for (int s = 0; s < 3; ++s) {
    opt.step();
    ref.step(rp, gv);
  }
  check_close(p, rp, 1e-12, 1e-14, "strided param");
  check_close(storage_view, rp, 1e-12, 1e-14, "the same storage seen through another handle");
  CHECK(p.version() > v0);
  CHECK_FALSE(p.is_contiguous());  // still the same view
}

TEST_CASE("optim: zero_grad drops or zeroes gradients") {
  std::vector<Tensor> ps = make_params(kFloat32, 400);
  SGD opt(ps, {.lr = 0.1});
  for (const Tensor& p : ps) p.set_grad(make_tensor(random_values(p.numel(), 401), p.sizes(), kFloat32));
  const Tensor g0 = ps[0].grad();
  opt.zero_grad(false);
  CHECK(ps[0].grad().shares_storage(g0));
  for (const Tensor& p : ps) check_close(p.grad(), Values(size_t(p.numel()), 0.0), 0, 0, "zeroed grad");
  opt.zero_grad();
  for (const Tensor& p : ps) CHECK_FALSE(p.grad().defined());
  opt.zero_grad();  // no gradients: nothing to do
  const Values before = values_of(ps[0]);
  opt.step();  // every parameter skipped
  check_close(ps[0], before, 0, 0, "unchanged");
}

TEST_CASE("optim: bad parameters, options and gradients throw") {
  Tensor p = make_param({1, 2, 3}, {3});
  check_error([&] { SGD(std::vector<Tensor>{}, {.lr = 0.1}); }, {"SGD", "group 0", "no parameters"});
  check_error([&] { SGD(std::vector<ParamGroup>{}, {.lr = 0.1}); }, {"SGD", "empty parameter list"});
  check_error([&] { Adam(std::vector<ParamGroup>{{.params = {}}}); }, {"Adam", "group 0", "no parameters"});
  check_error([&] { SGD({p, p}, {.lr = 0.1}); }, {"SGD", "more than one"});
  check_error([&] { SGD({{.params = {p}}, {.params = {p}}}, {.lr = 0.1}); }, {"more than one"});
  check_error([&] { SGD({from_vector<int64_t>({1, 2})}, {.lr = 0.1}); }, {"SGD", "floating", "int64"});
  Tensor nonleaf = matmul(p, p);  // a differentiable op's output
  REQUIRE_FALSE(nonleaf.is_leaf());
  check_error([&] { SGD({nonleaf}, {.lr = 0.1}); }, {"SGD", "non-leaf", "made by"});
  check_error([&] { SGD({p}, {.lr = -0.1}); }, {"SGD", "learning rate", "-0.1"});
  check_error([&] { SGD({p}, {.lr = 0.1, .momentum = -1}); }, {"momentum"});
  check_error([&] { SGD({p}, {.lr = 0.1, .nesterov = true}); }, {"Nesterov", "momentum"});
  check_error([&] { SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); }, {"Nesterov"});
  check_error([&] { Adam({p}, {.beta1 = 1.0}); }, {"Adam", "beta1", "[0, 1)"});
  check_error([&] { AdamW({p}, {.beta2 = -0.5}); }, {"AdamW", "beta2"});
  check_error([&] { Adam({p}, {.eps = -1}); }, {"Adam", "eps"});
  check_error([&] { Adam({p}, {.weight_decay = -1}); }, {"Adam", "weight_decay"});
  check_error([&] { Adam(std::vector<ParamGroup>{{.params = {p}, .momentum = 0.9}}); },
              {"Adam", "group 0", "momentum", "does not use"});
  check_error([&] { SGD(std::vector<ParamGroup>{{.params = {p}, .amsgrad = true}}, {.lr = 0.1}); },
              {"SGD", "amsgrad", "does not use"});

  SGD opt({p}, {.lr = 0.1});
  p.set_grad(make_tensor({1, 2, 3}, {3}, kFloat32));  // set_grad checks shape and device, not dtype
  check_error([&] { opt.step(); }, {"SGD.step", "parameter 0", "float64[3]", "float32[3]"});

  // a bad gradient anywhere leaves every parameter and all state untouched
  Tensor q = make_param({4, 5}, {2}), r = make_param({6, 7, 8}, {3});
  Adam adam({q, r});
  q.set_grad(make_tensor({1, 1}, {2}, kFloat64));
  r.set_grad(make_tensor({1, 1, 1}, {3}, kFloat32));
  check_error([&] { adam.step(); }, {"Adam.step", "parameter 1"});
  CHECK(adam.state(q) == nullptr);
  check_close(q, {4, 5}, 0, 0, "untouched");
}

// ---- state dict -----------------------------------------------------------------------------

TEST_CASE("optim: state_dict holds PyTorch-style flat keys") {
  std::vector<Tensor> ps = make_params(kFloat32, 500);
  Adam opt({{.params = {ps[0], ps[1]}}, {.params = {ps[2]}, .lr = 0.5}}, {.lr = 0.01, .amsgrad = true});
  ps[0].set_grad(make_tensor(random_values(12, 1), {3, 4}, kFloat32));
  ps[2].set_grad(make_tensor(random_values(12, 2), {2, 3, 2}, kFloat32));
  opt.step();
  opt.step();
  const StateDict sd = opt.state_dict();
  std::map<std::string, Tensor> m(sd.begin(), sd.end());
  CHECK(m.size() == sd.size());
  for (const char* k :
       {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.2.step",
        "param_groups.0.lr", "param_groups.0.beta1", "param_groups.0.beta2", "param_groups.0.eps",
        "param_groups.0.weight_decay", "param_groups.0.amsgrad", "param_groups.0.maximize", "param_groups.0.params",
        "param_groups.1.lr", "param_groups.1.params"})
    CHECK_MESSAGE(m.count(k) == 1, k);
  CHECK(m.count("state.1.step") == 0);  // never stepped: no state
  CHECK(m["state.0.step"].dtype() == kInt64);
  CHECK(m["state.0.step"].dim() == 0);
  CHECK(m["state.0.step"].item<int64_t>() == 2);
  CHECK(m["state.0.exp_avg"].dtype() == kFloat32);
  CHECK(m["state.0.exp_avg"].sizes() == Shape{3, 4});
  CHECK(m["param_groups.1.lr"].dtype() == kFloat64);
  CHECK(m["param_groups.1.lr"].dim() == 0);
  CHECK(m["param_groups.1.lr"].item<double>() == 0.5);
  CHECK(m["param_groups.0.amsgrad"].item<double>() == 1.0);
  CHECK(m["param_groups.0.params"].tolist<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK(m["param_groups.1.params"].tolist<int64_t>() == std::vector<int64_t>{2});
  // the buffers are the live state
  CHECK(m["state.0.exp_avg"].shares_storage(opt.state(ps[0])->buffers[0]));

  SGD sgd(ps, {.lr = 0.1, .momentum = 0.9});
  ps[1].set_grad(make_tensor(random_values(5, 3), {5}, kFloat32));
  sgd.step();
  const StateDict ssd = sgd.state_dict();
  std::map<std::string, Tensor> sm(ssd.begin(), ssd.end());
  CHECK(sm.count("state.1.momentum_buffer") == 1);
  CHECK(sm.count("state.1.step") == 0);  // SGD counts no steps
  for (const char* k : {"param_groups.0.momentum", "param_groups.0.dampening", "param_groups.0.weight_decay",
                        "param_groups.0.nesterov", "param_groups.0.maximize"})
    CHECK_MESSAGE(sm.count(k) == 1, k);
}

namespace {

/// Trains `a` for 3 steps, saves its state (through a safetensors file), trains 3 more;
/// a fresh optimizer `b` on copies of the step-3 parameters loads the state and runs the
/// same 3 steps: the parameters and state must be bit-identical.
template <typename Make>
void check_resume(Make make, const std::string& what) {
  CAPTURE(what);
  std::vector<Tensor> pa = make_params(kFloat32, 600);
  std::unique_ptr<Optimizer> a = make(pa);
  auto grads_at = [&](int s) {
    std::vector<Tensor> gs;
    for (size_t k = 0; k < pa.size(); ++k) {
      // parameter 1 has no gradient at step 1, so the step counts differ
      gs.push_back(s == 0 && k == 1
                       ? Tensor()
                       : make_tensor(random_values(pa[k].numel(), 700 + 10 * s + k), pa[k].sizes(), kFloat32));
    }
    return gs;
  };
  auto train = [&](Optimizer& opt, std::vector<Tensor>& ps, int from, int to) {
    for (int s = from; s < to; ++s) {
      const std::vector<Tensor> gs = grads_at(s);
      for (size_t k = 0; k < ps.size(); ++k) ps[k].set_grad(gs[k]);
      opt.step();
    }
  };
  train(*a, pa, 0, 3);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("frugal_optim_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  nn::save_safetensors(path, a->state_dict());
  std::vector<Tensor> pb;
  for (const Tensor& p : pa) pb.push_back(make_param(values_of(p), p.sizes(), kFloat32));
  train(*a, pa, 3, 6);

  std::unique_ptr<Optimizer> b = make(pb);
  for (ParamGroup& g : b->param_groups()) g.lr = 123.0;  // load_state_dict restores the hyperparameters
  const nn::SafetensorsFile file = nn::load_safetensors(path);
  std::filesystem::remove(path);
  b->load_state_dict(StateDict(file.tensors.begin(), file.tensors.end()));
  CHECK(b->param_groups()[0].lr != 123.0);
  train(*b, pb, 3, 6);
  for (size_t k = 0; k < pa.size(); ++k) {
    CHECK_MESSAGE(values_of(pa[k]) == values_of(pb[k]), "parameter ", k, " differs after resuming");
  }
  const StateDict sa = a->state_dict(), sb = b->state_dict();
  REQUIRE(sa.size() == sb.size());
  std::map<std::string, Tensor> mb(sb.begin(), sb.end());
  for (const auto& [k, t] : sa) {
    REQUIRE_MESSAGE(mb.count(k) == 1, k);
    CHECK_MESSAGE(values_of(t) == values_of(mb[k]), k, " differs after resuming");
  }
}

}  // namespace

TEST_CASE("optim: a state dict round trip resumes bit-identically") {
  check_resume(
      [](std::vector<Tensor>& ps) {
        return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
      },
      "SGD nesterov");
  check_resume(
      [](std::vector<Tensor>& ps) {
        return std::make_unique<Adam>(
            std::vector<ParamGroup>{{.params = {ps[0], ps[1]}}, {.params = {ps[2]}, .lr = 0.003}},
            AdamOptions{.lr = 0.01, .weight_decay = 0.01, .amsgrad = true});
      },
      "Adam amsgrad, two groups");
  check_resume([](std::vector<Tensor>& ps) { return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01}); }, "AdamW");
}

TEST_CASE("optim: load_state_dict rejects mismatched dicts and changes nothing") {
  std::vector<Tensor> ps = make_params(kFloat32, 800);
  Adam opt({{.params = {ps[0], ps[1]}}, {.params = {ps[2]}}}, {.lr = 0.01});
  for (const Tensor& p : ps) p.set_grad(make_tensor(random_values(p.numel(), 801), p.sizes(), kFloat32));
  opt.step();
  const StateDict good = cloned(opt.state_dict());
  opt.load_state_dict(good);  // loads fine

  // group count
  std::vector<Tensor> qs = make_params(kFloat32, 900);
  Adam one_group(qs, {.lr = 0.01});
  check_error([&] { one_group.load_state_dict(good); }, {"Adam.load_state_dict", "2 param groups", "has 1"});
  // parameter count per group
  Adam split({{.params = {qs[0]}}, {.params = {qs[1], qs[2]}}}, {.lr = 0.01});
  check_error([&] { split.load_state_dict(good); },
              {"param group 0", "2 parameters in the state dict", "1 in the optimizer"});
  // shapes
  check_error(
      [&] {
        opt.load_state_dict(replaced(good, "state.1.exp_avg", zeros({4, 3})));
      },
      {"state.1.exp_avg", "float32[4, 3]", "parameter 1", "float32[5]"});
  // unknown keys, missing keys, bad values
  StateDict extra = good;
  extra.emplace_back("state.0.momentum_buffer", zeros({3, 4}));
  check_error([&] { opt.load_state_dict(extra); }, {"unexpected key 'state.0.momentum_buffer'"});
  StateDict stranger = good;
  stranger.emplace_back("model.weight", zeros({3}));
  check_error([&] { opt.load_state_dict(stranger); }, {"unexpected key 'model.weight'"});
  StateDict twice = good;
  twice.emplace_back("param_groups.0.lr", scalar_tensor(0.1, kFloat64));
  check_error([&] { opt.load_state_dict(twice); }, {"'param_groups.0.lr' appears twice"});
  check_error([&] { opt.load_state_dict(without(good, "param_groups.1.beta2")); },
              {"missing key 'param_groups.1.beta2'"});
  check_error([&] { opt.load_state_dict(without(good, "state.2.step")); }, {"state.2.step is missing"});
  check_error([&] { opt.load_state_dict(without(good, "state.2.exp_avg_sq")); }, {"exp_avg", "together"});
  check_error([&] { opt.load_state_dict(replaced(good, "state.0.step", scalar_tensor(-1, kInt64))); },
              {"state.0.step", "non-negative integer"});
  check_error([&] { opt.load_state_dict(replaced(good, "param_groups.0.beta1", scalar_tensor(2.0, kFloat64))); },
              {"param group 0", "beta1"});
  check_error([&] { opt.load_state_dict(replaced(good, "param_groups.0.lr", zeros({2}, kFloat64))); },
              {"param_groups.0.lr", "one-element"});
  StateDict beyond = good;
  beyond.emplace_back("state.7.step", scalar_tensor(1, kInt64));
  check_error([&] { opt.load_state_dict(beyond); }, {"state.7", "parameter 7", "3 parameters"});

  // nothing changed by the failed loads: one more step equals a fresh load's step
  const Values before = values_of(opt.state(ps[1])->buffers[0]);
  CHECK(opt.state(ps[1])->step == 1);
  CHECK(values_of(good[0].second) == values_of(find(opt.state_dict(), good[0].first)));
  check_close(opt.state(ps[1])->buffers[0], before, 0, 0, "exp_avg");
}

// ---- LR schedulers ------------------------------------------------------------------------------

namespace {
std::vector<Tensor> one_param() { return {make_param({1, 2}, {2})}; }
}  // namespace

TEST_CASE("optim: StepLR, LinearLR and CosineAnnealingLR follow PyTorch's closed forms") {
  {
    std::vector<Tensor> ps = one_param();
    SGD opt(ps, {.lr = 0.1});
    StepLR sched(opt, {.step_size = 3, .gamma = 0.5});
    for (int t = 0; t < 10; ++t) {
      const double expected = 0.1 * std::pow(0.5, t / 3);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(expected).epsilon(1e-15));
      CHECK(sched.last_lr()[0] == opt.param_groups()[0].lr);
      CHECK(sched.last_epoch() == t);
      sched.step();
    }
  }
  {
    std::vector<Tensor> ps = one_param();
    SGD opt(ps, {.lr = 0.2});
    LinearLR sched(opt, {.start_factor = 0.25, .total_iters = 4});
    // torch.optim.lr_scheduler.LinearLR(start_factor=0.25, total_iters=4) on lr 0.2
    const double expected[] = {0.05, 0.0875, 0.125, 0.1625, 0.2, 0.2, 0.2};
    for (double e : expected) {
      CHECK(opt.param_groups()[0].lr == doctest::Approx(e).epsilon(1e-14));
      sched.step();
    }
  }
  {
    std::vector<Tensor> ps = one_param();
    SGD opt(ps, {.lr = 0.1});
    const int64_t T = 10;
    const double eta_min = 1e-3;
    CosineAnnealingLR sched(opt, {.T_max = T, .eta_min = eta_min});
    // PyTorch's recursive (chainable) form, step by step from lr = base
    double recursive = 0.1;
    for (int64_t t = 0; t <= 3 * T; ++t) {
      const double closed = eta_min + (0.1 - eta_min) * (1 + std::cos(std::numbers::pi * double(t) / double(T))) / 2;
      if (t > 0) {
        if ((t - 1 - T) % (2 * T) == 0) recursive += (0.1 - eta_min) * (1 - std::cos(std::numbers::pi / double(T))) / 2;
        else
          recursive = (1 + std::cos(std::numbers::pi * double(t) / double(T))) /
                          (1 + std::cos(std::numbers::pi * double(t - 1) / double(T))) * (recursive - eta_min) +
                      eta_min;
      }
      CAPTURE(t);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(closed).epsilon(1e-14));
      CHECK(opt.param_groups()[0].lr == doctest::Approx(recursive).epsilon(1e-9));
      sched.step();
    }
  }
  {  // documented values: lr 0.1, T_max 10 -> 0.05 at t = 5, eta_min at t = 10
    std::vector<Tensor> ps = one_param();
    SGD opt(ps, {.lr = 0.1});
    CosineAnnealingLR sched(opt, {.T_max = 10});
    for (int i = 0; i < 5; ++i) sched.step();
    CHECK(opt.param_groups()[0].lr == doctest::Approx(0.05).epsilon(1e-14));
    for (int i = 0; i < 5; ++i) sched.step();
    CHECK(opt.param_groups()[0].lr == doctest::Approx(0.0).scale(1.0).epsilon(1e-15));
  }
}

TEST_CASE("optim: warmup + cosine as SequentialLR and WarmupCosineLR, per group") {
  const int64_t W = 5, total = 25;
  auto expected = [&](double base, int64_t t) {
    if (t < W) return base * (0.01 + (1 - 0.01) * double(t) / double(W));
    return 1e-4 + (base - 1e-4) * (1 + std::cos(std::numbers::pi * double(t - W) / double(total - W))) / 2;
  };
  std::vector<Tensor> a = one_param(), b = one_param();
  AdamW opt({{.params = a}, {.params = b, .lr = 0.5}}, {.lr = 0.1});
  auto warm = std::make_shared<LinearLR>(opt, LinearLROptions{.start_factor = 0.01, .total_iters = W});
  auto cosine = std::make_shared<CosineAnnealingLR>(opt, CosineAnnealingLROptions{.T_max = total - W, .eta_min = 1e-4});
  SequentialLR seq(opt, {warm, cosine}, {W});
  CHECK(*opt.param_groups()[0].initial_lr == 0.1);  // the sub-schedulers did not move the base
  CHECK(*opt.param_groups()[1].initial_lr == 0.5);
  for (int64_t t = 0; t <= total + 3; ++t) {
    CAPTURE(t);
    CHECK(opt.param_groups()[0].lr == doctest::Approx(expected(0.1, t)).epsilon(1e-14));
    CHECK(opt.param_groups()[1].lr == doctest::Approx(expected(0.5, t)).epsilon(1e-14));
    REQUIRE(seq.last_lr().size() == 2);
    CHECK(seq.last_lr()[1] == opt.param_groups()[1].lr);
    seq.step();
  }

  std::vector<Tensor> c = one_param(), d = one_param();
  AdamW opt2({{.params = c}, {.params = d, .lr = 0.5}}, {.lr = 0.1});
  WarmupCosineLR wc(opt2, {.warmup_steps = W, .total_steps = total, .start_factor = 0.01, .eta_min = 1e-4});
  for (int64_t t = 0; t <= total + 3; ++t) {
    CAPTURE(t);
    CHECK(opt2.param_groups()[0].lr == doctest::Approx(expected(0.1, t)).epsilon(1e-14));
    CHECK(opt2.param_groups()[1].lr == doctest::Approx(expected(0.5, t)).epsilon(1e-14));
    wc.step();
  }

  // resume: a scheduler's state dict restores its epoch
  const StateDict sd = wc.state_dict();
  std::vector<Tensor> e = one_param(), f = one_param();
  AdamW opt3({{.params = e}, {.params = f, .lr = 0.5}}, {.lr = 0.1});
  WarmupCosineLR wc3(opt3, {.warmup_steps = W, .total_steps = total, .start_factor = 0.01, .eta_min = 1e-4});
  wc3.load_state_dict(sd);
  CHECK(wc3.last_epoch() == wc.last_epoch());
  CHECK(opt3.param_groups()[1].lr == opt2.param_groups()[1].lr);

  // errors
  check_error([&] { WarmupCosineLR(opt2, {.warmup_steps = 10, .total_steps = 10}); },
              {"WarmupCosineLR", "warmup_steps"});
  check_error([&] { SequentialLR(opt, {warm, cosine}, {}); }, {"SequentialLR", "1 milestones"});
  check_error([&] { SequentialLR(opt2, {warm}, {}); }, {"SequentialLR", "same optimizer"});
  check_error([&] { StepLR(opt, {.step_size = 0}); }, {"StepLR", "step_size"});
  check_error([&] { CosineAnnealingLR(opt, {.T_max = 0}); }, {"CosineAnnealingLR", "T_max"});
  check_error([&] { LinearLR(opt, {.start_factor = 0}); }, {"LinearLR", "start_factor"});
}

TEST_CASE("optim: an LR scheduler drives the optimizer's steps") {
  Tensor p = make_param({1.0}, {1});
  SGD opt({p}, {.lr = 1.0});
  StepLR sched(opt, {.step_size = 1, .gamma = 0.5});
  double expected = 1.0;
  for (int s = 0; s < 4; ++s) {
    p.set_grad(make_tensor({1.0}, {1}, kFloat64));
    opt.step();
    expected -= std::pow(0.5, s);  // lr at epoch s times grad 1
    sched.step();
  }
  check_close(p, {expected}, 1e-15, 0, "param");
}

// ---- gradient clipping ------------------------------------------------------------------------

TEST_CASE("optim: clip_grad_norm_ computes the total norm and scales as PyTorch") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(p);
      std::vector<Tensor> ps = make_params(dt, 1000);
      Tensor no_grad = make_param({100, 200}, {2}, dt);  // huge values, but no gradient: ignored
      std::vector<Values> gv;
      for (size_t k = 0; k < ps.size(); ++k) {
        const Tensor g = make_tensor(random_values(ps[k].numel(), 1001 + k), ps[k].sizes(), dt,
                                     k == 0 ? Layout::Transposed : Layout::Contiguous);
        ps[k].set_grad(g);
        gv.push_back(values_of(g));
      }
      // total norm by hand
      double acc = 0;
      for (const Values& v : gv)
        for (double x : v) acc = std::isinf(p) ? std::max(acc, std::fabs(x)) : acc + std::pow(std::fabs(x), p);
      const double total = std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
      std::vector<Tensor> all = ps;
      all.push_back(no_grad);

      // max_norm above the total: nothing changes (bit for bit)
      const double got = clip_grad_norm_(all, total * 2, p);
      CHECK(got == doctest::Approx(total).epsilon(1e-12));
      for (size_t k = 0; k < ps.size(); ++k) check_close(ps[k].grad(), gv[k], 0, 0, "unclipped grad");

      // max_norm below: grads *= max_norm / (total + 1e-6)
      const double max_norm = total / 4;
      const uint64_t v0 = ps[1].grad().version();
      const double got2 = clip_grad_norm_(all, max_norm, p);
      CHECK(got2 == doctest::Approx(total).epsilon(1e-12));
      const double coef = max_norm / (total + 1e-6);
      for (size_t k = 0; k < ps.size(); ++k) {
        Values e = gv[k];
        for (double& x : e) x *= coef;
        check_close(ps[k].grad(), e, default_rtol(dt), 0, "clipped grad " + std::to_string(k));
      }
      CHECK(ps[1].grad().version() > v0);
      // the clipped norm is max_norm (up to the 1e-6)
      CHECK(clip_grad_norm_(all, 1e9, p) == doctest::Approx(max_norm).epsilon(1e-5));
      CHECK_FALSE(no_grad.grad().defined());
    }
  }
}

TEST_CASE("optim: clip_grad_norm_async returns the norm as a 0-d tensor; edge cases") {
  std::vector<Tensor> ps = make_params(kFloat32, 1100);
  for (const Tensor& p : ps) p.set_grad(make_tensor(Values(size_t(p.numel()), 0.5), p.sizes(), kFloat32));
  // 29 elements of 0.5: norm 0.5 * sqrt(29)
  const Tensor n = clip_grad_norm_async(ps, 1.0);
  CHECK(n.dim() == 0);
  CHECK(n.dtype() == kFloat32);
  CHECK(double(n.item<float>()) == doctest::Approx(0.5 * std::sqrt(29.0)).epsilon(1e-6));
  check_close(ps[0].grad(), Values(12, 0.5 / (0.5 * std::sqrt(29.0) + 1e-6)), 1e-6, 0, "scaled");

  // no gradients: norm 0, nothing to do
  std::vector<Tensor> none = make_params(kFloat32, 1200);
  CHECK(clip_grad_norm_(none, 1.0) == 0.0);
  CHECK(clip_grad_norm_async(none, 1.0).item<float>() == 0.0f);
  CHECK(clip_grad_norm_({}, 1.0) == 0.0);

  // a NaN gradient makes the norm and every gradient NaN, as in PyTorch
  std::vector<Tensor> bad = make_params(kFloat32, 1300);
  for (const Tensor& p : bad) p.set_grad(make_tensor(random_values(p.numel(), 7), p.sizes(), kFloat32));
  bad[1].set_grad(make_tensor({1, std::nan(""), 2, 3, 4}, {5}, kFloat32));
  CHECK(std::isnan(clip_grad_norm_(bad, 1.0)));
  for (double v : values_of(bad[2].grad())) CHECK(std::isnan(v));

  check_error([&] { clip_grad_norm_(ps, 1.0, 0.0); }, {"clip_grad_norm_", "norm_type", "positive"});
  check_error([&] { clip_grad_norm_(ps, 1.0, -std::numeric_limits<double>::infinity()); }, {"clip_grad_norm_", "-inf"});
}

TEST_CASE("optim: channels-last parameters are stepped where they lie, their state in the same memory order") {
  // Note [Optimizer memory order]: the same values as contiguous twins, bit for bit; no
  // copy of the parameter (its storage is updated); state buffers with the parameter's
  // strides; gradients in either order; a state dict saved from the contiguous twin loads
  // into the channels-last parameter's order and resumes equally.
  const Shape shape{4, 3, 2, 5};
  const Values pv = random_values(120, 310);
  auto make_opt = [](const std::string& kind, const Tensor& p) -> std::unique_ptr<Optimizer> {
    if (kind == "sgd")
      return std::make_unique<SGD>(std::vector<Tensor>{p},
                                   SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
    if (kind == "adam") return std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions{.lr = 0.01, .amsgrad = true});
    return std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 0.01});
  };
  auto channels_last_leaf = [](const Tensor& t) {
    Tensor out = empty_channels_last(t.sizes(), t.options());
    out.copy_(t);
    return out.requires_grad_();
  };
  for (const std::string kind : {"sgd", "adam", "adamw"}) {
    CAPTURE(kind);
    for (const bool grad_channels_last : {true, false}) {
      CAPTURE(grad_channels_last);
      const Tensor flat = make_param(pv, shape, kFloat32);
      const Tensor cl = channels_last_leaf(make_tensor(pv, shape, kFloat32));
      REQUIRE(suggests_channels_last(cl));
      const void* storage = cl.data();
      std::unique_ptr<Optimizer> flat_opt = make_opt(kind, flat), cl_opt = make_opt(kind, cl);
      for (int s = 0; s < 3; ++s) {
        const Tensor g = make_tensor(random_values(120, 320 + s), shape, kFloat32);
        flat.set_grad(g);
        cl.set_grad(grad_channels_last ? channels_last_leaf(g).detach() : g.clone());
        flat_opt->step();
        cl_opt->step();
        check_close(cl, values_of(flat), 0, 0, "step " + std::to_string(s));
      }
      CHECK(cl.data() == storage);
      CHECK(suggests_channels_last(cl));
      for (const Tensor& b : cl_opt->state(cl)->buffers)
        if (b.defined()) CHECK(b.strides() == cl.strides());
      // The contiguous twin's state, loaded into a channels-last parameter's optimizer, resumes equally.
      const Tensor cl2 = channels_last_leaf(flat.detach());
      std::unique_ptr<Optimizer> resumed = make_opt(kind, cl2);
      resumed->load_state_dict(flat_opt->state_dict());
      for (const Tensor& b : resumed->state(cl2)->buffers)
        if (b.defined()) CHECK(b.strides() == cl2.strides());
      const Tensor g = make_tensor(random_values(120, 330), shape, kFloat32);
      flat.set_grad(g);
      cl2.set_grad(g.clone());
      flat_opt->step();
      resumed->step();
      check_close(cl2, values_of(flat), 0, 0, "resumed step");
    }
  }
}

TEST_CASE("AdamW float32 on the CPU: the vectorised loop gives adam_update's bits, element by element") {
  // optim/cpu_kernels.cpp runs float32 AdamW (no amsgrad) through OffloadAdamW's vectorised loop;
  // here the scalar rule of optim/update_math.h, in float, is the reference, for 1, odd and
  // threaded sizes, with and without decay and maximize, over several steps.
  for (const bool maximize : {false, true}) {
    for (const double wd : {0.0, 0.05}) {
      CAPTURE(maximize);
      CAPTURE(wd);
      const std::vector<Shape> shapes = {{1}, {37, 53}, {300001}};
      std::vector<Tensor> params;
      std::vector<std::vector<float>> p, m, v;
      for (size_t k = 0; k < shapes.size(); ++k) {
        const Values init = random_values(numel_of(shapes[k]), 70 + k);
        params.push_back(param_tensor(init, shapes[k]));
        p.emplace_back(init.begin(), init.end());
        m.emplace_back(init.size(), 0.0f);
        v.emplace_back(init.size(), 0.0f);
      }
      AdamW opt(params,
                {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = wd, .maximize = maximize});
      for (int s = 1; s <= 3; ++s) {
        for (size_t k = 0; k < shapes.size(); ++k) {
          const Values g = random_values(numel_of(shapes[k]), 500 + 7 * uint64_t(s) + k, -3.0, 3.0);
          params[k].set_grad(make_tensor(g, shapes[k], kFloat32));
          optim::detail::AdamEntry e{};
          e.lr = 1e-2, e.beta1 = 0.8, e.beta2 = 0.95, e.eps = 1e-6, e.weight_decay = wd;
          e.flags = optim::detail::kAdamDecoupled | (maximize ? uint32_t(optim::detail::kAdamMaximize) : 0u);
          optim::detail::set_bias_corrections(e, s);
          const optim::detail::AdamCoeffs<float> c(e);
          for (size_t i = 0; i < g.size(); ++i) {
            float unused = 0.0f;
            optim::detail::adam_update<float>(p[k][i], float(g[i]), m[k][i], v[k][i], unused, c);
          }
        }
        opt.step();
        for (size_t k = 0; k < shapes.size(); ++k) {
          CAPTURE(k);
          const std::vector<float> got = params[k].contiguous().tolist<float>();
          CHECK(got == p[k]);
          CHECK(opt.state(params[k])->buffers[0].contiguous().tolist<float>() == m[k]);
          CHECK(opt.state(params[k])->buffers[1].contiguous().tolist<float>() == v[k]);
        }
      }
    }
  }
}
